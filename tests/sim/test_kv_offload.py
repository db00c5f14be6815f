"""The CPU KV tier in the twin (tuner.sim.kv_connector): vLLM 0.33.0's OffloadingConnector
scheduler side, its CPU pool and policies, and the replay clock's transfers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sim_helpers import Req, prompt_hashes, replay
from tuner.sim.kv_connector.cpu_manager import HIT, HIT_PENDING, MISS, make_pool
from tuner.sim.kv_connector.offloading import OffloadingConnector
from tuner.sim.kv_connector.policies import ReqContext
from tuner.sim.kv_connector.settings import OffloadSettings
from tuner.sim.request import SimRequest
from tuner.sim.scheduler import Scheduler
from tuner.sim.scheduler_output import SchedulerOutput
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

BS = 16
LINK = dict(bytes_per_block=1 << 20, load_bytes_per_s=50e9, store_bytes_per_s=50e9,
            latency_s=1e-5)


def _session_trace() -> list[Req]:
    """Session A's first turn, a flood of unrelated prompts that evicts it from a small
    GPU cache, then A's second turn (A's prompt + 256 new tokens)."""
    reqs = [Req("a1", 0.0, 1024, 8, prompt_hashes(1, 1024))]
    reqs += [Req(f"f{i}", 1.0 + 0.01 * i, 1024, 8, prompt_hashes(100 + i, 1024))
             for i in range(6)]
    reqs.append(Req("a2", 5.0, 1280, 8, prompt_hashes(1, 1280)))
    return reqs


def _by_id(result):
    return {r.request_id: r for r in result.requests}


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_session_evicted_from_gpu_reloads_from_cpu(async_scheduling: bool) -> None:
    cache = CacheSettings(block_size=BS, num_gpu_blocks=200)
    trace = _session_trace()
    _, off = replay(trace, cache=cache, async_scheduling=async_scheduling)
    _, on = replay(trace, cache=cache, async_scheduling=async_scheduling,
                   kv_offload=OffloadSettings(num_chunks=1000, **LINK))
    assert off.counters["prefix_cache_hits"] == 0  # evicted from the GPU: recomputed
    c = on.counters
    assert c["kv_offload_external_hits"] == 1024  # a1's 64 blocks, loaded from the CPU
    assert c["kv_offload_loads"] == 1 and c["kv_offload_loaded_tokens"] == 1024
    # 8 prompts' full blocks are stored (a2 stores only its 16 new blocks).
    assert c["kv_offload_stored_tokens"] == 7 * 1024 + 256
    # The load took 64 blocks over the link, and a2 waited for it.
    assert c["kv_offload_load_s"] == pytest.approx(1e-5 + 64 * (1 << 20) / 50e9)
    assert c["kv_offload_wait_s"] >= c["kv_offload_load_s"]
    a2_off, a2_on = _by_id(off)["a2"], _by_id(on)["a2"]
    assert a2_on.first_token_s - a2_on.arrival_s < a2_off.first_token_s - a2_off.arrival_s
    assert "kv_offload_loads" not in off.counters  # no tier: no new counters


def test_a_slow_link_makes_the_load_cost_more_than_it_saves() -> None:
    """At 10 MB/s the load takes ~6.7 s: the reloaded turn's TTFT is worse than
    recomputing (the tier never checks; the numbers show it)."""
    cache = CacheSettings(block_size=BS, num_gpu_blocks=200)
    trace = _session_trace()
    slow = dict(LINK, load_bytes_per_s=10e6)
    _, off = replay(trace, cache=cache)
    _, on = replay(trace, cache=cache, kv_offload=OffloadSettings(num_chunks=1000, **slow))
    ttft = lambda r: _by_id(r)["a2"].first_token_s - _by_id(r)["a2"].arrival_s  # noqa: E731
    assert ttft(on) > 6.0 > ttft(off)


def _ctx(manager: object, keys: list[int]) -> ReqContext:
    ctx = ReqContext()
    for i, key in enumerate(keys, 1):
        ctx.positions[key] = i * BS
    manager.on_new_request(ctx)
    return ctx


def _store(manager: object, keys: list[int]) -> ReqContext:
    ctx = _ctx(manager, keys)
    result = manager.prepare_store(keys, ctx)
    assert result is not None
    manager.complete_store(result[0])
    return ctx


@pytest.mark.parametrize("policy, survivor", [("lru", "b"), ("arc", "a")])
def test_full_pool_lru_and_arc_evict_different_chunks(policy: str, survivor: str) -> None:
    """Pool of 4 chunks: A stored and then reused by a load (ARC: A moves to T2), B stored
    later (the most recent). Storing C evicts two chunks: LRU the least recent (A),
    ARC from T1 (B, used once)."""
    m = make_pool(4, policy)
    a, b, c = [1, 2], [3, 4], [5, 6]
    m.on_request_finished(_store(m, a))
    reader = _ctx(m, a)
    assert [m.lookup(k) for k in a] == [HIT, HIT]
    m.prepare_load(a, reader)
    m.complete_load(a)
    m.on_request_finished(reader)
    m.on_request_finished(_store(m, b))
    m.on_request_finished(_store(m, c))
    present = {name for name, keys in (("a", a), ("b", b)) if m.lookup(keys[0]) == HIT}
    assert present == {survivor}
    assert m.num_evicted == 2 and all(m.lookup(k) == HIT for k in c)


def test_full_pool_with_every_chunk_pinned_refuses_the_store() -> None:
    m = make_pool(2, "lru")
    ctx = _ctx(m, [1, 2])
    stored, evicted = m.prepare_store([1, 2], ctx)
    assert (list(stored), evicted) == ([1, 2], 0)  # in flight: not evictable
    assert m.lookup(1) == HIT_PENDING
    assert m.prepare_store([3], _ctx(m, [3])) is None
    m.complete_store([1, 2])
    stored, evicted = m.prepare_store([3], _ctx(m, [3]))
    assert (list(stored), evicted) == ([3], 1)
    assert m.lookup(3) == HIT_PENDING and MISS in (m.lookup(1), m.lookup(2))


def _request(rid: str, family: int, n: int = 256) -> SimRequest:
    return SimRequest(request_id=rid, index=0, arrival_s=0.0, num_prompt_tokens=n,
                      max_tokens=4, block_size=BS,
                      prompt_block_hashes=np.arange(family * 100, family * 100 + n // BS))


def _connector(**kw) -> OffloadingConnector:
    return OffloadingConnector(OffloadSettings(num_chunks=64, **{**LINK, **kw}), block_size=BS)


def _scheduled(conn: OffloadingConnector, request: SimRequest, n: int) -> None:
    """``request`` ran a prefill of ``n`` tokens: its blocks exist, the stores are built."""
    request.bind_synthetic(10_000)
    request.extend_blocks(np.arange(1, n // BS + 1))
    out = SchedulerOutput()
    out.individual.append((request, n))
    conn.build_connector_meta(out)


def test_lookup_is_deferred_while_the_hit_is_being_stored() -> None:
    conn = _connector(store_bytes_per_s=1e9)
    r1 = _request("r1", 1)
    conn.on_new_request(r1)
    _scheduled(conn, r1, 256)
    conn.launch(0.0, 0.01)  # 16 blocks of 1 MiB at 1 GB/s: the store ends at ~0.027 s
    r2 = _request("r2", 1)
    r2.bind_synthetic(20_000)
    conn.on_new_request(r2)
    assert conn.get_num_new_matched_tokens(r2, 0) == (None, False)  # HIT_PENDING
    assert conn.update_connector_output(0.02) == set()
    assert conn.get_num_new_matched_tokens(r2, 0) == (None, False)
    conn.update_connector_output(0.03)  # the store is reported
    assert conn.get_num_new_matched_tokens(r2, 0) == (256, True)
    assert conn.get_num_new_matched_tokens(r2, 64) == (192, True)  # beyond the GPU hit
    assert conn.num_deferred_lookups == 2


def test_a_request_with_transfers_in_flight_is_not_looked_up() -> None:
    """A preempted request whose stores are still in flight: vLLM answers None until
    they finish (get_num_new_matched_tokens 1245-1250)."""
    conn = _connector(store_bytes_per_s=1e9)
    r1 = _request("r1", 1)
    conn.on_new_request(r1)
    _scheduled(conn, r1, 256)
    conn.launch(0.0, 0.01)
    r1.num_blocks = 0  # preempted: blocks freed, stores still in flight
    assert conn.get_num_new_matched_tokens(r1, 0) == (None, False)
    conn.update_connector_output(1.0)
    assert conn.get_num_new_matched_tokens(r1, 0) == (256, True)


def test_a_chunk_being_loaded_defers_another_request() -> None:
    conn = _connector()
    r1 = _request("r1", 1)
    conn.on_new_request(r1)
    _scheduled(conn, r1, 256)
    conn.launch(0.0, 0.01)
    conn.update_connector_output(1.0)
    loaders = []
    for rid in ("r2", "r3"):
        r = _request(rid, 1)
        r.bind_synthetic(30_000 + len(loaders) * 100)
        conn.on_new_request(r)
        loaders.append(r)
    assert conn.get_num_new_matched_tokens(loaders[0], 0) == (256, True)
    conn.update_state_after_alloc(loaders[0], 256)
    assert conn.get_num_new_matched_tokens(loaders[1], 0) == (None, False)


def test_tier_off_costs_nothing_in_the_scheduler() -> None:
    s = Scheduler(SchedulerSettings(), CacheSettings(), SimOptions())
    assert s.connector is None and s.group is not None
    # with a tier the fast path runs too (tuner.sim.fast_path item 4;
    # tests/sim/test_fast_path_connectors.py holds it to the plain path)
    t = Scheduler(SchedulerSettings(), CacheSettings(),
                  SimOptions(kv_offload=OffloadSettings(num_chunks=8, **LINK)))
    assert t.connector is not None and t.group is not None and t.fast_path_refusal is None


def test_offload_settings_refuse_bad_values() -> None:
    from tuner.errors import ConfigError

    for bad in (dict(num_chunks=0), dict(num_chunks=4, policy="fifo"),
                dict(num_chunks=4, backend="nixl")):
        with pytest.raises(ConfigError):
            OffloadSettings(**bad).validate()
    assert dataclasses.replace(OffloadSettings(num_chunks=4, **LINK)).transfer_s(2, True) \
        == pytest.approx(1e-5 + 2 * (1 << 20) / 50e9)


def test_offload_size_beyond_any_host_is_a_one_line_error() -> None:
    """A typo'd ``--kv-offloading-size 1e30`` once reached numpy as a 10^20-entry array
    ("Maximum allowed dimension exceeded", a traceback); it is refused by name."""
    from tuner.errors import ConfigError
    from tuner.perf.host_link import MAX_OFFLOAD_GIB, offload_settings

    kw = dict(backend="native", policy="lru", blocks_per_chunk=1, hardware_name="mi355x",
              tp=1, bytes_per_block=1 << 21)
    with pytest.raises(ConfigError, match="--kv-offloading-size 1e\\+30: more than"):
        offload_settings(size_gib=1e30, **kw)
    assert offload_settings(size_gib=MAX_OFFLOAD_GIB, **kw).num_chunks == MAX_OFFLOAD_GIB * 512


def test_lru_pool_memory_follows_the_chunks_used_not_the_pool_size() -> None:
    """The LRU pool's free-id stack grows with evictions instead of being sized by
    ``num_chunks`` (a 64 TiB pool of 2 MiB chunks is 32 M chunks, 256 MB of stack), and
    a burst of evictions larger than its first allocation keeps every chunk id unique."""
    from tuner.sim.kv_connector.lru_pool import LRUPool

    assert LRUPool(1 << 40)._free.nbytes <= 8 * 1024
    pool = LRUPool(3000)
    first = pool.prepare_store(list(range(3000)), ReqContext())
    assert first is not None
    pool.complete_store(first[0])
    second = pool.prepare_store(list(range(3000, 5000)), ReqContext())
    assert second is not None
    pool.complete_store(second[0])
    held = pool._chunk[pool._chunk >= 0]
    assert len(held) == 3000 and len(np.unique(held)) == 3000 and held.max() < 3000
    assert [pool.lookup(k) for k in (0, 1999, 2000, 4999)] == [MISS, MISS, HIT, HIT]


def test_lru_evicts_the_smallest_ranks_like_a_brute_force_scan() -> None:
    """The LRU pool's run-sorted eviction order (stale entries skipped, protected ones kept
    for later, and looked at only once the eviction reaches their ranks) evicts exactly the n idle, unprotected keys of smallest (rank, key), over
    random stores, accesses, finishes, loads and evictions."""
    import random

    from tuner.sim.kv_connector.lru_pool import LRUPool

    rng = random.Random(1)
    for _ in range(60):
        pool = LRUPool(400)
        positions = [{k: rng.randint(1, 100) * 16 for k in range(300)} for _ in range(6)]
        ctxs = [ReqContext() for _ in range(6)]
        for ctx, pos in zip(ctxs, positions):
            ctx.positions.update(pos)
        loading: list[list[int]] = []
        for _ in range(300):
            op, i = rng.random(), rng.randrange(6)
            keys = rng.sample(range(300), rng.randint(1, 8))
            if op < 0.35:  # store and complete
                result = pool.prepare_store(keys, ctxs[i])
                assert result is not None
                pool.complete_store(result[0])
            elif op < 0.55:  # an access raises ranks (a fresh request each time)
                pool._on_access(np.array(keys), np.array([positions[i][k] for k in keys]),
                                ReqContext())
            elif op < 0.7:  # a finish gives fresh ranks
                ctx = ReqContext()
                ctx.positions.update(positions[i])
                pool.prepare_store(keys, ctx)
                pool.on_request_finished(ctx)
            elif op < 0.8:  # pin a key by a load, or unpin one
                ready = [k for k in keys if pool.lookup(k) == HIT]
                if loading and rng.random() < 0.5:
                    pool.complete_load(loading.pop())
                elif ready:
                    pool.prepare_load(ready[:1], ReqContext())
                    loading.append(ready[:1])
            else:
                n, offered = rng.randint(1, 4), rng.sample(range(300), 5)
                idle = np.flatnonzero((pool._chunk >= 0) & (pool._ref == 0)).tolist()
                rank = pool._state >> 1  # the state word is 2 * rank + idle
                ranked = sorted((int(rank[k]), k) for k in idle if k not in offered)
                want = None if len(ranked) < n else [k for _, k in ranked[:n]]
                # the offered run as a store hands it over: every key (stored or not)
                # with its state word (a store's are read before its access record)
                run = np.array(offered, dtype=np.int64)
                got = pool._evict(n, run, pool._state[run])
                assert want == (None if got is None else got.tolist())


def test_a_tier_with_speculative_decoding_is_refused_in_one_line() -> None:
    """The two are not modelled together yet: the scheduler says so instead of replaying an
    untested combination (docs/kv-offloading.md, "Not modelled")."""
    from tuner.errors import ConfigError
    from tuner.sim.spec_decode import from_vllm_config

    spec = from_vllm_config({"method": "mtp", "num_speculative_tokens": 1}, "0.8")
    with pytest.raises(ConfigError, match="not modelled yet") as err:
        Scheduler(SchedulerSettings(), CacheSettings(),
                  SimOptions(kv_offload=OffloadSettings(num_chunks=8, **LINK), speculative=spec))
    assert "\n" not in str(err.value)
    Scheduler(SchedulerSettings(), CacheSettings(), SimOptions(speculative=spec))  # alone: fine


def test_a_closed_loop_waiting_on_a_load_in_flight_ends() -> None:
    """A closed loop at its concurrency whose waiting requests need the blocks two loads in
    flight hold: the empty steps wait for the loads to end (the load's due arrival, held
    back by the loop, does not end the wait). Counting that arrival made every empty step
    0 s long and the replay never ended (found by tests/sim/test_fast_path_contract.py);
    here it runs under an alarm so a regression fails instead of hanging."""
    import signal

    from sim_helpers import nonlinear_step, random_trace
    from tuner.sim.engine import Simulator
    from tuner.sim.load import ClosedLoop

    trace = random_trace(9520, 22, block_size=16, max_input=300, max_output=80,
                         with_output_hashes=True, rate=5.0)
    tier = OffloadSettings(num_chunks=400, blocks_per_chunk=2, policy="arc",
                           bytes_per_block=1 << 16, load_bytes_per_s=1e9,
                           store_bytes_per_s=1e9)
    settings = SchedulerSettings(max_num_batched_tokens=77, max_num_seqs=25,
                                 long_prefill_token_threshold=200)
    cache = CacheSettings(block_size=16, num_gpu_blocks=24, enable_prefix_caching=False,
                          max_model_len=330)

    def hung(*_: object) -> None:
        raise AssertionError("the replay did not end within 60 s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        for fast in (False, True):
            result = Simulator(trace, settings, cache, nonlinear_step, load=ClosedLoop(4),
                               options=SimOptions(kv_offload=tier, fast_forward=fast,
                                                  check_invariants=True)).run()
            assert result.counters["num_finished"] + result.counters.get(
                "num_rejected", 0) == len(trace)
            assert result.counters["kv_offload_loaded_tokens"] > 0
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
