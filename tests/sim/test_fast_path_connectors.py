"""The fast path with KV connectors (``tuner.sim.fast_path`` item 4): the CPU tier (LRU and
ARC, sync and async) and the NIXL pull connectors of a P/D deployment (both modes) give
byte-identical records and counters with the decode group on and off, over generated
setups that load, store, fail stores, defer lookups and preempt; and the examples are not
vacuous: their replays take group steps beside the connector's work."""

from __future__ import annotations

import random
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import pytest
from hypothesis import HealthCheck, event, given, settings as hyp_settings, strategies as st

from sim_helpers import Req, assert_identical, check_result, nonlinear_step, prompt_hashes
from tuner.sim.disagg import PDSettings
from tuner.sim.disagg.simulator import PDPool, PDSimulator
from tuner.sim.decode_group import DecodeGroup
from tuner.sim.engine import Simulator
from tuner.sim.kv_connector.base import NO_DECODE_EVENT
from tuner.sim.kv_connector.settings import OffloadSettings
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

_HYP = dict(deadline=None, derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def session_turns(seed: int, n: int, *, block_size: int = 16, sessions: int = 5,
                  max_input: int = 700, max_output: int = 80, rate: float = 20.0) -> list[Req]:
    """``n`` turns of ``sessions`` conversations: each turn's prompt extends the session's
    previous one (the same family's hashes), so a prefix evicted from a small GPU cache
    comes back from the CPU tier, or is read again on a P/D decoder."""
    rng = random.Random(seed)
    lengths = [rng.randint(16, max_input // 2) for _ in range(sessions)]
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        s = rng.randrange(sessions)
        lengths[s] = min(max_input, lengths[s] + rng.randint(1, 200))
        out.append(Req(f"r{i}", t, lengths[s], rng.randint(1, max_output),
                       prompt_hashes(s, lengths[s], block_size)))
    return out


def _spied(scheduler, path: list) -> None:
    """Record per step whether it was a group step and every running request's stored
    (possibly lagging) counters."""
    original = scheduler.schedule

    def schedule():
        out = original()
        path.append((out.group is not None, [
            (r.request_id, r.num_tokens, r.num_computed_tokens, r.g0, r.steady)
            for r in scheduler.running]))
        return out

    scheduler.schedule = schedule  # type: ignore[method-assign]


# ----------------------------------------------------------------------------- CPU tier
@st.composite
def tier_setup(draw: st.DrawFn) -> tuple:
    bs = draw(st.sampled_from([4, 16, 16]))
    settings = SchedulerSettings(
        max_num_batched_tokens=draw(st.sampled_from([64, 256, 600])),
        max_num_seqs=draw(st.sampled_from([4, 16, 32])),
        policy=draw(st.sampled_from(["fcfs", "fcfs", "priority"])),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 64])),
        cache_aware_admission_window=draw(st.sampled_from([0, 0, 4])))
    cache = CacheSettings(block_size=bs,
                          num_gpu_blocks=draw(st.sampled_from([1200, 3000, 8000])) // bs,
                          enable_prefix_caching=draw(st.booleans() | st.just(True)))
    bw = draw(st.sampled_from([1e10, 1e8, 2e7]))  # within a step, a few, many steps a load
    tier = OffloadSettings(num_chunks=draw(st.sampled_from([6, 40, 600])),
                           blocks_per_chunk=draw(st.sampled_from([1, 1, 2, 4])),
                           policy=draw(st.sampled_from(["lru", "arc"])),
                           bytes_per_block=1 << 16, load_bytes_per_s=bw,
                           store_bytes_per_s=bw, latency_s=draw(st.sampled_from([0.0, 1e-4])))
    options = dict(kv_offload=tier, async_scheduling=draw(st.booleans()), record_steps=True)
    trace = session_turns(draw(st.integers(0, 10_000)), draw(st.integers(8, 25)),
                          block_size=bs, max_output=draw(st.sampled_from([20, 80])),
                          rate=draw(st.sampled_from([5.0, 40.0])))
    load = draw(st.sampled_from([OpenLoop(), OpenLoop(), ClosedLoop(6)]))
    return trace, settings, cache, options, load


def _tier_run(trace, settings, cache, options, load, *, fast: bool, check: bool,
              path: list | None = None):
    sim = Simulator(trace, settings, cache, nonlinear_step, load=load,
                    options=SimOptions(**options, fast_forward=fast, check_invariants=check))
    if path is not None:
        _spied(sim.scheduler, path)
    return sim.run()


@pytest.mark.slow  # tens of small replays, each two or three times: > 4 s
@hyp_settings(max_examples=20, **_HYP)
@given(tier_setup())
def test_the_tier_replays_identically_with_the_fast_path(setup) -> None:
    trace, settings, cache, options, load = setup
    plain = _tier_run(trace, settings, cache, options, load, fast=False, check=True)
    check_result(trace, plain)
    checked: list = []
    unchecked: list = []
    fast_checked = _tier_run(trace, settings, cache, options, load, fast=True, check=True,
                             path=checked)
    fast = _tier_run(trace, settings, cache, options, load, fast=True, check=False,
                     path=unchecked)
    assert_identical(plain, fast_checked)
    assert_identical(plain, fast)
    assert checked == unchecked  # the checks change nothing the fast path does
    c = plain.counters
    event("group steps" if any(g for g, _ in unchecked) else "no group step")
    for name in ("kv_offload_loads", "kv_offload_store_failures",
                 "kv_offload_deferred_lookups", "preemptions"):
        if c[name]:
            event(name)


@pytest.mark.slow  # tens of small replays, each two or three times: > 4 s
def test_tier_replays_take_group_steps_while_the_connector_works() -> None:
    """Not vacuous: under both policies and modes, on a small GPU cache (preemptions) and
    a small CPU pool (evictions), most steps are group steps while chunks are stored,
    evicted and loaded back, and the records equal the plain path's. (Before the
    connector was in the fast path's contract a tier replay took no group step.)"""
    trace = session_turns(3, 40, max_output=150, rate=20.0)
    settings = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=16)
    for policy in ("lru", "arc"):
        for async_scheduling in (False, True):
            tier = OffloadSettings(num_chunks=60, policy=policy, bytes_per_block=1 << 16,
                                   load_bytes_per_s=1e8, store_bytes_per_s=1e8)
            options = dict(kv_offload=tier, async_scheduling=async_scheduling,
                           record_steps=True)
            cache = CacheSettings(num_gpu_blocks=110)
            path: list = []
            fast = _tier_run(trace, settings, cache, options, OpenLoop(), fast=True,
                             check=True, path=path)
            plain = _tier_run(trace, settings, cache, options, OpenLoop(), fast=False,
                              check=True)
            assert_identical(plain, fast)
            c = fast.counters
            assert c["kv_offload_loads"] > 0 and c["kv_offload_stores"] > 0
            assert c["kv_offload_evicted_chunks"] > 0 and c["preemptions"] > 0
            assert sum(g for g, _ in path) > len(path) // 2, (policy, async_scheduling)


@contextmanager
def _short_steps_counted(counts: Counter) -> Iterator[None]:
    """Count the decode group's steps short of free blocks (``_run_preempting``), those
    that preempt, and the block fence's stops inside them with the members they leave
    unreached; the methods are wrapped on the class and restored after."""
    run_preempting = DecodeGroup._run_preempting
    leave_unreached = DecodeGroup._leave_unreached

    def counted_run(self, out, token_budget, plan):
        preempted = len(out.preempted)
        result = run_preempting(self, out, token_budget, plan)
        counts["short group steps"] += 1
        counts["short group steps that preempt"] += len(out.preempted) > preempted
        return result

    def counted_leave(self, stopped):
        size = self.size
        leave_unreached(self, stopped)
        counts["fence stops"] += 1
        counts["members unreached"] += size - self.size

    DecodeGroup._run_preempting = counted_run  # type: ignore[method-assign]
    DecodeGroup._leave_unreached = counted_leave  # type: ignore[method-assign]
    try:
        yield
    finally:
        DecodeGroup._run_preempting = run_preempting  # type: ignore[method-assign]
        DecodeGroup._leave_unreached = leave_unreached  # type: ignore[method-assign]


@st.composite
def fenced_setup(draw: st.DrawFn) -> tuple:
    """Async scheduling with the tier (the block fence) on GPU caches small enough that
    group steps run short of free blocks: the victim's blocks are often still in
    flight (the loop stops), sometimes free (it preempts)."""
    bs = draw(st.sampled_from([4, 16]))
    settings = SchedulerSettings(max_num_batched_tokens=draw(st.sampled_from([128, 512])),
                                 max_num_seqs=draw(st.sampled_from([8, 16, 32])))
    cache = CacheSettings(block_size=bs,
                          num_gpu_blocks=draw(st.sampled_from([1000, 1800, 3200])) // bs,
                          enable_prefix_caching=draw(st.booleans() | st.just(True)))
    bw = draw(st.sampled_from([1e10, 1e8, 2e7]))
    tier = OffloadSettings(num_chunks=draw(st.sampled_from([20, 60, 600])),
                           blocks_per_chunk=draw(st.sampled_from([1, 2])),
                           policy=draw(st.sampled_from(["lru", "arc"])),
                           bytes_per_block=1 << 16, load_bytes_per_s=bw, store_bytes_per_s=bw)
    options = dict(kv_offload=tier, async_scheduling=True, record_steps=True)
    trace = session_turns(draw(st.integers(0, 10_000)), draw(st.integers(20, 40)),
                          block_size=bs, max_output=draw(st.sampled_from([80, 150])),
                          rate=draw(st.sampled_from([20.0, 60.0])))
    load = draw(st.sampled_from([OpenLoop(), ClosedLoop(12)]))
    return trace, settings, cache, options, load


@pytest.mark.slow  # tens of small replays, each twice: > 4 s
@hyp_settings(max_examples=15, **_HYP)
@given(fenced_setup())
def test_fenced_short_group_steps_replay_identically(setup) -> None:
    """A group step short of free blocks under the block fence runs vLLM's loop: it
    preempts a victim whose blocks can be freed now and stops at one whose blocks are
    in flight (a member's last step being the latest group step), and the members it
    does not reach leave unscheduled. Any other outcome changes the records."""
    trace, settings, cache, options, load = setup
    plain = _tier_run(trace, settings, cache, options, load, fast=False, check=True)
    counts: Counter = Counter()
    with _short_steps_counted(counts):
        fast = _tier_run(trace, settings, cache, options, load, fast=True, check=True)
    assert_identical(plain, fast)
    for name in ("short group steps", "short group steps that preempt", "fence stops"):
        if counts[name]:
            event(name)


@pytest.mark.slow  # nine small replays, each twice: > 4 s
def test_fenced_short_steps_are_group_steps() -> None:
    """Not vacuous: on small GPU caches under the fence, short steps are group steps
    (before, each one dissolved the group for the plain step) that both stop at the
    fence, leaving members unreached, and preempt; the records equal the plain path's."""
    settings = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=16)
    tier = OffloadSettings(num_chunks=60, bytes_per_block=1 << 16, load_bytes_per_s=1e8,
                           store_bytes_per_s=1e8)
    options = dict(kv_offload=tier, async_scheduling=True, record_steps=True)
    counts: Counter = Counter()
    for seed in range(3):
        trace = session_turns(seed, 40, max_output=150, rate=20.0)
        for blocks in (60, 110, 200):
            cache = CacheSettings(num_gpu_blocks=blocks)
            plain = _tier_run(trace, settings, cache, options, OpenLoop(), fast=False,
                              check=True)
            with _short_steps_counted(counts):
                fast = _tier_run(trace, settings, cache, options, OpenLoop(), fast=True,
                                 check=True)
            assert_identical(plain, fast)
    assert counts["fence stops"] >= 10, counts
    assert counts["members unreached"] > counts["fence stops"], counts
    assert counts["short group steps that preempt"] >= 10, counts


def test_a_decoder_with_a_store_still_to_offer_does_not_join() -> None:
    """``next_decode_event``: a running request whose prompt chunks are not all offered
    yet (a store failed on a full, pinned pool) has connector work at its next step."""
    from tuner.sim.kv_connector.offloading import OffloadingConnector
    from tuner.sim.request import SimRequest

    conn = OffloadingConnector(OffloadSettings(num_chunks=4), block_size=16)
    req = SimRequest(request_id="a", index=0, arrival_s=0.0, num_prompt_tokens=64,
                     max_tokens=8, block_size=16, prompt_block_hashes=[1, 2, 3, 4])
    conn.on_new_request(req)
    assert conn.next_decode_event(req) == 0  # 4 prompt chunks, none offered
    conn._req["a"].next_stored = 4
    assert conn.next_decode_event(req) == NO_DECODE_EVENT


# ----------------------------------------------------------------------------- P/D
LINK = dict(bytes_per_token_rank=131072, link_latency_s=50e-6)


@st.composite
def pd_setup(draw: st.DrawFn) -> tuple:
    settings = SchedulerSettings(max_num_batched_tokens=draw(st.sampled_from([128, 512])),
                                 max_num_seqs=draw(st.sampled_from([8, 32])))
    prefill_cache = CacheSettings(num_gpu_blocks=draw(st.sampled_from([300, 1000])))
    decode_cache = CacheSettings(num_gpu_blocks=draw(st.sampled_from([120, 400, 2000])))
    shape = draw(st.sampled_from([(1, 1), (1, 2), (2, 1)]))
    pd = PDSettings(num_prefill=shape[0], num_decode=shape[1],
                    link_bytes_per_s=draw(st.sampled_from([45e9, 2e9])), **LINK,
                    variant=draw(st.sampled_from(["pull", "push"])))  # NixlPushConnector
    trace = session_turns(draw(st.integers(0, 10_000)), draw(st.integers(10, 30)),
                          max_input=500, max_output=draw(st.sampled_from([30, 100])),
                          rate=draw(st.sampled_from([10.0, 60.0])))
    return trace, settings, prefill_cache, decode_cache, pd, draw(st.booleans())


def _pd_run(setup, *, fast: bool, check: bool, path: list | None = None):
    trace, settings, prefill_cache, decode_cache, pd, async_scheduling = setup
    sim = PDSimulator(trace, PDPool(settings, prefill_cache, nonlinear_step),
                      PDPool(settings, decode_cache, nonlinear_step), pd,
                      options=SimOptions(async_scheduling=async_scheduling, record_steps=True,
                                         fast_forward=fast, check_invariants=check))
    if path is not None:
        for engine in sim.decode:
            _spied(engine.scheduler, path)
    return sim.run()


def _assert_pd_identical(a, b) -> None:
    for name in ("requests", "steps", "itl_samples", "timeseries", "simulated_s"):
        assert repr(getattr(a, name)) == repr(getattr(b, name)), name
    assert a.counters == b.counters


@pytest.mark.slow  # tens of small replays, each two or three times: > 4 s
@hyp_settings(max_examples=15, **_HYP)
@given(pd_setup())
def test_p_d_replays_identically_with_the_fast_path(setup) -> None:
    plain = _pd_run(setup, fast=False, check=True)
    checked: list = []
    unchecked: list = []
    _assert_pd_identical(plain, _pd_run(setup, fast=True, check=True, path=checked))
    _assert_pd_identical(plain, _pd_run(setup, fast=True, check=False, path=unchecked))
    assert checked == unchecked
    event("async" if setup[-1] else "sync")
    event(setup[4].variant)
    event("decoder group steps" if any(g for g, _ in unchecked) else "no group step")
    if plain.counters["preemptions"]:
        event("preempts")


@pytest.mark.slow  # tens of small replays, each two or three times: > 4 s
def test_async_p_d_decoders_take_group_steps() -> None:
    """Async P/D decoders run the fast path (they ran the plain step before), and a
    KV-tight decoder preempts while identical to the plain path."""
    trace = session_turns(4, 50, max_input=500, max_output=150, rate=30.0)
    settings = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=32)
    for blocks, variant in ((2000, "pull"), (150, "pull"), (150, "push")):
        setup = (trace, settings, CacheSettings(num_gpu_blocks=1000),
                 CacheSettings(num_gpu_blocks=blocks),
                 PDSettings(num_prefill=1, num_decode=1, link_bytes_per_s=45e9, **LINK,
                            variant=variant), True)
        path: list = []
        fast = _pd_run(setup, fast=True, check=True, path=path)
        _assert_pd_identical(_pd_run(setup, fast=False, check=True), fast)
        assert sum(g for g, _ in path) > len(path) // 2, blocks
        assert (fast.counters["preemptions"] > 0) == (blocks == 150)
