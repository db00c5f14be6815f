"""Async scheduling (vLLM 0.33.0 ``AsyncScheduler`` under ``step_with_batch_queue``):
hand-computed cases, each against the same case in sync mode where the two differ.

Order of calls in async mode: schedule(N+1) runs before update(N) (batch queue depth 2),
so tokens of step N arrive after step N+1 was planned. Every case runs on the plain path
and on the fast path (``both_paths``), with the invariants checked after each update.
"""

from __future__ import annotations

from collections import deque

import pytest

from tuner.sim.load import ClosedLoop
from tuner.sim.request import RequestStatus, SimRequest
from tuner.sim.scheduler import Scheduler
from tuner.sim.scheduler_output import SchedulerOutput
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

from sim_helpers import PATH, Req, replay

pytestmark = pytest.mark.usefixtures("both_paths")

BS = 4  # tokens per block in the scheduler-level cases


def sched(num_gpu_blocks: int = 100, *, async_scheduling: bool = True,
          **kw) -> Scheduler:
    kw.setdefault("max_num_batched_tokens", 64)
    kw.setdefault("max_num_seqs", 8)
    return Scheduler(SchedulerSettings(**kw),
                     CacheSettings(block_size=BS, num_gpu_blocks=num_gpu_blocks),
                     SimOptions(async_scheduling=async_scheduling,
                                fast_forward=PATH["fast_forward"]), num_hash_ids=64)


_index = iter(range(1_000_000))


def req(rid: str, prompt: int, max_tokens: int, hashes=(), output_hashes=None,
        priority: int = 0, arrival_s: float = 0.0) -> SimRequest:
    return SimRequest(request_id=rid, index=next(_index), arrival_s=arrival_s,
                      num_prompt_tokens=prompt, max_tokens=max_tokens, block_size=BS,
                      prompt_block_hashes=list(hashes), output_block_hashes=output_hashes,
                      priority=priority)


class Driver:
    """Runs a scheduler as vLLM's engine does: ``step()`` schedules the next batch and,
    once two are queued (async) or at once (sync), applies the oldest, at time = its
    step index + 1. ``steps`` keeps each step's scheduled tokens, read at schedule time."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler
        self.depth = 2 if scheduler.async_scheduling else 1
        self.queue: deque[tuple[int, SchedulerOutput]] = deque()
        self.steps: list[dict[str, int]] = []
        self.finished: list[tuple[int, str]] = []  # (step applied, request id)
        self.hits: dict[str, int] = {}  # request id -> local prefix hit at admission

    def schedule(self) -> SchedulerOutput:
        out = self.s.schedule()
        self.steps.append(self.s.scheduled_tokens(out))
        self.hits.update((r.request_id, hit) for r, hit in out.admitted)
        self.queue.append((len(self.steps) - 1, out))
        return out

    def update(self) -> list[SimRequest]:
        index, out = self.queue.popleft()
        done = self.s.update_from_output(out, float(index + 1))
        self.s.check_invariants()
        self.finished += [(index, r.request_id) for r in done]
        return done

    def step(self) -> SchedulerOutput:
        while len(self.queue) >= self.depth:  # a full queue is drained before scheduling
            self.update()
        out = self.schedule()
        if len(self.queue) == self.depth:
            self.update()
        return out

    def drain(self, max_steps: int = 200) -> None:
        for _ in range(max_steps):
            if not self.s.has_requests():
                break
            self.step()
        while self.queue:
            self.update()
        assert not self.s.has_requests()


# ----------------------------------------------------------------- the max_tokens skip
@pytest.mark.parametrize("max_tokens, async_steps, sync_steps", [
    (1, [{"a": 4}, {}], [{"a": 4}]),
    (2, [{"a": 4}, {"a": 1}, {}], [{"a": 4}, {"a": 1}]),
    (3, [{"a": 4}, {"a": 1}, {"a": 1}, {}], [{"a": 4}, {"a": 1}, {"a": 1}]),
])
def test_max_tokens_skip(max_tokens: int, async_steps, sync_steps) -> None:
    """scheduler.py:800-814: a request whose in-flight step yields its last token is not
    scheduled again (placeholders 1, computed + 1 >= prompt + max_tokens); the step is
    empty, and the request finishes at the next update."""
    for mode, expected in ((True, async_steps), (False, sync_steps)):
        d = Driver(sched(async_scheduling=mode))
        a = req("a", 4, max_tokens)
        d.s.add_request(a)
        d.drain()
        assert d.steps == expected, mode
        assert a.num_output_tokens == max_tokens and a.status == RequestStatus.FINISHED
        assert d.finished == [(max_tokens - 1, "a")]  # the step that sampled its last token
        assert (a.num_output_placeholders, a.num_in_flight_tokens) == (0, 0)


def test_placeholder_counters_step_by_step() -> None:
    """async_scheduler.py:24-56 and scheduler.py:1845-1877: computed runs one token
    ahead of num_tokens while a token is in flight; the placeholder resolves at update."""
    s = sched()
    d = Driver(s)
    a = req("a", 4, 5)
    s.add_request(a)
    d.schedule()  # prefill: 4 tokens, the sample is a placeholder
    assert (a.num_computed_tokens, a.num_tokens, a.num_output_placeholders,
            a.num_in_flight_tokens, a.is_prefill_chunk) == (4, 4, 1, 4, False)
    d.schedule()  # demand = 4 + 1 - 4 = 1 (839-843), before the first token exists
    assert (a.num_computed_tokens, a.num_tokens, a.num_output_placeholders,
            a.num_in_flight_tokens) == (5, 4, 2, 5)
    d.update()  # step 0's token
    assert (a.num_computed_tokens, a.num_tokens, a.num_output_placeholders,
            a.num_in_flight_tokens, a.first_token_s) == (5, 5, 1, 1, 1.0)


# ----------------------------------------------------------------- frees gate admission
def test_frees_gate_admission_one_step_late() -> None:
    """max_num_seqs=1: "a" finishes in update(1), which runs after schedule(2), so "b"
    is admitted by schedule(3) (sync: schedule(2)); step 2 is empty (vLLM queues it)."""
    for mode, expected in (
            (True, [{"a": 4}, {"a": 1}, {}, {"b": 4}, {}]),
            (False, [{"a": 4}, {"a": 1}, {"b": 4}])):
        d = Driver(sched(max_num_seqs=1, async_scheduling=mode))
        d.s.add_request(req("a", 4, 2))
        d.s.add_request(req("b", 4, 1))
        d.drain()
        assert d.steps == expected, mode


def test_max_num_seqs_saturated_by_finishing_requests() -> None:
    """Requests about to finish still count toward max_num_seqs (1072-1074) and hold
    their blocks during schedule(N+1): with 2 seats, "c" waits for both to leave."""
    s = sched(max_num_seqs=2)
    d = Driver(s)
    for rid in "ab":
        s.add_request(req(rid, 4, 1))
    s.add_request(req("c", 4, 1))
    d.schedule()
    out = d.schedule()  # a and b skipped (their last tokens in flight), c not admitted
    assert d.steps[1] == {} and len(s.running) == 2 and out.total_num_scheduled_tokens == 0
    assert s.kv_cache_manager.usage == pytest.approx(2 / 99)  # both still hold a block
    d.update()  # a and b finish, free
    assert len(s.running) == 0 and s.kv_cache_manager.usage == 0.0
    d.drain()
    assert d.steps == [{"a": 4, "b": 4}, {}, {"c": 4}, {}]


# ----------------------------------------------------------------- preemption in flight
def test_victim_preempted_while_its_token_is_in_flight() -> None:
    """1799-1843: the victim of schedule(1) has step 0's token in flight. It is reset
    (computed 0, placeholders 0) and its in-flight share is marked stale; update(0)
    still appends the token (num_tokens and output grow: 2311-2335) but leaves the
    reset counters alone, and registers nothing for it (2402: it is not RUNNING)."""
    s = sched(4)  # 3 usable blocks of 4 tokens
    d = Driver(s)
    a, b = req("a", 4, 8), req("b", 4, 8)
    s.add_request(a)
    s.add_request(b)
    d.schedule()  # both prefill, one block each, one block left
    out = d.schedule()  # a takes the last block; b needs one: b preempts itself
    assert out.preempted == [b] and d.steps[1] == {"a": 1}
    assert (b.status, b.num_computed_tokens, b.num_output_placeholders,
            b.num_in_flight_tokens, b.num_stale_output_tokens) == (
                RequestStatus.PREEMPTED, 0, 0, 4, 4)
    assert b.num_blocks == 0 and b.num_preemptions == 1
    d.update()
    assert (b.num_tokens, b.num_output_tokens, b.num_computed_tokens,
            b.num_output_placeholders, b.num_in_flight_tokens,
            b.num_stale_output_tokens) == (5, 1, 0, 0, 0, 0)
    assert b.first_token_s == 1.0  # delivered to the client at update(0)
    assert (a.num_tokens, a.num_output_placeholders) == (5, 1)
    # The gate of 1084-1089 never binds at depth 2: the stale share drained before the
    # next waiting loop, which readmits b with its generated token to recompute.
    d.schedule()
    assert s.deferred_waiting == set()
    d.drain()
    assert b.num_output_tokens == 8 and a.num_output_tokens == 8


def test_stale_token_finishes_a_preempted_request() -> None:
    """vLLM's stopped_preempted_reqs (2491-2548): "b" (max_tokens 1) is preempted as the
    victim of "a"'s allocation while its only token is in flight; update(0) delivers it,
    b finishes from the waiting queue and is removed from it."""
    s = sched(3)  # 2 usable blocks
    d = Driver(s)
    a, b = req("a", 4, 4), req("b", 4, 1)
    s.add_request(a)
    s.add_request(b)
    d.schedule()
    out = d.schedule()  # a needs a second block: the tail of running (b) is the victim
    assert out.preempted == [b] and list(s.waiting) == [b]
    done = d.update()
    assert done == [b] and b.status == RequestStatus.FINISHED and b.finish_s == 1.0
    assert list(s.waiting) == [] and b.num_output_tokens == 1 and b.num_preemptions == 1
    d.drain()


def test_priority_victim_already_scheduled_this_step_is_stale() -> None:
    """Priority policy: "h" (priority 0) needs a block; the victim "l" (priority 1) was
    scheduled earlier in this step: its tokens go back to the budget (935-947) and only
    its previous, in-flight step becomes stale."""
    s = sched(4, policy="priority")
    d = Driver(s)
    lo, hi = req("l", 4, 6, priority=1), req("h", 4, 6, priority=0)
    s.add_request(lo)
    d.schedule()  # l prefills (1 block)
    s.add_request(hi)
    d.schedule()  # l decodes (takes block 2), h is admitted (block 3): pool full
    d.update()
    out = d.schedule()  # l: fits; h: needs a block -> victim l (scheduled before it)
    assert out.preempted == [lo] and d.steps[2] == {"h": 1}
    assert (lo.num_in_flight_tokens, lo.num_stale_output_tokens,
            lo.num_output_placeholders) == (1, 1, 0)
    d.update()  # l's step-1 token: appended, stale
    assert (lo.num_tokens, lo.num_output_tokens, lo.num_computed_tokens,
            lo.num_stale_output_tokens, lo.num_cached_blocks) == (6, 2, 0, 0, 0)
    d.drain()


def test_priority_victim_skipped_ahead_of_the_loop_shifts_it_back() -> None:
    """935-947: the victim "l" (lowest priority) sits ahead of the loop's position, not
    scheduled (its last token is in flight: the max_tokens skip). Removing it shifts the
    loop back one place, so "c" after the requester "b" is still scheduled; and l's stale
    token, its last, finishes it from the waiting queue."""
    s = sched(5, policy="priority")  # 4 usable blocks
    d = Driver(s)
    lo = req("l", 4, 2, priority=2)
    s.add_request(lo)
    d.schedule()
    s.add_request(req("b", 4, 8, priority=0))
    s.add_request(req("c", 2, 8, priority=1))
    d.schedule()  # l decodes (2nd block), b then c admitted: the pool is full
    assert d.steps[1] == {"l": 1, "b": 4, "c": 2}
    d.update()
    out = d.schedule()  # l skipped; b needs a block: victim l, behind the loop's place
    assert out.preempted == [lo] and d.steps[2] == {"b": 1, "c": 1}
    d.update()
    assert lo.status == RequestStatus.FINISHED and lo.num_output_tokens == 2
    d.drain()


def test_priority_request_preempting_itself_lets_the_next_ones_run() -> None:
    """0.33.0 (982-992): under priority, the lowest-priority request that preempts itself
    does not end the running loop (async mode follows 0.33.0): at step 5 "l" needs its
    third block, preempts itself, and "h", needing a block at the same step, takes one
    of those l freed."""
    s = sched(4, policy="priority")  # 3 usable blocks
    d = Driver(s)
    lo = req("l", 4, 8, priority=2)
    s.add_request(lo)
    d.schedule()
    s.add_request(req("h", 1, 8, priority=0))
    for _ in range(5):
        out = d.step()
    assert d.steps[:5] == [{"l": 4}] + [{"l": 1, "h": 1}] * 4
    assert out.preempted == [lo] and d.steps[5] == {"h": 1}
    d.drain()
    assert lo.num_output_tokens == 8


def test_readmission_gate_skips_a_request_with_stale_output() -> None:
    """1084-1089, modelled although it cannot bind at depth 2 (see the test above): a
    waiting request with stale output still in flight is skipped this step, the next
    one is admitted, and the skipped one keeps its place at the head of the queue."""
    s = sched()
    x, y = req("x", 4, 1), req("y", 4, 1)
    s.add_request(x)
    s.add_request(y)
    x.num_stale_output_tokens = x.num_in_flight_tokens = 1  # as if preempted in flight
    out = s.schedule()
    assert s.scheduled_tokens(out) == {"y": 4}
    assert list(s.waiting) == [x] and s.deferred_waiting == {x}
    x.num_stale_output_tokens = x.num_in_flight_tokens = 0  # its output arrived
    s.update_from_output(out, 1.0)
    assert s.scheduled_tokens(s.schedule()) == {"x": 4}
    assert s.deferred_waiting == set()


# ----------------------------------------------------------------- delayed registration
def _generated_block_case(async_scheduling: bool) -> tuple[Scheduler, Driver, SimRequest]:
    """"a" (3-token prompt) generates the 4th token of block 0, whose hash (5) is the
    first block of "f"'s prompt; a 3-token budget keeps f out of step 0."""
    s = sched(max_num_batched_tokens=3, max_num_seqs=2, async_scheduling=async_scheduling)
    d = Driver(s)
    s.add_request(req("a", 3, 6, output_hashes=[5, 7, 9]))
    f = req("f", 8, 1, hashes=[5, 6])
    s.add_request(f)
    return s, d, f


def test_generated_block_registered_one_step_later() -> None:
    """allocate_slots caches up to min(computed + new, num_tokens) (kv_cache_manager.py:
    616-625): in async, schedule(1) runs before a's first token exists (num_tokens 3),
    so block 0 is registered by schedule(2), and f, admitted by schedule(1), misses it."""
    s, d, f = _generated_block_case(True)
    pool = s.kv_cache_manager.block_pool
    d.schedule()
    d.schedule()
    assert pool.first_holder[5] < 0 and d.hits == {"a": 0, "f": 0}  # f: a miss
    d.drain()
    s, d, f = _generated_block_case(False)
    d.step()
    d.step()  # sync: a's allocation at schedule(1) registers block 0, then f hits it
    assert s.kv_cache_manager.block_pool.first_holder[5] > 0
    assert d.hits["f"] == 4
    d.drain()


def test_follower_hits_the_generated_block_a_step_later() -> None:
    """Same case with f arriving one step later (added before schedule(2)): async
    schedule(2) registers block 0 in the running loop, before f's lookup: a hit."""
    s = sched(max_num_batched_tokens=3, max_num_seqs=2)
    d = Driver(s)
    s.add_request(req("a", 3, 6, output_hashes=[5, 7, 9]))
    d.schedule()
    d.schedule()
    f = req("f", 8, 1, hashes=[5, 6])
    s.add_request(f)
    d.update()
    d.schedule()
    assert s.kv_cache_manager.block_pool.first_holder[5] > 0
    assert d.hits["f"] == 4
    d.drain()


def test_update_registers_up_to_computed_minus_in_flight() -> None:
    """2402-2415: after update(N) a running request's blocks are registered up to
    num_computed - num_in_flight, which covers a block a non-scheduled step filled."""
    s = sched(max_num_seqs=2)
    d = Driver(s)
    a = req("a", 3, 2, output_hashes=[5])
    s.add_request(a)
    d.schedule()  # prefill 3
    d.schedule()  # decode: computed 4, block 0 not registered (num_tokens still 3)
    assert a.num_cached_blocks == 0
    d.update()  # the token completes block 0: registered up to 4 - 1 = 3 -> still none
    assert a.num_cached_blocks == 0
    d.schedule()  # skipped (its last token is in flight): no allocate_slots call
    assert d.steps[2] == {}
    d.update()  # a finishes: update caches up to 4 - 0 = 4 -> block 0, then frees it
    assert s.kv_cache_manager.block_pool.first_holder[5] > 0


# ----------------------------------------------------------------- other settings
def test_long_prefill_token_threshold_chunks_back_to_back() -> None:
    """Partial chunks take no placeholder (is_prefill_chunk) and sample nothing; the
    last chunk samples, and the first decode is planned before that token exists."""
    s = sched(long_prefill_token_threshold=4)
    d = Driver(s)
    a = req("a", 10, 3)
    s.add_request(a)
    s.add_request(req("b", 1, 1))  # two requests: the threshold applies
    d.schedule()
    assert a.is_prefill_chunk and a.num_output_placeholders == 0
    d.drain()
    assert d.steps == [{"a": 4, "b": 1}, {"a": 4}, {"a": 2}, {"a": 1}, {"a": 1}, {}]
    assert a.first_token_s == 3.0  # update of step 2, the last chunk


def test_prefill_schedule_interval_in_async() -> None:
    """prefill_schedule_interval=2: step 1 defers prefill (a decodes: not a prefill
    chunk with its placeholder); "b", arriving after it, is admitted by step 2."""
    s = sched(prefill_schedule_interval=2)
    d = Driver(s)
    s.add_request(req("a", 4, 6))
    d.schedule()
    assert d.schedule().deferred  # a decodes: its placeholder makes it no prefill chunk
    s.add_request(req("b", 4, 2))
    d.update()
    out = d.schedule()
    assert d.steps[:3] == [{"a": 4}, {"a": 1}, {"a": 1, "b": 4}]
    assert not out.deferred
    d.drain()


def test_cache_aware_window_sees_usage_before_the_frees() -> None:
    """PR #54625 in async: usage at schedule(1) still includes "a", which finishes in
    update(0), so usage (4/10) >= threshold 0.3 and the window puts "w2" (a cache hit)
    before "w1"; in sync a is freed first, usage is 0 and w1 keeps its place."""
    firsts = {}
    for mode in (True, False):
        s = sched(11, max_num_seqs=1, cache_aware_admission_window=2,
                  cache_aware_admission_threshold=0.3, async_scheduling=mode)
        d = Driver(s)
        s.add_request(req("a", 16, 1, hashes=[1, 2, 3, 4]))
        s.add_request(req("w1", 8, 1, hashes=[11, 12]))
        s.add_request(req("w2", 8, 1, hashes=[1, 2]))
        d.drain()
        firsts[mode] = [rid for step in d.steps for rid in step if rid != "a"][0]
    assert firsts == {True: "w2", False: "w1"}


def test_arrival_during_batch_0_is_first_seen_by_schedule_2() -> None:
    """step_with_batch_queue: schedule(1) runs at the time batch 0 starts (the queue has
    room), so "b", arriving while batch 0 runs, first meets schedule(2); in sync it meets
    schedule(1), which follows update(0)."""
    from tuner.sim.engine import Simulator

    from sim_helpers import fixed_step

    trace = [Req("a", 0.0, 4, 4, []), Req("b", 0.005, 4, 1, [])]
    for mode, expected in ((True, [{"a": 4}, {"a": 1}, {"a": 1, "b": 4}]),
                           (False, [{"a": 4}, {"a": 1, "b": 4}])):
        sim = Simulator(trace, SchedulerSettings(max_num_batched_tokens=64, max_num_seqs=8),
                        CacheSettings(block_size=BS, num_gpu_blocks=100), fixed_step,
                        options=SimOptions(async_scheduling=mode, record_steps=True,
                                           check_invariants=True,
                                           fast_forward=PATH["fast_forward"]))
        result = sim.run()
        got = [s.num_scheduled_tokens for s in result.steps][:len(expected)]
        assert got == expected, mode
        assert result.steps[0].duration_s > 0.005  # b arrives while batch 0 runs


def test_closed_loop_next_request_seen_two_schedules_later() -> None:
    """Concurrency 1: the next request is issued when one finishes, at update(N), and
    first scheduled by schedule(N+2) (the loop's depth-2 queue)."""
    from tuner.sim.engine import Simulator

    from sim_helpers import fixed_step

    trace = [Req("a", 0.0, 4, 1, []), Req("b", 0.0, 4, 1, [])]
    for mode, expected in ((True, [{"a": 4}, {}, {"b": 4}, {}]), (False, [{"a": 4}, {"b": 4}])):
        sim = Simulator(trace, SchedulerSettings(max_num_batched_tokens=64, max_num_seqs=8),
                        CacheSettings(block_size=BS, num_gpu_blocks=100), fixed_step,
                        options=SimOptions(async_scheduling=mode, record_steps=True,
                                           check_invariants=True,
                                           fast_forward=PATH["fast_forward"]),
                        load=ClosedLoop(1))
        result = sim.run()
        assert [s.num_scheduled_tokens for s in result.steps] == expected, mode
        b = result.requests[1]
        assert b.arrival_s == result.requests[0].finish_s == result.steps[0].start_s + (
            result.steps[0].duration_s)


def test_closed_loop_load_in_async() -> None:
    from tuner.sim.engine import Simulator

    from sim_helpers import fixed_step

    trace = [Req(f"r{i}", 0.0, 4 + i, 3, []) for i in range(6)]
    sim = Simulator(trace, SchedulerSettings(max_num_batched_tokens=64, max_num_seqs=8),
                    CacheSettings(block_size=BS, num_gpu_blocks=100), fixed_step,
                    options=SimOptions(async_scheduling=True, check_invariants=True,
                                       fast_forward=PATH["fast_forward"]),
                    load=ClosedLoop(2))
    result = sim.run()
    finished = [r for r in result.requests if r.status == "finished"]
    assert len(finished) == 6
    # Each request is issued at the update that finished its predecessor in the seat.
    arrivals = sorted(r.arrival_s for r in result.requests)
    finishes = sorted(r.finish_s for r in result.requests)
    assert arrivals[2:] == finishes[:4]


# ----------------------------------------------------------------- records
def test_step_records_carry_the_gauge_at_update() -> None:
    """StepRecord.kv_usage: after scheduling; kv_usage_at_update: at the end of the
    step's update (make_stats, scheduler.py:3294), which in async includes the next
    step's allocations and the step's frees."""
    trace = [Req("a", 0.0, 8, 1, []), Req("b", 0.0, 4, 6, [])]
    sim, result = replay(trace, SchedulerSettings(max_num_batched_tokens=64, max_num_seqs=8),
                         CacheSettings(block_size=BS, num_gpu_blocks=11),
                         async_scheduling=True, record_steps=True,
                         fast_forward=PATH["fast_forward"])
    steps = result.steps
    assert steps[0].num_scheduled_tokens == {"a": 8, "b": 4}
    assert steps[0].kv_usage == pytest.approx(3 / 10)
    # update(0) ran after schedule(1) (b took a second block), then freed a's 2 blocks.
    assert steps[1].kv_usage == pytest.approx(4 / 10)
    assert steps[0].kv_usage_at_update == pytest.approx(2 / 10)
    assert all(s.kv_usage_at_update is not None for s in steps)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_free_registers_nothing(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's ``_free_request`` registers no block (scheduler.py:3031-3062), and in async a
    block can be full but unregistered at free: a victim of schedule(N+1) whose block was
    completed by the token update(N-1) applied (registered by its next allocate_slots or
    update, which never come). So the twin's free registers nothing in async, on both
    paths (the decode group catches up when a member leaves), and the preempted request
    recomputes that block, as in vLLM."""
    from tuner.sim.engine import Simulator
    from tuner.sim.kv_cache_manager import KVCacheManager

    from sim_helpers import nonlinear_step, random_trace

    original = KVCacheManager.free
    unregistered_at_free = []

    def free(self, request):
        before = request.num_cached_blocks
        full = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        if request.num_blocks and full > before:
            unregistered_at_free.append(request.request_id)
        pool_hashes = int((self.block_pool.block_hash >= 0).sum())
        original(self, request)
        assert int((self.block_pool.block_hash >= 0).sum()) == pool_hashes, request

    monkeypatch.setattr(KVCacheManager, "free", free)
    trace = random_trace(seed, 40, block_size=4, max_output=80, with_output_hashes=True,
                         rate=50.0)
    sim = Simulator(trace, SchedulerSettings(max_num_batched_tokens=128, max_num_seqs=16),
                    CacheSettings(block_size=4, num_gpu_blocks=120), nonlinear_step,
                    options=SimOptions(async_scheduling=True, check_invariants=True,
                                       fast_forward=PATH["fast_forward"]))
    result = sim.run()
    assert result.counters["preemptions"] > 0
    if not PATH["fast_forward"]:  # the case exists (the group defers more, on purpose)
        assert unregistered_at_free
