"""The admission fast path of a connector that never loads (``tuner.sim.fast_path`` item 6):
a P/D prefill instance admits through the scheduler's plain waiting loop
(``NixlPrefillConnector.plain_admission``) and decides exactly what the connector's
loop (``tuner.sim.kv_connector.admission``) decides: the same records, counters and
time series, and the same admissions at every prefill step, over generated P/D setups
(pull and push, sync and async, prefill caches tight enough to block the head of the
queue); and the examples are not vacuous (both loops run where they should, and the
plain loop's memoised blocked-head check proves heads blocked).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import pytest
from hypothesis import HealthCheck, event, given, settings as hyp_settings, strategies as st

from sim_helpers import nonlinear_step
from test_fast_path_connectors import LINK, session_turns
from tuner.sim.disagg import PDSettings
from tuner.sim.disagg.nixl import NixlDecodeConnector, NixlPrefillConnector
from tuner.sim.disagg.nixl_push import NixlPushDecodeConnector, NixlPushPrefillConnector
from tuner.sim.disagg.simulator import PDPool, PDSimulator
from tuner.sim.kv_connector import admission
from tuner.sim.kv_connector.offloading import OffloadingConnector
from tuner.sim.scheduler import Scheduler
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

_HYP = dict(deadline=None, derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def pd_setup(draw: st.DrawFn) -> tuple:
    settings = SchedulerSettings(
        max_num_batched_tokens=draw(st.sampled_from([64, 128, 512])),
        max_num_seqs=draw(st.sampled_from([4, 8, 32])),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 48])),
        cache_aware_admission_window=draw(st.sampled_from([0, 0, 4])))
    # 100 blocks: a few 500-token prompts fill it, so heads block and held blocks bind
    prefill_cache = CacheSettings(num_gpu_blocks=draw(st.sampled_from([100, 300, 1000])),
                                  enable_prefix_caching=draw(st.booleans() | st.just(True)))
    decode_cache = CacheSettings(num_gpu_blocks=draw(st.sampled_from([150, 2000])))
    shape = draw(st.sampled_from([(1, 1), (1, 2), (2, 1)]))
    pd = PDSettings(num_prefill=shape[0], num_decode=shape[1],
                    link_bytes_per_s=draw(st.sampled_from([45e9, 2e9])), **LINK,
                    variant=draw(st.sampled_from(["pull", "push"])))
    trace = session_turns(draw(st.integers(0, 10_000)), draw(st.integers(8, 25)),
                          max_input=500, max_output=draw(st.sampled_from([20, 80])),
                          rate=draw(st.sampled_from([10.0, 80.0])))
    return (trace, settings, prefill_cache, decode_cache, pd, draw(st.booleans()),
            draw(st.booleans()))


@contextmanager
def _declared(on: bool) -> Iterator[None]:
    """The prefill connectors' declaration, on or off (off: the connector's loop)."""
    saved = NixlPrefillConnector.plain_admission
    NixlPrefillConnector.plain_admission = on
    try:
        yield
    finally:
        NixlPrefillConnector.plain_admission = saved


def _run(setup, *, plain: bool) -> tuple:
    """One replay; returns it with every prefill schedule's admissions and the counts
    of each waiting loop's calls."""
    trace, settings, prefill_cache, decode_cache, pd, async_scheduling, fast = setup
    calls = {"plain": 0, "connector": 0, "surely_blocked": 0}
    schedules: list = []
    with _declared(plain), _counted_connector_loop(calls):
        sim = PDSimulator(trace, PDPool(settings, prefill_cache, nonlinear_step),
                          PDPool(settings, decode_cache, nonlinear_step), pd,
                          options=SimOptions(async_scheduling=async_scheduling,
                                             record_steps=True, fast_forward=fast,
                                             check_invariants=True))
        for position, engine in enumerate(sim.prefill):
            _spy(engine.scheduler, position, schedules, calls)
        result = sim.run()
    return result, schedules, calls


@contextmanager
def _counted_connector_loop(calls: dict) -> Iterator[None]:
    """Count the connector loop's calls on prefill schedulers (``calls["connector"]``)."""
    import tuner.sim.scheduler as scheduler_module

    loop = admission.schedule_waiting_with_connector

    def counting(scheduler, *args):
        calls["connector"] += isinstance(scheduler.connector, NixlPrefillConnector)
        return loop(scheduler, *args)

    scheduler_module.schedule_waiting_with_connector = counting
    try:
        yield
    finally:
        scheduler_module.schedule_waiting_with_connector = loop


def _spy(scheduler: Scheduler, position: int, schedules: list, calls: dict) -> None:
    schedule, plain = scheduler.schedule, scheduler._schedule_waiting
    blocked = scheduler._surely_blocked

    def spied_schedule():
        out = schedule()
        schedules.append((position, [(r.request_id, n) for r, n in out.individual],
                          [(r.request_id, hit) for r, hit in out.admitted],
                          out.total_num_scheduled_tokens, len(scheduler.waiting),
                          len(scheduler.deferred_waiting)))
        return out

    def spied_plain(*args):
        calls["plain"] += 1
        return plain(*args)

    def spied_blocked(*args):
        proven = blocked(*args)
        calls["surely_blocked"] += proven
        return proven

    scheduler.schedule = spied_schedule  # type: ignore[method-assign]
    scheduler._schedule_waiting = spied_plain  # type: ignore[method-assign]
    scheduler._surely_blocked = spied_blocked  # type: ignore[method-assign]


def _assert_identical(a, b) -> None:
    for name in ("requests", "steps", "itl_samples", "timeseries", "simulated_s"):
        assert repr(getattr(a, name)) == repr(getattr(b, name)), name
    assert a.counters == b.counters


@pytest.mark.slow  # tens of small P/D replays, each twice: > 4 s
@hyp_settings(max_examples=12, **_HYP)
@given(pd_setup())
def test_plain_admission_decides_as_the_connector_loop_generated(setup) -> None:
    connector_result, connector_schedules, connector_calls = _run(setup, plain=False)
    plain_result, plain_schedules, plain_calls = _run(setup, plain=True)
    _assert_identical(connector_result, plain_result)
    assert connector_schedules == plain_schedules
    # each replay ran the loop it was meant to on its prefill engines
    assert connector_calls["plain"] == 0 and connector_calls["connector"] > 0
    assert plain_calls["connector"] == 0 and plain_calls["plain"] > 0
    event(setup[4].variant)
    event("async" if setup[5] else "sync")
    if plain_calls["surely_blocked"]:
        event("a blocked head proven from its memo")
    if plain_result.counters.get("preemptions"):
        event("preempts")


@pytest.mark.slow  # a few small P/D replays, each twice
def test_a_tight_prefill_cache_blocks_heads_on_both_paths() -> None:
    """Not vacuous: with a prefill cache of 70 blocks and 500-token prompts the head
    blocks, the plain loop proves it from the memo, and the records still match."""
    trace = session_turns(3, 40, max_input=500, max_output=30, rate=80.0)
    settings = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=32)
    for variant in ("pull", "push"):
        for async_scheduling in (False, True):
            setup = (trace, settings, CacheSettings(num_gpu_blocks=70),
                     CacheSettings(num_gpu_blocks=2000),
                     PDSettings(num_prefill=1, num_decode=1, link_bytes_per_s=2e9, **LINK,
                                variant=variant), async_scheduling, True)
            plain, plain_schedules, calls = _run(setup, plain=True)
            connector, connector_schedules, _ = _run(setup, plain=False)
            _assert_identical(connector, plain)
            assert plain_schedules == connector_schedules
            assert calls["surely_blocked"] > 0, (variant, async_scheduling)


def test_only_connectors_that_never_load_declare_plain_admission() -> None:
    """The declaration is the prefill side's alone: the decoders and the CPU tier load."""
    assert NixlPrefillConnector.plain_admission is True
    assert NixlPushPrefillConnector.plain_admission is True
    for cls in (NixlDecodeConnector, NixlPushDecodeConnector, OffloadingConnector):
        assert getattr(cls, "plain_admission", False) is False, cls


def test_the_prefill_connector_has_nothing_for_any_request() -> None:
    """What the declaration states: ``(0, False)`` whatever the request and its local
    hit, and no lookup counted."""
    from tuner.sim.block_pool import BlockPool
    from tuner.sim.request import SimRequest

    connector = NixlPrefillConnector(BlockPool(64, enable_caching=True))
    for n, hit in ((1, 0), (17, 16), (500, 0), (500, 496)):
        request = SimRequest(request_id=f"r{n}-{hit}", index=0, arrival_s=0.0,
                             num_prompt_tokens=n, max_tokens=1, block_size=16)
        connector.on_new_request(request)
        assert connector.get_num_new_matched_tokens(request, hit) == (0, False)
        assert connector.local_hit(request) == 0
