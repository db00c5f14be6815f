"""The array re-blocking path equals tuner.trace's reference, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_traces import make_requests
from test_shared_prompts import assert_ids_name_the_hashes

from tuner.errors import ConfigError
from tuner.replay._kv_requests import (kv_request_ids, kv_requests, load_trace_arrays,
                                      reblock_arrays)
from tuner.trace.reblock import reblock_request_hashes

u64 = st.integers(0, (1 << 64) - 1)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([(16, 16), (64, 16), (512, 16), (32, 16), (64, 32), (16, 64), (16, 32)]),
       st.integers(1, 3000), st.integers(1, 700), st.lists(u64, max_size=200),
       st.lists(u64, max_size=80), st.booleans())
def test_equals_reference(sizes, input_len, output_len, prompt, output, use_output):
    f, t = sizes
    output = output if use_output else []
    try:
        want = reblock_request_hashes(prompt, output, input_len, output_len, f, t)
    except ConfigError as exc:
        with pytest.raises(ConfigError, match=str(exc)[:40]):
            reblock_arrays(prompt, output, input_len, output_len, f, t)
        return
    got = reblock_arrays(prompt, output, input_len, output_len, f, t)
    assert [int(v) for v in got[0]] == list(want[0])
    assert [int(v) for v in got[1]] == list(want[1])
    assert got[0].dtype == np.uint64 and got[1].dtype == np.uint64


def test_load_trace_arrays_matches_trace_requests(tmp_path):
    from tuner.trace import read_trace
    from tuner.trace.schema import TraceMetadata
    from tuner.trace.store import write_trace

    reqs = make_requests(25, hbs=64)
    trace = read_trace(write_trace(tmp_path / "t.parquet", reqs, TraceMetadata(
        hash_block_size=64, source_format="synth:test")))
    plain = trace.requests()
    arrays = load_trace_arrays(trace)
    for a, b in zip(plain, arrays):
        assert a.request_id == b.request_id and a.input_len == b.input_len
        assert a.block_hashes == tuple(int(v) for v in b.block_hashes)
        assert a.output_block_hashes == tuple(int(v) for v in b.output_block_hashes)
    kv = kv_requests(arrays, 64, 16)
    for a, b in zip(plain, kv):
        want = reblock_request_hashes(a.block_hashes, a.output_block_hashes, a.input_len,
                                      a.output_len, 64, 16)
        assert tuple(int(v) for v in b.block_hashes) == want[0]
        assert tuple(int(v) for v in b.output_block_hashes) == want[1]


@pytest.mark.parametrize("sizes", [(64, 16), (16, 16), (512, 16), (16, 64)])
def test_hash_ids_name_exactly_the_equal_hashes(sizes):
    """kv_request_ids renames hashes to dense ids: equal KV hash <=> equal id, over the
    whole trace (the twin's prefix cache only compares hashes)."""
    f, t = sizes
    reqs = make_requests(40, hbs=f)
    raw = kv_requests(reqs, f, t)
    interned = kv_request_ids(reqs, f, t)
    assert len(interned) == len(raw)
    pairs: dict[int, int] = {}
    back: dict[int, int] = {}
    seen = 0
    for a, b in zip(raw, interned):
        for hashes, ids in ((a.block_hashes, b.block_hashes),
                            (a.output_block_hashes, b.output_block_hashes)):
            assert len(hashes) == len(ids) and np.asarray(ids).dtype == np.int64
            for h, i in zip(np.asarray(hashes).tolist(), np.asarray(ids).tolist()):
                assert pairs.setdefault(h, i) == i  # one id per hash
                assert back.setdefault(i, h) == h  # one hash per id
                assert 0 <= i < interned.num_hash_ids
                seen += 1
    assert seen > len(pairs) > 0  # some hashes recur: shared prefixes were checked


@pytest.mark.parametrize("size", [1, 2, 20_000])
def test_dense_ids_are_the_same_with_polars_and_in_a_forked_child(monkeypatch, size):
    """Forked tuning workers and arrays below NUMPY_RANK_MAX rank with numpy (polars hangs
    after fork; below the threshold numpy is as fast and a replay need not import
    polars), larger arrays with polars: the same ids."""
    import tuner
    from tuner.replay import _kv_requests

    rng = np.random.default_rng(7)
    values = rng.integers(0, 1 << 64, size=5_000, dtype=np.uint64)[rng.integers(0, 5_000, size)]
    with_numpy_below, n_below = _kv_requests.dense_hash_ids(values)
    monkeypatch.setattr(_kv_requests, "NUMPY_RANK_MAX", 0)
    with_polars, n_polars = _kv_requests.dense_hash_ids(values)
    monkeypatch.setattr(tuner, "IN_FORKED_CHILD", True)
    with_numpy, n_numpy = _kv_requests.dense_hash_ids(values)
    assert n_polars == n_numpy == n_below == len(np.unique(values))
    assert np.array_equal(with_polars, with_numpy) and with_numpy.dtype == np.int64
    assert np.array_equal(with_polars, with_numpy_below) and with_numpy_below.dtype == np.int64
    # the ids are the rank among the distinct values
    assert np.array_equal(np.unique(values)[with_numpy_below], values)


def test_a_forked_child_interns_without_polars():
    import multiprocessing

    reqs = make_requests(10, hbs=64)
    want = [np.asarray(r.block_hashes).tolist() for r in kv_request_ids(reqs, 64, 16)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_intern_in_child, (reqs,)).get(timeout=120)
    assert got == want


def _intern_in_child(reqs):
    import tuner

    assert tuner.IN_FORKED_CHILD
    return [np.asarray(r.block_hashes).tolist() for r in kv_request_ids(reqs, 64, 16)]


def _session_trace():
    """Sessions of growing turns (each turn's prompt = the previous prompt + output + new
    blocks), one session whose third turn rewrites an early block (not a prefix), one
    turn whose partial last block differs, and requests without a session."""
    import dataclasses

    reqs = make_requests(60, hbs=64, follow_ups=False)
    out = []
    for s in range(6):
        prompt = list(reqs[s].block_hashes)
        for turn in range(5):
            n_full = len(prompt) - 1
            L = n_full * 64 + 1 + 17 * turn
            hashes = prompt[:n_full] + [hash((s, turn, "tail")) & (2**64 - 1)]
            stored = list(hashes)
            if s == 2 and turn == 3:
                stored[1] ^= 1  # an edited history: shares only block 0 with the host
            outs = tuple(hash((s, turn, j)) & (2**64 - 1) for j in range(2))
            out.append(dataclasses.replace(
                reqs[s], request_id=f"s{s}t{turn}", arrival_s=float(len(out)), input_len=L,
                output_len=2 * 64, block_hashes=tuple(stored), output_block_hashes=outs,
                session_id=f"s{s}"))
            prompt = hashes[:n_full] + list(outs) + [hash((s, turn, "new")) & (2**64 - 1)] * 3
    return out + [dataclasses.replace(r, session_id=None) for r in reqs[10:20]]


@pytest.mark.parametrize("sizes", [(64, 16), (64, 64), (64, 32)])
def test_session_prompts_share_their_hosts_ids(sizes):
    """A turn whose prompt is a prefix of its session's longest prompt is a view of that
    prompt's ids (memory shared, not copied), and the ids still name exactly the equal
    KV hashes (an edited history and a partial last block get their own)."""
    f, t = sizes
    reqs = _session_trace()
    interned = kv_request_ids(reqs, f, t)
    assert_ids_name_the_hashes(kv_requests(reqs, f, t), interned)
    by_id = {r.request_id: r for r in interned}
    bases = {id(np.asarray(by_id[f"s0t{turn}"].block_hashes).base) for turn in range(5)}
    assert len(bases) == 1  # one session: one array
    host = by_id["s0t4"].block_hashes  # the longest prompt
    assert np.shares_memory(by_id["s0t1"].block_hashes, host)
    edited, its_host = by_id["s2t3"].block_hashes, by_id["s2t4"].block_hashes
    k = f // t
    assert edited[:k].tolist() == its_host[:k].tolist()
    assert edited[k:2 * k].tolist() != its_host[k:2 * k].tolist()


@pytest.mark.parametrize("seed", range(20))
def test_flat_hash_column_equals_the_column_as_lists(seed):
    """The buffer views of ``flat_hash_column`` read every row as the plain column does:
    null rows empty, sliced and two-chunk frames, signed and unsigned columns."""
    import random

    import polars as pl

    from tuner.replay._kv_requests import flat_hash_column

    rng = random.Random(seed)
    for _ in range(20):
        rows = [None if rng.random() < 0.2 else
                [rng.randrange(1 << 63) for _ in range(rng.randrange(4))]
                for _ in range(rng.randrange(8))]
        dtype = rng.choice([pl.List(pl.Int64), pl.List(pl.UInt64)])
        df = pl.DataFrame({"h": pl.Series("h", rows, dtype=dtype)})
        if len(df) > 2 and rng.random() < 0.5:
            df = df.slice(1, len(df) - 2)
        if rng.random() < 0.3:
            df = pl.concat([df, df], rechunk=False)
        values, offsets = flat_hash_column(df, "h")
        assert values.dtype == np.uint64 and offsets.dtype == np.int64
        got = [values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(df))]
        want = [row or [] for row in df.get_column("h").to_list()]
        assert got == want


@pytest.mark.parametrize("seed", range(20))
def test_flat_hash_column_of_arrow_tables(seed):
    """The same for the pyarrow Tables the replay's stream reads (``Trace.row_reader``):
    list and large_list, int64 and uint64 values, sliced and two-chunk columns, and null
    rows, also null rows whose offsets span values (Arrow allows it): read as empty."""
    import random

    import pyarrow as pa

    from tuner.replay._kv_requests import flat_hash_column

    rng = random.Random(seed)
    for _ in range(20):
        n = rng.randrange(8)
        lists = [[rng.randrange(1 << 63) for _ in range(rng.randrange(4))] for _ in range(n)]
        null = [rng.random() < 0.2 for _ in range(n)]
        value_type = rng.choice([pa.int64(), pa.uint64()])
        large = rng.random() < 0.5
        offsets = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(
            np.int64 if large else np.int32)
        flat = pa.array([v for x in lists for v in x], value_type)
        cls = pa.LargeListArray if large else pa.ListArray
        arr = cls.from_arrays(pa.array(offsets), flat,
                              mask=pa.array(null, pa.bool_()) if any(null) else None)
        if n > 2 and rng.random() < 0.5:
            arr = arr.slice(1, n - 2)
        col = pa.chunked_array([arr, arr] if rng.random() < 0.3 else [arr], arr.type)
        table = pa.table({"h": col})
        values, offs = flat_hash_column(table, "h")
        assert values.dtype == np.uint64 and offs.dtype == np.int64
        got = [values[offs[i]:offs[i + 1]].tolist() for i in range(len(col))]
        assert got == [row or [] for row in col.to_pylist()]
