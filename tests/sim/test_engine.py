"""Simulator event loop: clock, load modes, records, rejection."""

from __future__ import annotations

import math

import pytest

from tuner.sim.engine import Simulator
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

from sim_helpers import Req, check_result, prompt_hashes, random_trace, replay


def const(batch) -> float:
    return 0.5


def test_clock_first_token_at_step_end_and_jump_to_next_arrival():
    reqs = [Req("a", 1.0, 32, 3, prompt_hashes(1, 32)), Req("b", 10.0, 32, 1, prompt_hashes(2, 32))]
    sim = Simulator(reqs, SchedulerSettings(), CacheSettings(num_gpu_blocks=100), const,
                    options=SimOptions(check_invariants=True, fast_forward=False))
    res = sim.run()
    a, b = res.requests
    assert (a.arrival_s, a.first_scheduled_s, a.first_token_s, a.finish_s) == (1.0, 1.0, 1.5, 2.5)
    assert (b.first_scheduled_s, b.first_token_s, b.finish_s) == (10.0, 10.5, 10.5)
    assert res.itl_samples == [(0.5, 1), (0.5, 1)]
    assert res.counters["num_steps"] == 4
    assert res.simulated_s == pytest.approx(9.5)
    assert a.ttft_s == 0.5 and a.mean_itl_s == 0.5


def test_arrival_during_a_step_waits_for_the_next_step():
    reqs = [Req("a", 0.0, 16, 2, []), Req("b", 0.2, 16, 1, [])]
    res = Simulator(reqs, SchedulerSettings(), CacheSettings(num_gpu_blocks=100), const,
                    options=SimOptions(fast_forward=False)).run()
    assert res.requests[1].first_scheduled_s == 0.5


def test_open_loop_speedup_scales_arrivals():
    reqs = [Req("a", 4.0, 16, 1, [])]
    res = Simulator(reqs, SchedulerSettings(), CacheSettings(num_gpu_blocks=100), const,
                    load=OpenLoop(speedup=2.0)).run()
    assert res.requests[0].arrival_s == 2.0


def test_closed_loop_keeps_concurrency_in_flight():
    reqs = [Req(f"r{i}", 100.0 * i, 16, 2, []) for i in range(5)]
    res = Simulator(reqs, SchedulerSettings(), CacheSettings(num_gpu_blocks=100), const,
                    load=ClosedLoop(concurrency=2),
                    options=SimOptions(record_steps=True, fast_forward=False)).run()
    arrivals = [r.arrival_s for r in res.requests]
    assert arrivals == [0.0, 0.0, 1.0, 1.0, 2.0]
    assert max(s.num_running + s.num_waiting for s in res.steps) == 2


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("misses", [True, False])
def test_closed_loop_replacement_waits_out_one_step(async_scheduling, misses):
    """A closed loop of 2 on a tiny trace (request 0 decodes throughout, 1-4 are short):
    every replacement is sent when its predecessor finished and first scheduled exactly
    one step (0.5 s) later, synchronous or async (vLLM's engine core scheduled that step
    before the client's new request existed, docs/step-time-model.md §1.4); the first 2
    are scheduled at once. ``replacement_misses_step=False`` (the benchmark fit's
    recording) schedules it at once."""
    reqs = [Req("r0", 0.0, 16, 14, [])] + [Req(f"r{i}", 0.0, 16, 3, []) for i in range(1, 5)]
    res = Simulator(reqs, SchedulerSettings(), CacheSettings(num_gpu_blocks=100), const,
                    load=ClosedLoop(2, replacement_misses_step=misses),
                    options=SimOptions(async_scheduling=async_scheduling,
                                       check_invariants=True, fast_forward=False)).run()
    rows = list(res.requests)
    assert all(r.status == "finished" for r in rows)
    assert [(r.arrival_s, r.first_scheduled_s) for r in rows[:2]] == [(0.0, 0.0)] * 2
    finishes = {r.finish_s for r in rows}
    for r in rows[2:]:
        assert r.arrival_s in finishes  # sent when its predecessor finished
        assert r.arrival_s < rows[0].finish_s  # request 0 still running: the engine is busy
        assert r.first_scheduled_s == r.arrival_s + (0.5 if misses else 0.0)


def test_closed_loop_replacement_reaches_an_idle_engine_at_once():
    """Concurrency 1: the engine has nothing left when the request finishes, so vLLM's
    engine core blocks on its input queue and schedules the replacement as it comes."""
    reqs = [Req(f"r{i}", 0.0, 16, 3, []) for i in range(3)]
    for async_scheduling in (False, True):
        res = Simulator(reqs, SchedulerSettings(), CacheSettings(num_gpu_blocks=100), const,
                        load=ClosedLoop(1), options=SimOptions(
                            async_scheduling=async_scheduling, fast_forward=False)).run()
        rows = list(res.requests)
        assert [r.first_scheduled_s for r in rows] == [r.arrival_s for r in rows]
        assert [r.arrival_s for r in rows[1:]] == [r.finish_s for r in rows[:-1]]


def test_rejects_requests_that_can_never_fit():
    reqs = [Req("ok", 0.0, 32, 2, []), Req("too_big", 0.0, 200, 2, []),
            Req("too_long", 0.0, 32, 2000, []), Req("empty", 0.0, 0, 2, [])]
    sim, res = replay(reqs, cache=CacheSettings(num_gpu_blocks=9, max_model_len=1024))
    assert [r.status for r in res.requests] == ["finished", "rejected", "rejected", "rejected"]
    assert res.counters["rejected"] == 3
    assert math.isnan(res.requests[1].first_token_s)


def test_counters_match_vllm_prefix_cache_stats():
    reqs = [Req("a", 0.0, 48, 1, [1, 2, 3]), Req("b", 5.0, 48, 1, [1, 2, 3]),
            Req("c", 10.0, 40, 1, [1, 9])]
    _, res = replay(reqs, cache=CacheSettings(num_gpu_blocks=100))
    assert res.counters["prefix_cache_queries"] == 48 + 48 + 40
    assert res.counters["prefix_cache_hits"] == 0 + 32 + 16
    assert [r.num_cached_tokens for r in res.requests] == [0, 32, 16]


def test_step_records_and_timeseries():
    reqs = [Req("a", 0.0, 40, 3, prompt_hashes(1, 40)), Req("b", 0.0, 20, 2, [])]
    _, res = replay(reqs, SchedulerSettings(max_num_batched_tokens=32, max_num_seqs=4),
                    CacheSettings(num_gpu_blocks=100), record_steps=True)
    first = res.steps[0]
    assert first.num_scheduled_tokens == {"a": 32}
    assert first.cached_tokens == {"a": 0}
    assert (first.num_running, first.num_waiting) == (1, 1)
    assert res.steps[1].num_scheduled_tokens == {"a": 8, "b": 20}
    assert len(res.timeseries["t_s"]) == res.counters["num_steps"] == len(res.steps)
    assert res.timeseries["num_scheduled_tokens"][:2] == [32, 28]
    # the whole prompt must fit, but only the first chunk gets blocks (as vLLM)
    assert res.timeseries["kv_usage"][0] == pytest.approx(2 / 99)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_random_traces_finish_with_exact_lengths_and_invariants(seed, policy):
    reqs = random_trace(seed, 60, with_output_hashes=True)
    settings = SchedulerSettings(max_num_batched_tokens=128, max_num_seqs=8, policy=policy,
                                 long_prefill_token_threshold=48 if seed % 2 else 0,
                                 cache_aware_admission_window=4 if seed % 3 else 0,
                                 cache_aware_admission_threshold=0.3,
                                 prefill_schedule_interval=1 + seed % 4, watermark=0.02 * seed)
    _, res = replay(reqs, settings, CacheSettings(num_gpu_blocks=40), fast_forward=False)
    check_result(reqs, res)
    assert res.counters["num_finished"] + res.counters["rejected"] == 60


def test_without_chunked_prefill_a_sequence_beyond_the_budget_is_rejected():
    reqs = [Req("fits", 0.0, 60, 5, []), Req("never", 0.0, 100, 5, [])]
    _, res = replay(reqs, SchedulerSettings(max_num_batched_tokens=64, max_num_seqs=4,
                                            enable_chunked_prefill=False),
                    CacheSettings(num_gpu_blocks=100))
    assert [r.status for r in res.requests] == ["finished", "rejected"]
