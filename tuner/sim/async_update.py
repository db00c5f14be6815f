"""Asynchronous scheduling: vLLM 0.33.0's ``AsyncScheduler`` under ``step_with_batch_queue``.

Why a module of its own: the async mode changes only two moments of a step, the end of
``schedule()`` (output placeholders) and ``update_from_output`` (tokens arrive one step
after the next schedule), so the synchronous code stays as it is (bit-identical
replays) and the asynchronous rules are read in one place. The rest of the async mode
lives in the shared code where vLLM has it in the base class, keyed on placeholders
(``Scheduler._schedule_running``: the ``max_tokens`` skip and the demand;
``Scheduler.preempt_request``: stale output; ``Scheduler._schedule_waiting``: the
re-admission gate) and in the loop (``tuner.sim.loop``, batch queue depth 2: schedule(N+1)
runs before update(N)).

vLLM 0.33.0 (file:line under ``vllm/v1/``):

* ``AsyncScheduler._update_after_schedule`` (core/sched/async_scheduler.py:24-56): after
  the base update (computed += n, in-flight += n, ``is_prefill_chunk = computed <
  num_tokens + placeholders``, core/sched/scheduler.py:1845-1877) every scheduled request
  that is not a prefill chunk gets one output placeholder (``1 + 0``; with speculative
  decoding ``1 + len(drafts)``, tuner.sim.spec_update.SpecDecodeState.place_outputs).
  The runner samples exactly those requests; the decision is taken here, at schedule
  time (:func:`place_outputs`), because by update time step N+1 has moved the counters.
* ``update_from_output`` (core/sched/scheduler.py:2259-2560): per scheduled request,
  in-flight -= n and a stale share drains in lockstep (2311-2320); a finished request
  is skipped (2324); a sampled token is appended and the stop checked
  (``_update_request_with_output`` 2744-2770: placeholders -= 1 unless stale); a
  non-stale token of a request that was RUNNING with placeholders caches its full
  blocks up to ``num_computed - num_in_flight`` (2402-2415), so a block completed by a
  generated token is registered here, one step after ``allocate_slots`` could
  (core/kv_cache_manager.py:616-625 caps at ``request.num_tokens``); a stopped request
  is freed at once (``_free_request`` 3031-3062, no registration), and after the loop
  removed from ``running``, or from ``waiting`` if a stale token finished it while
  preempted (``stopped_preempted_reqs`` 2491-2548).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from tuner.sim.kv_cache_manager import KVCacheManager
from tuner.sim.request import RequestStatus, SimRequest
from tuner.sim.scheduler_output import SchedulerOutput

if TYPE_CHECKING:
    from tuner.sim.decode_group import DecodeGroup

_RUNNING = RequestStatus.RUNNING
_FINISHED = RequestStatus.FINISHED


class AsyncHost(Protocol):
    """What the async update needs from its scheduler (``tuner.sim.scheduler.Scheduler``)."""

    running: list[SimRequest]
    deferred_waiting: set[SimRequest]

    @property
    def kv_cache_manager(self) -> KVCacheManager: ...

    @property
    def waiting(self) -> Any: ...  # the request queue (FCFS deque or priority heap)


def _entry_seq(entry: tuple[tuple[SimRequest, int], bool]) -> int:
    return entry[0][0].seq


def place_outputs(out: SchedulerOutput) -> None:
    """The async half of ``_update_after_schedule``, after the shared half advanced
    ``num_computed_tokens`` and ``is_prefill_chunk``: tokens in flight, one placeholder
    per request this step samples, and the sampling decision kept for the update."""
    sampled = out.sampled
    for request, n in out.individual:
        request.num_in_flight_tokens += n
        samples = not request.is_prefill_chunk
        if samples:
            request.num_output_placeholders += 1
        sampled.append(samples)


def check_async_invariants(scheduler: AsyncHost, group: "DecodeGroup | None") -> None:
    """What holds between any two calls at batch queue depth 2: at most 1 + k (k: the drafts;
    0 without speculative decoding) placeholders (only the step in flight holds them), one only with
    tokens in flight, a stale share only inside the in-flight tokens, none in a waiting
    request's placeholders, and no request skipped by the re-admission gate. Decode
    group members are read through the group's accessors (nothing is materialised)."""
    # (a KV connector skips requests for its own reasons: loads, deferred lookups)
    assert not scheduler.deferred_waiting or getattr(scheduler, "connector", None) is not None, \
        "the re-admission gate bound at depth 2"
    spec = getattr(scheduler, "spec", None)  # speculative decoding: 1 + k per step
    max_placeholders = 1 + (spec.k if spec is not None else 0)
    for request in scheduler.running:
        if group is not None and request.steady:
            p, in_flight = group.placeholders(request), group.in_flight(request)
            computed, tokens = group.computed(request), group.tokens(request)
        else:
            p, in_flight = request.num_output_placeholders, request.num_in_flight_tokens
            computed, tokens = request.num_computed_tokens, request.num_tokens
        assert 0 <= p <= max_placeholders, f"{request!r}: {p} placeholders"
        assert in_flight >= p, f"{request!r}: placeholder not in flight"
        assert 0 <= request.num_stale_output_tokens <= in_flight, request
        assert computed <= tokens + p, request
    for request in scheduler.waiting:
        assert request.num_output_placeholders == 0, f"waiting {request!r} has placeholders"
        assert request.num_stale_output_tokens == request.num_in_flight_tokens, (
            f"waiting {request!r}: in-flight tokens that are not stale")


def settle_in_flight(entries: Iterable[tuple[tuple[SimRequest, int], bool]]
                     ) -> Iterator[tuple[SimRequest, bool]]:
    """The head of every async update loop (plain and speculative): each entry's
    scheduled tokens leave flight, a stale share shrinks by them (scheduler.py:2311-2320:
    output a preemption marked stale is delivered without touching the reset counters),
    and the requests that get output from this step are yielded with whether it is
    stale. Finished requests and entries that sampled nothing yield nothing.

    A generator so both loops share the accounting without a call per entry."""
    for (request, n), samples in entries:
        request.num_in_flight_tokens -= n
        stale = False
        if request.num_stale_output_tokens > 0:
            stale = True
            request.num_stale_output_tokens -= n
            assert request.num_stale_output_tokens >= 0, f"{request!r}: stale share < 0"
        if request.status >= _FINISHED or not samples:
            continue
        yield request, stale


def apply_outputs(scheduler: AsyncHost, out: SchedulerOutput, now_s: float,
                  gaps: dict[float, int]) -> list[SimRequest]:
    """``update_from_output`` of an async step at ``now_s`` (see the module doc); the
    requests that finished, in output order."""
    kvm = scheduler.kv_cache_manager
    finished: list[SimRequest] = []
    stopped_waiting: list[SimRequest] = []
    stopped_running: list[SimRequest] = []
    entries = zip(out.individual, out.sampled)
    if out.sort_individual:  # decode-group members left mid-flight: back to running order
        entries = sorted(entries, key=_entry_seq)  # type: ignore[assignment]
    for request, stale in settle_in_flight(entries):
        status_before = request.status
        had_placeholders = request.num_output_placeholders > 0
        request.deliver_output_token(now_s, gaps)
        if not stale and had_placeholders:
            request.num_output_placeholders -= 1
            if status_before == _RUNNING:
                kvm.cache_blocks(request,
                                 request.num_computed_tokens - request.num_in_flight_tokens)
        if request.num_output_tokens >= request.max_tokens:
            request.status = _FINISHED
            request.finish_s = now_s
            kvm.free(request)
            finished.append(request)
            if status_before == _RUNNING:
                stopped_running.append(request)
            else:
                stopped_waiting.append(request)
    if stopped_running:
        if len(stopped_running) <= 4:  # list.remove keeps the order, without a rebuild
            running = scheduler.running
            for request in stopped_running:
                running.remove(request)
        else:
            scheduler.running = [r for r in scheduler.running if r.status == _RUNNING]
    if stopped_waiting:
        for request in stopped_waiting:
            kvm.unwatch(request)
        scheduler.waiting.remove_requests(stopped_waiting)
        scheduler.deferred_waiting.difference_update(stopped_waiting)
    return finished
