"""Differential test: the decode-group fast path (``SimOptions.fast_forward``) must give
byte-identical results to the plain step, on randomized traces and settings."""

from __future__ import annotations

import pytest

from tuner.sim.engine import Simulator
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

from sim_helpers import assert_identical, check_result, nonlinear_step as step_time, random_trace


def run(reqs, settings, cache, fast: bool, load=OpenLoop(), mode: str = "local",
        check: bool = True):
    """``check``: check invariants after every step (they must not change the path
    taken; the differential tests run the fast path both ways)."""
    options = SimOptions(fast_forward=fast, record_steps=True, check_invariants=check,
                         prefill_interval_mode=mode)
    return Simulator(reqs, settings, cache, step_time, options=options, load=load).run()


CASES = {
    # name: (scheduler settings, num_gpu_blocks, block_size)
    "roomy": (SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=32), 2000, 16),
    "tiny_pool_preempts": (SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=16), 40, 16),
    "window": (SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=16,
                                 cache_aware_admission_window=8,
                                 cache_aware_admission_threshold=0.3), 60, 16),
    "window_thr0_tiny": (SchedulerSettings(max_num_batched_tokens=128, max_num_seqs=12,
                                           cache_aware_admission_window=4,
                                           cache_aware_admission_threshold=0.0), 30, 16),
    "interval4": (SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=16,
                                    prefill_schedule_interval=4), 200, 16),
    "interval4_window_tiny": (SchedulerSettings(max_num_batched_tokens=128, max_num_seqs=16,
                                                prefill_schedule_interval=4,
                                                cache_aware_admission_window=4,
                                                cache_aware_admission_threshold=0.2), 35, 16),
    "priority_tiny": (SchedulerSettings(max_num_batched_tokens=200, max_num_seqs=10,
                                        policy="priority"), 35, 16),
    "threshold_watermark": (SchedulerSettings(max_num_batched_tokens=300, max_num_seqs=20,
                                              long_prefill_token_threshold=64,
                                              watermark=0.05), 80, 16),
    "no_chunking": (SchedulerSettings(max_num_batched_tokens=400, max_num_seqs=20,
                                      enable_chunked_prefill=False), 100, 16),
    "budget_starved": (SchedulerSettings(max_num_batched_tokens=24, max_num_seqs=24), 500, 16),
    "block_size_4": (SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=16), 200, 4),
    "block_size_1": (SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=16), 600, 1),
}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("case", sorted(CASES))
def test_fast_path_is_identical(case, seed):
    settings, num_blocks, bs = CASES[case]
    max_input = 300 if bs > 1 else 60
    reqs = random_trace(seed, 50, block_size=bs, max_input=max_input, max_output=80,
                        with_output_hashes=True, rate=30.0)
    cache = CacheSettings(num_gpu_blocks=num_blocks, block_size=bs)
    slow = run(reqs, settings, cache, False)
    fast = run(reqs, settings, cache, True)
    check_result(reqs, slow)
    assert_identical(slow, fast)
    assert_identical(slow, run(reqs, settings, cache, True, check=False))
    if case.endswith("preempts") or case.endswith("tiny"):
        assert slow.counters["preemptions"] > 0  # the case exercises preemption


@pytest.mark.parametrize("seed", range(2))
def test_fast_path_identical_closed_loop_dp_and_no_caching(seed):
    reqs = random_trace(seed + 10, 40, with_output_hashes=True)
    settings = SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=16,
                                 prefill_schedule_interval=3)
    for cache in (CacheSettings(num_gpu_blocks=60, block_size=16),
                  CacheSettings(num_gpu_blocks=60, block_size=16, enable_prefix_caching=False)):
        for load, mode in ((ClosedLoop(6), "local"), (OpenLoop(2.0), "dp")):
            slow = run(reqs, settings, cache, False, load, mode)
            fast = run(reqs, settings, cache, True, load, mode)
            assert_identical(slow, fast)
            assert_identical(slow, run(reqs, settings, cache, True, load, mode, check=False))


def test_long_decode_stretch_uses_group_steps():
    """Few long decoders: most steps must be group steps, and still identical."""
    reqs = random_trace(3, 12, max_input=64, max_output=400, rate=100.0)
    settings = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=16)
    cache = CacheSettings(num_gpu_blocks=1000)
    slow = run(reqs, settings, cache, False)
    options = SimOptions(fast_forward=True, record_steps=True)
    sim = Simulator(reqs, settings, cache, step_time, options=options)
    lazy_steps = []
    original = sim.scheduler.schedule

    def spy():
        out = original()
        lazy_steps.append(out.group is not None)
        return out

    sim.scheduler.schedule = spy  # type: ignore[method-assign]
    fast = sim.run()
    assert_identical(slow, fast)
    assert sum(lazy_steps) > 0.8 * len(lazy_steps)


@pytest.mark.parametrize("with_output_hashes", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_group_steps_preempt_without_dissolving(seed, with_output_hashes):
    """fcfs out of blocks: the group step itself preempts from the tail (no plain step
    over every decoder), and generated blocks with synthetic ids, registered late by the
    group, are in the cache when the preempted request comes back. Same as plain."""
    reqs = random_trace(seed + 20, 60, max_input=200, max_output=120,
                        with_output_hashes=with_output_hashes, rate=40.0)
    settings = SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=24)
    cache = CacheSettings(num_gpu_blocks=45, block_size=16)
    slow = run(reqs, settings, cache, False)
    sim = Simulator(reqs, settings, cache, step_time,
                    options=SimOptions(fast_forward=True, record_steps=True))
    preempting_group_steps = []
    original = sim.scheduler.schedule

    def spy():
        out = original()
        preempting_group_steps.append(out.group is not None and bool(out.preempted))
        return out

    sim.scheduler.schedule = spy  # type: ignore[method-assign]
    fast = sim.run()
    check_result(reqs, slow)
    assert_identical(slow, fast)
    assert_identical(slow, run(reqs, settings, cache, True))  # invariants on every step
    assert slow.counters["preemptions"] > 0
    assert any(preempting_group_steps)


def test_budget_spent_before_the_last_member_is_a_plain_step():
    """The plan's last-member guard: a prefill chunk between two members takes the whole
    budget left (A 1 + P 15 of 16), so vLLM's running loop stops before member B. B got
    in behind P during a deferred step (prefill_schedule_interval 2) with a full prefix hit,
    which needs no prefill. The fast path must see that B gets nothing and step aside."""
    from itertools import count

    from tuner.sim.request import SimRequest
    from tuner.sim.scheduler import Scheduler

    index = count()

    def req(rid, n, hashes=(), max_tokens=1):
        return SimRequest(request_id=rid, index=next(index), arrival_s=0.0,
                          num_prompt_tokens=n, max_tokens=max_tokens, block_size=16,
                          prompt_block_hashes=list(hashes))

    def scenario(fast: bool):
        s = Scheduler(SchedulerSettings(max_num_batched_tokens=16, max_num_seqs=8,
                                        prefill_schedule_interval=2),
                      CacheSettings(num_gpu_blocks=1000, block_size=16),
                      SimOptions(fast_forward=fast))
        log = []

        def steps(n):
            for _ in range(n):
                out = s.schedule()
                log.append((s.scheduled_tokens(out), out.group is not None))
                s.update_from_output(out, float(len(log)))
                s.check_invariants()

        s.add_request(req("W", 49, [1, 2, 3]))  # caches the 3 blocks B will hit
        steps(4)
        s.add_request(req("A", 4, max_tokens=100))
        steps(2)
        s.add_request(req("P", 300, max_tokens=3))
        steps(3)
        s.add_request(req("B", 49, [1, 2, 3], max_tokens=20))
        steps(6)
        return s, log

    plain, plain_log = scenario(False)
    fast, fast_log = scenario(True)
    assert [sched for sched, _ in fast_log] == [sched for sched, _ in plain_log]
    assert [r.request_id for r in fast.running] == ["A", "P", "B"]
    assert fast.group is not None and fast.group.size == 2  # A and B are members
    budget_spent = [group for sched, group in fast_log if sched == {"A": 1, "P": 15}]
    assert budget_spent[-1] is False  # with B behind P: the plain step
    assert any(group for sched, group in fast_log if sched == {"A": 1, "B": 1})


def test_request_reaching_max_model_len_never_joins():
    """A request whose sequence can reach ``max_model_len`` (the engine rejects those, a
    direct scheduler user may not) is capped by the running loop at ``max_model_len - 1``
    computed tokens and then skipped; as a group member it would get tokens past the cap.
    So it stays outside the group and both paths schedule the same."""
    from tuner.sim.request import SimRequest
    from tuner.sim.scheduler import Scheduler

    def scenario(fast: bool):
        s = Scheduler(SchedulerSettings(max_num_batched_tokens=64, max_num_seqs=4),
                      CacheSettings(num_gpu_blocks=100, block_size=16, max_model_len=40),
                      SimOptions(fast_forward=fast))
        for i, (prompt, out) in enumerate(((30, 20), (4, 30))):  # 30 + 20 > 40
            s.add_request(SimRequest(request_id=f"r{i}", index=i, arrival_s=0.0,
                                     num_prompt_tokens=prompt, max_tokens=out, block_size=16))
        log = []
        for step in range(25):
            out = s.schedule()
            log.append(s.scheduled_tokens(out))
            s.update_from_output(out, float(step))
            s.check_invariants()
        return s, log

    plain, plain_log = scenario(False)
    fast, fast_log = scenario(True)
    assert fast_log == plain_log
    assert plain_log[-1] == {"r1": 1}  # r0 sits at the cap: computed 39 of 40 tokens
    assert fast.group is not None and [r.request_id for r in fast.running if r.steady] == ["r1"]
