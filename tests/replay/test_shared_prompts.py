"""Whole-trace interning with shared session prompts (tuner.replay._shared_prompts) names
exactly the equal KV hashes, on random sessions whose turns are, or are not, prefixes of
one another (edited histories, partial last blocks, output chains, no session)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.replay._kv_requests import kv_request_ids, kv_requests
from tuner.trace import TraceRequest

_turn = st.tuples(st.integers(0, 3),  # session (3: none)
                  st.integers(1, 12),  # prompt blocks at 64 tokens (the last may be partial)
                  st.integers(0, 63),  # tokens short of the last block's end
                  st.integers(0, 200),  # output tokens
                  st.booleans(),  # output hashes known
                  st.integers(-1, 11))  # a block edited (-1: none)


@settings(max_examples=150, deadline=None)
@given(st.lists(_turn, min_size=1, max_size=14), st.sampled_from([(64, 16), (64, 64), (64, 32)]))
def test_ids_name_exactly_the_equal_hashes(turns, sizes):
    f, t = sizes
    history = {s: [1000 * s + j for j in range(12)] for s in range(4)}
    reqs = []
    for i, (s, blocks, short, out_len, with_out, edit) in enumerate(turns):
        hashes = list(history[s][:blocks])
        if 0 <= edit < blocks:
            hashes[edit] = 10**6 + i
        input_len = blocks * f - short
        n_out = (input_len + out_len) // f - input_len // f if with_out else 0
        reqs.append(TraceRequest(
            request_id=f"r{i}", arrival_s=float(i), input_len=input_len, output_len=out_len,
            block_hashes=tuple(hashes),
            output_block_hashes=tuple(2 * 10**6 + 100 * i + j for j in range(n_out)),
            session_id=None if s == 3 else f"s{s}"))
    assert_ids_name_the_hashes(kv_requests(reqs, f, t), kv_request_ids(reqs, f, t))


def assert_ids_name_the_hashes(raw, interned) -> None:  # type: ignore[no-untyped-def]
    """Each interned id stands for exactly one raw hash and each hash for one id."""
    pairs: dict[int, int] = {}
    back: dict[int, int] = {}
    for a, b in zip(raw, interned):
        for hashes, ids in ((a.block_hashes, b.block_hashes),
                            (a.output_block_hashes, b.output_block_hashes)):
            assert len(hashes) == len(ids)
            for h, i in zip(np.asarray(hashes).tolist(), np.asarray(ids).tolist()):
                assert pairs.setdefault(h, i) == i  # one id per hash
                assert back.setdefault(i, h) == h  # one hash per id
                assert 0 <= i < interned.num_hash_ids


def test_too_few_hashes_are_refused_as_the_reference_refuses():
    import pytest

    from tuner.errors import ConfigError
    from tuner.trace.reblock import reblock_request_hashes

    short = TraceRequest(request_id="r0", arrival_s=0.0, input_len=1000, output_len=5,
                         block_hashes=(1, 2), session_id="s")
    with pytest.raises(ConfigError) as want:
        reblock_request_hashes(short.block_hashes, (), 1000, 5, 64, 16)
    with pytest.raises(ConfigError) as got:
        kv_request_ids([short], 64, 16)
    assert str(got.value) == str(want.value)
