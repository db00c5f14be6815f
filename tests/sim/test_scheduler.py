"""Scheduler twin: scenarios written from spec §2-§4 and §9 (vLLM 0.33.0 + PR #54625)."""

from __future__ import annotations

import pytest

from tuner.sim.request import RequestStatus, SimRequest
from tuner.sim.scheduler import Scheduler
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

from sim_helpers import PATH

pytestmark = pytest.mark.usefixtures("both_paths")

WARM = [101, 102, 103]  # 48 tokens of one value
COLD = [201, 202, 203]  # 48 other tokens


def sched(num_blocks: int = 1000, options: SimOptions | None = None, **kw) -> Scheduler:
    kw.setdefault("max_num_batched_tokens", 8192)
    kw.setdefault("max_num_seqs", 16)
    if options is None:
        options = SimOptions(fast_forward=PATH["fast_forward"])
    elif options.fast_forward != PATH["fast_forward"]:
        options = SimOptions(prefill_interval_mode=options.prefill_interval_mode,
                             fast_forward=PATH["fast_forward"])
    return Scheduler(SchedulerSettings(**kw), CacheSettings(num_gpu_blocks=num_blocks,
                                                            block_size=16), options)


_index = iter(range(1_000_000))


def req(rid: str, input_len: int = 48, hashes=None, max_tokens: int = 1, priority: int = 0,
        arrival_s: float = 0.0) -> SimRequest:
    return SimRequest(request_id=rid, index=next(_index), arrival_s=arrival_s,
                      num_prompt_tokens=input_len, max_tokens=max_tokens, block_size=16,
                      prompt_block_hashes=hashes if hashes is not None else [],
                      priority=priority)


def step(s: Scheduler) -> dict[str, int]:
    out = s.schedule()
    scheduled = s.scheduled_tokens(out)
    s.update_from_output(out)
    s.check_invariants()
    return scheduled


def waiting_ids(s: Scheduler) -> list[str]:
    return [r.request_id for r in s.waiting]


# --------------------------------------------------------------------- PR #54625 scenario
def pr_scenario(window: int, threshold: float):
    """spec §2.3: warm0 runs and finishes (blocks cached, free queue [4,3,2,1]); then
    cold and warm (same 48 tokens as warm0) arrive, cold first, on a 5-block pool."""
    s = sched(5, cache_aware_admission_window=window,
              cache_aware_admission_threshold=threshold)
    s.add_request(req("warm0", hashes=WARM))
    assert step(s) == {"warm0": 48}
    warm = req("warm", hashes=WARM)
    cold = req("cold", hashes=COLD)
    s.add_request(cold)
    s.add_request(warm)
    probe_before = s.kv_cache_manager.get_num_cached_tokens(warm)
    return s, probe_before, step(s), step(s)


def test_pr_window_with_threshold_zero_admits_warm_first():
    s, before, first, second = pr_scenario(4, 0.0)
    assert before == 32
    assert first == {"warm": 16}  # used its 32 cached tokens
    assert second == {"cold": 48}
    assert s.prefix_cache_hits == 32


def test_pr_window_zero_admits_cold_first_and_warm_hit_shrinks():
    s, before, first, second = pr_scenario(0, 0.0)
    assert before == 32
    assert first == {"cold": 48}  # pops blocks 4, 3, 2: evicts hashes of blocks 3 and 2
    assert second == {"warm": 32}  # hit shrank 32 -> 16


def test_pr_threshold_half_reorders_nothing_because_usage_is_zero():
    s, before, first, second = pr_scenario(4, 0.5)
    assert first == {"cold": 48} and second == {"warm": 32}


# --------------------------------------------------------------------- reorder rules
def seeded(window: int, policy: str = "fcfs"):
    """A pool where prompt family WARM is cached; threshold 0 so the window is active."""
    s = sched(100, cache_aware_admission_window=window, cache_aware_admission_threshold=0.0,
              policy=policy)
    s.add_request(req("seed", hashes=WARM))
    step(s)
    return s


def test_reorder_permutes_only_peers_within_window():
    s = seeded(4)
    preempted = req("pre", hashes=COLD)
    preempted.status = RequestStatus.PREEMPTED
    for r in [req("c1", hashes=[301, 302, 303]), preempted, req("w1", hashes=WARM),
              req("c2", hashes=[401, 402, 403]), req("w2", hashes=WARM)]:
        s.waiting.add_request(r)
    s._reorder_waiting_by_cached_prefix()
    # peers at slots 0, 2, 3 (window 4): w1 moves to slot 0; "pre" keeps slot 1;
    # w2 is past the window and never moves.
    assert waiting_ids(s) == ["w1", "pre", "c1", "c2", "w2"]


def test_reorder_is_stable_and_leaves_sorted_queue_alone():
    s = seeded(8)
    for rid in ("w1", "w2"):
        s.waiting.add_request(req(rid, hashes=WARM))
    s.waiting.add_request(req("c1", hashes=COLD))
    s._reorder_waiting_by_cached_prefix()
    assert waiting_ids(s) == ["w1", "w2", "c1"]


def test_reorder_skipped_below_threshold():
    s = sched(100, cache_aware_admission_window=4, cache_aware_admission_threshold=0.5)
    s.add_request(req("c1", hashes=COLD))
    s.add_request(req("w1", hashes=WARM))
    s._reorder_waiting_by_cached_prefix()
    assert waiting_ids(s) == ["c1", "w1"]


def test_priority_policy_and_no_prefix_caching_disable_the_window():
    assert seeded(4, policy="priority").cache_aware_window == 0
    s = Scheduler(SchedulerSettings(cache_aware_admission_window=4),
                  CacheSettings(enable_prefix_caching=False))
    assert s.cache_aware_window == 0


def test_no_reorder_on_a_step_that_preempted():
    # 4 usable blocks; "a" (32 tokens + long output) and "b" (32) run. When a needs a
    # third block, b is preempted: on that step warm/cold must not be reordered.
    s = sched(5, cache_aware_admission_window=4, cache_aware_admission_threshold=0.0)
    s.add_request(req("a", 32, [1, 2], max_tokens=40))
    s.add_request(req("b", 32, [3, 4], max_tokens=40))
    step(s)
    s.add_request(req("c1", hashes=[301, 302, 303]))
    s.add_request(req("w1", 32, [1, 2]))
    out = s.schedule()
    assert [r.request_id for r in out.preempted] == ["b"]
    assert waiting_ids(s) == ["b", "c1", "w1"]


# --------------------------------------------------------------------- budgets & admission
def test_token_budget_chunks_prefill_and_running_goes_first():
    s = sched(100, max_num_batched_tokens=64, max_num_seqs=4)
    s.add_request(req("a", 100, max_tokens=3))
    assert step(s) == {"a": 64}
    s.add_request(req("b", 40))
    assert step(s) == {"a": 36, "b": 28}
    assert step(s) == {"a": 1, "b": 12}


def test_chunked_prefill_disabled_breaks_when_prompt_does_not_fit():
    s = sched(100, max_num_batched_tokens=64, max_num_seqs=4, enable_chunked_prefill=False)
    s.add_request(req("a", 40, max_tokens=5))
    s.add_request(req("b", 40))
    assert step(s) == {"a": 40}
    assert step(s) == {"a": 1, "b": 40}


def test_long_prefill_threshold_only_with_more_than_one_request():
    s = sched(100, long_prefill_token_threshold=16)
    s.add_request(req("a", 48))
    assert step(s) == {"a": 48}  # alone: no cap
    s.add_request(req("b", 48, max_tokens=2))
    s.add_request(req("c", 48))
    assert step(s) == {"b": 16, "c": 16}


def test_max_num_seqs_caps_running():
    s = sched(100, max_num_seqs=2, max_num_batched_tokens=1000)
    for rid in "abc":
        s.add_request(req(rid, 16, max_tokens=3))
    assert step(s) == {"a": 16, "b": 16}
    assert step(s) == {"a": 1, "b": 1}


def test_head_of_line_blocking():
    s = sched(5)  # 4 usable blocks
    s.add_request(req("big", 48, max_tokens=3))
    s.add_request(req("huge", 64))
    s.add_request(req("small", 16))
    assert step(s) == {"big": 48}
    # huge cannot fit while big holds 3 blocks; small (1 block) could, but stays behind.
    assert step(s) == {"big": 1}
    assert waiting_ids(s) == ["huge", "small"]


# --------------------------------------------------------------------- preemption
def test_preemption_recomputes_and_self_hits():
    # 4 usable blocks. a and b: 32-token prompts. When a needs its 3rd block, b (last
    # admitted) is preempted: its blocks go back cached, a's new block evicts one of
    # them. After a finishes, b recomputes prompt + its output token and hits its own
    # first prompt block.
    s = sched(5)
    a = req("a", 32, [1, 2], max_tokens=2)
    b = req("b", 32, [3, 4], max_tokens=5)
    s.add_request(a)
    s.add_request(b)
    assert step(s) == {"a": 32, "b": 32}
    out = s.schedule()
    assert [r.request_id for r in out.preempted] == ["b"]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert b.num_output_tokens == 1 and b.num_preemptions == 1
    assert s.scheduled_tokens(out) == {"a": 1}  # no admission
    assert waiting_ids(s) == ["b"]
    s.update_from_output(out)
    s.check_invariants()
    assert a.status == RequestStatus.FINISHED
    queries, hits = s.prefix_cache_queries, s.prefix_cache_hits
    out = s.schedule()
    assert [(r.request_id, hit) for r, hit in out.admitted] == [("b", 16)]
    assert s.scheduled_tokens(out) == {"b": 33 - 16}  # prompt + output
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (queries, hits)  # not counted
    s.update_from_output(out)
    while s.has_requests():
        step(s)
    assert b.num_output_tokens == 5 and b.num_preemptions == 1


def test_preempted_request_resumes_from_its_own_cached_blocks():
    s = sched(6)  # 5 usable
    a = req("a", 48, [1, 2, 3], max_tokens=30)
    b = req("b", 32, [4, 5], max_tokens=30)
    s.add_request(a)
    s.add_request(b)
    step(s)  # a: blocks 1-3, b: blocks 4-5; 0 free
    out = s.schedule()  # a needs block 4 -> preempt b (blocks 5, 4 freed: cached)
    assert [r.request_id for r in out.preempted] == ["b"]
    s.update_from_output(out)
    # free queue: [4] (block 5 popped by a). b's first prompt block (hash 4) is cached.
    assert s.kv_cache_manager.get_num_cached_tokens(b) == 16
    assert b.num_tokens == 33


def test_priority_preempts_lowest_priority_and_returns_its_budget():
    s = sched(5, policy="priority")
    hi = req("hi", 32, [1, 2], max_tokens=20, priority=0, arrival_s=1.0)
    lo = req("lo", 32, [3, 4], max_tokens=20, priority=5, arrival_s=0.0)
    s.add_request(lo)
    s.add_request(hi)
    assert step(s) == {"lo": 32, "hi": 32}  # lo arrived first? no: heap by priority
    out = s.schedule()
    assert [r.request_id for r in out.preempted] == ["lo"]
    assert s.scheduled_tokens(out) == {"hi": 1}


def test_priority_queue_orders_by_priority_then_arrival_then_id():
    s = sched(100, policy="priority", max_num_seqs=1, max_num_batched_tokens=100)
    for rid, prio, t in [("x", 1, 0.0), ("b", 0, 2.0), ("a", 0, 2.0), ("c", 0, 1.0)]:
        s.add_request(req(rid, 16, priority=prio, arrival_s=t))
    order = []
    while s.has_requests():
        order.extend(step(s))
    assert order == ["c", "a", "b", "x"]


# --------------------------------------------------------------------- model output
def test_no_token_while_prefill_is_partial():
    s = sched(100, max_num_batched_tokens=32, max_num_seqs=4)
    a = req("a", 48, max_tokens=2)
    s.add_request(a)
    step(s)
    assert a.num_output_tokens == 0 and a.is_prefill_chunk
    step(s)
    assert a.num_output_tokens == 1 and not a.is_prefill_chunk
    step(s)
    assert a.status == RequestStatus.FINISHED and a.blocks == []


def test_finished_blocks_are_freed_in_reverse_and_stay_cached():
    s = sched(5)
    s.add_request(req("a", 48, WARM))
    step(s)
    free = s.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()
    assert free == [4, 3, 2, 1]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_invariants_hold_under_a_tiny_pool(policy):
    s = sched(8, policy=policy, max_num_batched_tokens=64, max_num_seqs=6)
    reqs = [req(f"r{i}", 20 + 7 * i, [i * 10 + j for j in range((20 + 7 * i) // 16)],
                max_tokens=10 + i, priority=i % 3) for i in range(8)]
    for r in reqs:
        s.add_request(r)
    for _ in range(2000):
        if not s.has_requests():
            break
        out = s.schedule()
        assert out.total_num_scheduled_tokens <= 64
        s.update_from_output(out)
        s.check_invariants()
    assert all(r.num_output_tokens == r.max_tokens for r in reqs)
    assert s.num_preemptions > 0
