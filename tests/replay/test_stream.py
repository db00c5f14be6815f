"""The streamed trace reader (tuner.replay._stream): same replay as interning the whole
trace, at any window, with the id space renumbered often; memory structures drop what
is no longer live."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from replay_traces import make_requests

from tuner.replay._kv_requests import kv_request_ids, load_trace_arrays
from tuner.replay._stream import TraceArrivals
from tuner.sim.engine import Simulator
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions


def step_time(batch) -> float:  # type: ignore[no-untyped-def]
    return 0.004 + 2e-5 * batch.num_prefill_tokens + 1e-4 * batch.num_decode_reqs


def write(tmp_path: Path, hbs: int, n: int = 80, seed: int = 0) -> Path:
    from tuner.trace import write_trace
    from tuner.trace.schema import TraceMetadata

    reqs = make_requests(n, seed=seed, hbs=hbs, spacing_s=0.02)
    return write_trace(tmp_path / f"t{hbs}_{seed}.parquet", reqs,
                       TraceMetadata(hash_block_size=hbs, source_format="test"))


def records(result) -> str:  # type: ignore[no-untyped-def]
    """Every record, as text (repr is exact for floats, and nan equals nan there)."""
    return repr(([dataclasses.astuple(r) for r in result.requests],
                 [dataclasses.astuple(s) for s in result.steps], list(result.itl_samples),
                 sorted(result.counters.items())))


@pytest.mark.parametrize("hbs,block_size", [(16, 16), (64, 16), (16, 32), (32, 16)])
@pytest.mark.parametrize("load", [OpenLoop(), ClosedLoop(6)])
def test_stream_replays_like_whole_trace_interning(tmp_path: Path, hbs: int, block_size: int,
                                                   load) -> None:  # type: ignore[no-untyped-def]
    from tuner.trace import read_trace

    trace = read_trace(write(tmp_path, hbs))
    settings = SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=12)
    cache = CacheSettings(block_size=block_size, num_gpu_blocks=60, max_model_len=4096)
    options = SimOptions(record_steps=True, check_invariants=True)
    interned = kv_request_ids(load_trace_arrays(trace), hbs, block_size)
    want = records(Simulator(interned, settings, cache, step_time, options=options, load=load,
                             num_hash_ids=interned.num_hash_ids).run())
    for window in (1, 7, 1000):
        stream = TraceArrivals(trace, block_size, window=window, min_compact_ids=16)
        got = records(Simulator(stream, settings, cache, step_time, options=options,
                                load=load).run())
        assert got == want, f"window {window}"
        if window == 1:
            assert stream.num_renumberings > 0


def test_renumbering_keeps_only_live_ids(tmp_path: Path) -> None:
    """After a replay the id space holds what the cache and the map still reference,
    not every hash the trace had."""
    from tuner.trace import read_trace

    trace = read_trace(write(tmp_path, 16, n=200, seed=3))
    cache = CacheSettings(block_size=16, num_gpu_blocks=20, max_model_len=4096)
    settings = SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=12)
    stream = TraceArrivals(trace, 16, window=4, min_compact_ids=16)
    sim = Simulator(stream, settings, cache, step_time)
    sim.run()
    pool = sim.scheduler.kv_cache_manager.block_pool
    assert stream.num_renumberings > 3
    assert stream._space is not None
    stream._renumber(stream._space)  # nothing is live but the cache: it alone is kept
    cached = pool.block_hash[pool.block_hash >= 0]
    assert pool.num_hash_ids == len(np.unique(cached)) <= 19
    assert sorted(np.unique(cached).tolist()) == list(range(pool.num_hash_ids))
    assert (pool.first_holder[cached] >= 0).all()  # every cached hash still maps to a block
    cached = pool.block_hash[pool.block_hash >= 0]
    assert (pool.first_holder[cached] >= 0).all()  # every cached hash still maps to a block


def test_id_arrays_stay_at_the_renumbering_threshold(tmp_path: Path) -> None:
    """The prefix cache's per-id arrays grow no larger than the ids up to the next
    renumbering: a window that would pass the threshold renumbers first, and the arrays
    stop doubling at the threshold plus an eighth. Before, cut to the live ids at a
    renumbering, they doubled as the next windows reserved and again as a window ran
    past the threshold (5.6 M ids' worth for a 4.2 M threshold on a synthetic day's
    24 hours, docs/performance.md)."""
    from tuner.trace import read_trace

    trace = read_trace(write(tmp_path, 64, n=1200, seed=5))
    cache = CacheSettings(block_size=16, num_gpu_blocks=400, max_model_len=4096)
    settings = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=16)
    stream = TraceArrivals(trace, 16, window=4, min_compact_ids=1 << 12)
    sim = Simulator(stream, settings, cache, step_time)
    pool = sim.scheduler.kv_cache_manager.block_pool
    seen: list[tuple[int, int, int]] = []  # (ids, array length, threshold) per window
    build = stream._build

    def watched(start: int, stop: int):  # type: ignore[no-untyped-def]
        out = build(start, stop)
        seen.append((pool.num_hash_ids, len(pool.first_holder), stream._next_compact))
        return out

    stream._build = watched  # type: ignore[method-assign]
    sim.run()
    assert stream.num_renumberings >= 2
    assert all(ids <= length for ids, length, _ in seen)
    assert max(length - threshold - threshold // 8 for _, length, threshold in seen) <= 0


def test_hash_chunks_are_dropped_once_issued(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tuner.replay import _stream
    from tuner.trace import read_trace

    monkeypatch.setattr(_stream, "CHUNK_ROWS", 10)
    trace = read_trace(write(tmp_path, 16, n=60))
    stream = TraceArrivals(trace, 16, window=5)
    sim = Simulator(stream, SchedulerSettings(), CacheSettings(num_gpu_blocks=500), step_time)
    held = []
    original = stream._build

    def spy(start: int, stop: int):  # type: ignore[no-untyped-def]
        out = original(start, stop)
        held.append(len(stream._chunks))
        return out

    stream._build = spy  # type: ignore[method-assign]
    result = sim.run()
    assert len(result.requests) == 60 and max(held) <= 3  # the trace is stored in time order


def test_empty_trace_is_refused(tmp_path: Path) -> None:
    from tuner.errors import ConfigError
    from tuner.trace import Trace
    from tuner.trace.schema import TraceMetadata

    empty = Trace.from_requests([], TraceMetadata(hash_block_size=16, source_format="test"))
    with pytest.raises(ConfigError, match="no requests"):
        TraceArrivals(empty, 16)


def test_string_and_request_columns() -> None:
    from tuner.records import GapSamples, RequestResult, RequestTable, StringColumn

    ids = StringColumn.of(["a", "bé", None, ""])
    assert list(ids) == ["a", "bé", None, ""] and ids[-3] == "bé" and ids[1:3] == ["bé", None]
    with pytest.raises(IndexError):
        ids[4]
    table = RequestTable(StringColumn.of(["x", "y"]), [10, 20], [None, "s"])
    table.record(1, "finished", 1.5, output_len=3, first_scheduled_s=1.5, first_token_s=2.0,
                 finish_s=3.0, num_cached_tokens=16, num_preemptions=1)
    table.record(0, "rejected", 0.5)
    nan = float("nan")
    rows = list(table)
    assert rows[1] == RequestResult("y", 1.5, 20, 3, 1.5, 2.0, 3.0, 16, 1, "finished", "s")
    assert rows[0].status == "rejected" and rows[0].input_len == 10 and rows[0].arrival_s == 0.5
    assert np.isnan(rows[0].first_token_s) and not table == [rows[0]]
    gaps = GapSamples()
    gaps.append((0.5, 2))
    gaps.append((0.25, 1))
    assert gaps == [(0.5, 2), (0.25, 1)] and gaps[1] == (0.25, 1) and len(gaps) == 2
    assert nan != nan  # the table's nan defaults are real nans


@pytest.mark.parametrize("router", ["round-robin", "least-loaded", "session", "prefix-aware"])
@pytest.mark.parametrize("dp,replicas,moe", [(1, 3, False), (2, 2, True), (2, 1, False)])
@pytest.mark.parametrize("load", [OpenLoop(), ClosedLoop(6)])
def test_streamed_fleet_replays_like_the_loaded_one(tmp_path: Path, router: str, dp: int,
                                                    replicas: int, moe: bool, load) -> None:  # type: ignore[no-untyped-def]
    """A fleet reading the trace as it goes (one id space over every engine, renumbered
    often, requests routed but not yet delivered included) replays exactly as the fleet
    given the whole interned trace."""
    import dataclasses as dc

    from tuner.sim.fleet.router import RouterSettings
    from tuner.sim.fleet.simulator import FleetSimulator
    from tuner.trace import TraceRequest, read_trace, write_trace
    from tuner.trace.schema import TraceMetadata

    reqs = [dc.replace(r, session_id=f"s{i % 5}")
            for i, r in enumerate(make_requests(90, seed=3, hbs=64, spacing_s=0.01))]
    trace = read_trace(write_trace(tmp_path / "f.parquet", reqs, TraceMetadata(
        hash_block_size=64, source_format="test")))
    assert all(isinstance(r, TraceRequest) for r in reqs)
    settings = SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=8)
    cache = CacheSettings(block_size=16, num_gpu_blocks=80, max_model_len=4096)
    options = SimOptions(record_steps=True, check_invariants=True)
    kw = dict(dp=dp, replicas=replicas, moe=moe, router=RouterSettings(policy=router),
              options=options, load=load)
    interned = kv_request_ids(load_trace_arrays(trace), 64, 16)
    want = records(FleetSimulator(interned, settings, cache, step_time,
                                  num_hash_ids=interned.num_hash_ids, **kw).run())
    for window in (1, 5):
        stream = TraceArrivals(trace, 16, window=window, min_compact_ids=16)
        got = records(FleetSimulator(stream, settings, cache, step_time, **kw).run())
        assert got == want, f"window {window}"
        assert stream.num_renumberings > 0


def _session_trace(data, hbs: int):  # type: ignore[no-untyped-def]
    """Sessions whose turns extend an earlier turn's prompt + output (often whole, else
    cut or with a changed hash), hashes drawn from a small pool (repeats within and
    across requests), some requests without a session."""
    from hypothesis import strategies as st

    from tuner.trace.schema import TraceRequest

    pool = st.integers(1, 40)
    latest: dict[str, tuple[list[int], list[int], int]] = {}
    out, t = [], 0.0
    for i in range(data.draw(st.integers(2, 24), label="requests")):
        t += data.draw(st.sampled_from([0.0, 0.01, 0.3]), label="gap")
        session = data.draw(st.sampled_from([None, "a", "b", "c", "d"]), label="session")
        prefix: list[int] = []
        if session in latest and data.draw(st.booleans(), label="follows"):
            prompt, output, _ = latest[session]
            prefix = prompt + output
            cut = data.draw(st.sampled_from(["whole", "cut", "changed"]), label="cut")
            if cut == "cut" and prefix:
                prefix = prefix[:data.draw(st.integers(0, len(prefix)), label="at")]
            elif cut == "changed" and prefix:
                at = data.draw(st.integers(0, len(prefix) - 1), label="changed at")
                prefix = prefix[:at] + [1000 + i] + prefix[at + 1:]
        extra = data.draw(st.lists(pool, min_size=1, max_size=6), label="new hashes")
        hashes = prefix + extra
        input_len = (len(hashes) - 1) * hbs + data.draw(st.integers(1, hbs), label="tail")
        output_len = data.draw(st.integers(1, 3 * hbs), label="output_len")
        n_out = (input_len + output_len) // hbs - input_len // hbs
        out_hashes = data.draw(st.lists(pool, min_size=n_out, max_size=n_out), label="out")
        request = TraceRequest(request_id=f"r{i:03d}", arrival_s=t, input_len=input_len,
                               output_len=output_len, block_hashes=tuple(hashes),
                               output_block_hashes=tuple(out_hashes), session_id=session)
        out.append(request)
        if session is not None:
            latest[session] = (list(hashes[:input_len // hbs]), list(out_hashes), i)
    return out


class _Recording(TraceArrivals):
    """A stream that keeps a copy of every request's ids as built."""

    built: list

    def _build(self, start: int, stop: int):  # type: ignore[no-untyped-def]
        out = super()._build(start, stop)
        self.built.extend((pos, r.block_hashes.tolist(), r.output_block_hashes.tolist())
                          for pos, r in out)
        return out


def test_turn_prefix_reuse_gives_the_ids_of_looking_up_every_hash(tmp_path: Path) -> None:
    """``reuse_turns`` (a turn's shared prefix takes the previous turn's ids) against
    looking every hash up: identical ids for every request, and identical records, at
    any window, with the id space renumbered often, whole-block and split hashes."""
    from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

    from tuner.trace import read_trace, write_trace
    from tuner.trace.schema import TraceMetadata

    runs = iter(range(10_000))

    @hsettings(max_examples=40, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture,
                                      HealthCheck.too_slow])
    @given(st.data())
    def check(data) -> None:  # type: ignore[no-untyped-def]
        hbs, block_size = data.draw(st.sampled_from([(16, 16), (64, 16), (16, 32)]),
                                    label="blocks")
        reqs = _session_trace(data, hbs)
        window = data.draw(st.sampled_from([1, 2, 5, 1000]), label="window")
        compact = data.draw(st.sampled_from([8, 1 << 22]), label="min_compact_ids")
        path = write_trace(tmp_path / f"s{next(runs)}.parquet", reqs,
                           TraceMetadata(hash_block_size=hbs, source_format="test"))
        trace = read_trace(path)
        settings = SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=6)
        cache = CacheSettings(block_size=block_size, num_gpu_blocks=40, max_model_len=8192)
        # No invariant walk: it refuses a request holding a block twice, which a hash
        # repeated in one request's chain makes legitimate (and the pool handles).
        options = SimOptions(record_steps=True)
        got = {}
        for reuse in (False, True):
            stream = _Recording(trace, block_size, window=window, min_compact_ids=compact,
                                reuse_turns=reuse)
            stream.built = []
            result = Simulator(stream, settings, cache, step_time, options=options).run()
            got[reuse] = (stream.built, records(result), stream.num_renumberings)
        assert got[True] == got[False]

    check()


def test_turn_prefix_reuse_covers_a_followed_turn(tmp_path: Path) -> None:
    """The reuse is taken: a second turn extending the first one's prompt and output
    looks up only its new hashes (so the oracle above compares two different paths)."""
    from tuner.replay import _stream
    from tuner.trace import read_trace, write_trace
    from tuner.trace.schema import TraceMetadata, TraceRequest

    first = TraceRequest(request_id="a", arrival_s=0.0, input_len=40, output_len=30,
                         block_hashes=(1, 2, 3), output_block_hashes=(4, 5),
                         session_id="s")
    second = TraceRequest(request_id="b", arrival_s=5.0, input_len=90, output_len=4,
                          block_hashes=(1, 2, 4, 5, 6, 7), output_block_hashes=(),
                          session_id="s")
    path = write_trace(tmp_path / "two.parquet", [first, second],
                       TraceMetadata(hash_block_size=16, source_format="test"))
    looked_up = []
    original = _stream._HashMap.lookup

    def spy(self, raw, space):  # type: ignore[no-untyped-def]
        looked_up.append(raw.tolist())
        return original(self, raw, space)

    settings = SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=6)
    cache = CacheSettings(block_size=16, num_gpu_blocks=40, max_model_len=8192)
    stream = TraceArrivals(read_trace(path), 16, window=1)
    _stream._HashMap.lookup = spy  # type: ignore[method-assign]
    try:
        Simulator(stream, settings, cache, step_time).run()
    finally:
        _stream._HashMap.lookup = original  # type: ignore[method-assign]
    assert len(looked_up) == 2
    assert looked_up[1] != [1, 2, 4, 5, 6, 7] and len(looked_up[1]) < 6


class _CountingSpace:
    """The id space's ``reserve`` alone: consecutive ranges from 0."""

    def __init__(self) -> None:
        self.size = 0

    def reserve(self, count: int) -> int:
        base, self.size = self.size, self.size + count
        return base


@pytest.mark.parametrize("seed", range(10))
def test_hash_map_runs_give_the_ids_of_one_sorted_run(seed: int) -> None:
    """The map's recent run (merged into the large one past an eighth of it) gives every
    hash the id one sorted run gives (merging at every lookup), and so does never
    merging; keep_live and renumber agree too. Random windows of hashes from a small
    pool (so they repeat within and across windows), k = 1 and 4."""
    from tuner.replay._stream import _HashMap

    rng = np.random.default_rng(seed)
    k = int(rng.choice([1, 4]))
    maps = [_HashMap(k) for _ in range(3)]
    maps[0]._MERGE_FRACTION = 1 << 40  # type: ignore[misc]  # one run: merge every lookup
    maps[2]._MERGE_FRACTION = 0  # type: ignore[misc]  # only keep_live merges
    spaces = [_CountingSpace() for _ in maps]
    pool = rng.integers(1, 1 << 63, size=int(rng.integers(20, 400)), dtype=np.uint64)
    for step in range(40):
        raw = pool[rng.integers(0, len(pool), size=int(rng.integers(0, 60)))]
        got = [m.lookup(raw, s) for m, s in zip(maps, spaces)]
        assert all(np.array_equal(got[0], g) for g in got[1:]), step
        if rng.random() < 0.15:  # a renumbering keeping a random part of the ids
            size = spaces[0].size + k
            keep = rng.random(size) < 0.5
            lives = []
            for m in maps:
                mask = keep.copy()
                m.keep_live(mask)
                lives.append(mask.nonzero()[0].astype(np.int64))
                m.renumber(lives[-1])
            assert all(np.array_equal(lives[0], live) for live in lives[1:])
            for s in spaces:
                s.size = len(lives[0])


def test_a_one_engine_fleet_renumbers_the_requests_in_its_input_queue() -> None:
    """A fleet loop holds routed requests in its engines' input queues until their next
    schedule, also with one engine (``FleetSimulator``'s defaults, the fleet bench's
    decoder alone); a renumbering must rewrite their ids too. With one engine bound the
    stream ignored the queue (only a fleet's shared space took it), and the hour's P/D
    bench stopped on `hash id 2111931 >= num_hash_ids 570245` once the renumbering
    threshold came down to 2**21."""
    from tuner.sim.fleet.simulator import FleetSimulator
    from tuner.trace import read_trace, slice_trace

    root = Path(__file__).resolve().parents[2]
    trace = slice_trace(read_trace(root / "traces" / "agentic_1h.parquet"), 0.0, 8.0)
    cache = CacheSettings(block_size=16, num_gpu_blocks=3000, max_model_len=131072)

    def replay(requests):  # type: ignore[no-untyped-def]
        return FleetSimulator(requests, SchedulerSettings(), cache, step_time,
                              num_hash_ids=getattr(requests, "num_hash_ids", None)).run()

    stream = TraceArrivals(trace, 16, window=8, min_compact_ids=1 << 10)
    streamed = replay(stream)
    interned = replay(kv_request_ids(load_trace_arrays(trace),
                                     trace.metadata.hash_block_size, 16))
    assert stream.num_renumberings > 0
    assert streamed.counters == interned.counters
    assert repr(list(streamed.requests)) == repr(list(interned.requests))
