"""The replay clock's two halves, shared by every loop: arrivals and batch launches.

Why: the single-engine loop (:class:`tuner.sim.loop.ReplayLoop`) and the fleet's
(:class:`tuner.sim.fleet.loop.FleetLoop`) run the same clock; only the order in which
they visit engines differs (one engine in sequence, many through an event heap). Each
rule below is written here once, so a one-engine fleet keeps the single-engine semantics
by construction, and a new engine feature (a CPU KV tier, speculative decoding, split
prefill and decode) changes the clock in one place.

Contract:

* :func:`batch_queue_depth` is the one place where a scheduling mode becomes a batch
  queue depth: async scheduling is vLLM's ``step_with_batch_queue`` with a queue of 2
  (v1/engine/core.py:208-234, 708-822 @ 0.33.0), synchronous scheduling a queue of 1.
  The twin, the fleet, the replay backend and the vLLM-core drivers all ask it.
* :class:`Arrivals` owns the requests not yet issued: the issue order, the open loop's
  ``arrival_s / speedup`` and the closed loop's ``concurrency`` slots (with the
  replacements on their way, which miss the schedule at the instant their slot was
  freed: docs/step-time-model.md §1.4), the arrival-time refusals
  (:class:`~tuner.sim.loop.AdmissionRules`) and the count of requests in flight. It
  hands each request to an :class:`ArrivalSink` (an engine, or the fleet's front end)
  and reads the next one only after the sink took it.
* :class:`BatchQueue` owns one batch queue (one engine, or a lockstep group): which
  batches are scheduled and not yet applied, the GPU clock (a batch starts at
  ``max(its launch, the previous batch's end)``), the CPU's launch time, and when a
  batch's outputs are applied (``max(its end, the CPU's time)``: a token is out only
  when the GPU produced it and the CPU got to it). The loop decides *when* it asks;
  the queue does the arithmetic (docs/step-time-model.md §1.3).
* :func:`launch_price_function` is the one pricing convention of a launch: ``(cpu,
  gpu)`` seconds, the CPU part delaying the launch. Depth 1 prices the step as one total
  (the CPU part is inside it: ``(0, step_time_s)``, CPU then GPU), deeper queues split it
  (``step_parts_s``) so the CPU part of step N+1 overlaps the GPU's step N.
* :func:`rank_price_function` is the lockstep's per-rank price (expert parallelism over
  DP ranks: ``StepTimeModel.rank_step_time_s``), None where ranks are priced alone.

This module is on the hot path (every step calls :meth:`BatchQueue.launch` and
:meth:`BatchQueue.pop`): slotted, no allocation but the queue's tuple, no per-step
branching on the mode beyond what the rules need. Plain Python: the vLLM-core drivers
import it inside a vLLM environment.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterable, Iterator, Protocol

from tuner.sim.batch import StepBatch
from tuner.sim.load import ClosedLoop, OpenLoop

__all__ = ["ArrivalSink", "Arrivals", "BatchQueue", "INF", "StepTime", "batch_queue_depth",
           "launch_price_function", "price_function", "rank_price_function",
           "split_price_function"]

INF = float("inf")
_EMPTY = (0.0, 0.0)

#: A step-time model: a ``StepTimeModel`` (``tuner.perf.step_time``: ``step_time_s(batch)``,
#: ``step_parts_s(batch) -> (cpu, gpu)`` for the async clock, ``rank_step_time_s`` and
#: ``couples_ranks`` for an expert-parallel lockstep) or a plain callable ``batch ->
#: seconds`` (all GPU time). ``tuner.sim`` cannot import ``tuner.perf`` (it comes later in
#: the stage order), so the functions below are the one adapter between the two.
StepTime = Any


def batch_queue_depth(async_scheduling: bool) -> int:
    """Batches an engine schedules ahead of their outputs: 2 under async scheduling
    (vLLM's ``step_with_batch_queue``: schedule(N+1) runs before update(N)), else 1."""
    return 2 if async_scheduling else 1


def price_function(step_time: StepTime) -> Callable[[StepBatch], float]:
    """The one convention for step-time callables: ``step_time_s`` if the object has it
    (``tuner.perf.step_time.StepTimeModel`` and its subclasses), else the object itself."""
    method = getattr(step_time, "step_time_s", None)
    if method is not None:
        return method
    if callable(step_time):
        return step_time
    raise TypeError(f"step time {step_time!r}: neither a StepTimeModel nor a callable")


def split_price_function(step_time: StepTime) -> Callable[[StepBatch], tuple[float, float]]:
    """``batch -> (cpu_s, gpu_s)`` for the overlapped (async) clock.

    ``step_parts_s`` if the object has it (``tuner.perf.step_time.StepTimeModel``); any
    other model or callable (tests price with ``lambda batch: 0.01``) has no CPU part:
    its whole time is GPU time, so the async clock runs its batches back to back.
    """
    parts = getattr(step_time, "step_parts_s", None)
    if parts is not None:
        return parts
    total = price_function(step_time)
    return lambda batch: (0.0, total(batch))


def launch_price_function(step_time: StepTime, depth: int
                          ) -> Callable[[StepBatch], tuple[float, float]]:
    """``batch -> (cpu_s, gpu_s)`` as :meth:`BatchQueue.launch` takes them at ``depth``:
    one total as GPU time at depth 1 (the batch starts when it is scheduled and its
    outputs are applied at its end: the period is CPU + GPU), the two parts apart deeper
    (:func:`split_price_function`)."""
    if depth > 1:
        return split_price_function(step_time)
    total = price_function(step_time)
    return lambda batch: (0.0, float(total(batch)))


def rank_price_function(step_time: StepTime) -> Callable[[StepBatch, int], float] | None:
    """``(batch, group_tokens) -> seconds`` for one rank of a lockstep whose ranks share
    their experts (``StepTimeModel.rank_step_time_s``, where ``couples_ranks``); None
    when each rank is priced alone (no expert parallelism over DP ranks, or a plain
    callable)."""
    if getattr(step_time, "couples_ranks", False):
        return step_time.rank_step_time_s
    return None


class ArrivalSink(Protocol):
    """Who takes an issued request: an engine (``StepEngine``) or the fleet's front end."""

    def add_request(self, index: int, source: Any, arrival_s: float) -> None:
        """Request ``index`` (trace position) of ``source`` arrives at ``arrival_s``."""

    def reject_request(self, index: int, source: Any, arrival_s: float) -> None:
        """Request ``index`` arrived at ``arrival_s`` and is refused (AdmissionRules)."""


class Arrivals:
    """The requests not yet issued, on the replay clock (see the module doc).

    Requests are issued in the order ``pairs`` yields them (arrival time, ties by trace
    position). Open loop: a request is due at ``arrival_s / speedup``. Closed loop:
    ``concurrency`` requests in flight, the next one due when a slot is free (a refused
    request takes no slot). ``pairs`` is read lazily: only the next pair is held, and the
    next is read only after the sink took the previous one (a source reading lazily may
    renumber what the engine holds when it reads on).

    A closed loop's slot freed at ``t`` (:meth:`release`) is, under
    ``ClosedLoop.replacement_misses_step``, a replacement *on its way*: sent at ``t``
    (its ``arrival_s``, the client's clock) but reaching the engine just after ``t``, so
    a schedule at ``t`` does not see it and the first schedule after ``t`` does
    (:meth:`issue_due` before a schedule at ``now > t``; the fleet's loop orders it
    after the schedules of its instant). An idle engine blocks on its input queue
    (vLLM's ``_process_input_queue``) and takes it as it comes (:meth:`engine_idle`).
    The slots the loop starts with (the first ``concurrency`` requests, sent to an idle
    engine) are free at once.

    Args:
        pairs: ``(index, source)``; each source has ``arrival_s``, ``input_len`` and
            ``output_len``.
        rules: the arrival-time refusals (``AdmissionRules``: anything with
            ``rejects(input_len, output_len)``).
        load: ``OpenLoop`` or ``ClosedLoop``.
    """

    __slots__ = ("rules", "next_s", "num_issued", "in_flight", "_pairs", "_head",
                 "_speedup", "_concurrency", "_on_the_way")

    def __init__(self, pairs: Iterable[tuple[int, Any]], rules: Any,
                 load: OpenLoop | ClosedLoop) -> None:
        if not isinstance(load, (OpenLoop, ClosedLoop)):
            raise TypeError(f"load {load!r}: expected OpenLoop or ClosedLoop")
        self.rules = rules
        self.num_issued = 0  # requests handed to the sink (refused ones included)
        #: admitted, not finished (the closed loop's count); the loop reports what its
        #: engines' updates finish (:meth:`release`)
        self.in_flight = 0
        self._pairs: Iterator[tuple[int, Any]] = iter(pairs)
        self._speedup = load.speedup if isinstance(load, OpenLoop) else 1.0
        self._concurrency = load.concurrency if isinstance(load, ClosedLoop) else 0
        #: the closed loop's replacements on their way: when each slot was freed, in
        #: order (None: the next request reaches the engine at once, as the open loop's
        #: and ``replacement_misses_step=False``'s do). A slot that is neither in flight
        #: nor on its way is free at once.
        self._on_the_way: deque[float] | None = (
            deque() if isinstance(load, ClosedLoop) and load.replacement_misses_step else None)
        #: a lower bound of when the head is due: its arrival in the open loop (so a
        #: loop skips :meth:`issue_due` with one comparison), -inf in the closed loop
        #: (due whenever a slot is free), inf when nothing is left
        self.next_s = INF
        self._head: tuple[int, Any] | None = None
        self._read_on()

    def _read_on(self) -> None:
        head = self._head = next(self._pairs, None)
        if head is None:
            self.next_s = INF
        elif self._concurrency:
            self.next_s = -INF
        else:
            self.next_s = float(head[1].arrival_s) / self._speedup

    def _free_at_once(self) -> bool:
        """A closed-loop slot neither in flight nor on its way."""
        way = self._on_the_way
        return self.in_flight + (len(way) if way else 0) < self._concurrency

    def next_arrival_s(self, now_s: float) -> float:
        """When the next request is due, seen at ``now_s`` (inf if none can be without a
        finish first). A closed loop's replacement on its way is due at the time its slot
        was freed, after that instant's schedules (:meth:`next_is_on_the_way`)."""
        if self._head is None:
            return INF
        if self._concurrency:
            if self._free_at_once():
                return now_s
            way = self._on_the_way
            return way[0] if way else INF
        return self.next_s

    def next_is_on_the_way(self) -> bool:
        """Whether the request :meth:`next_arrival_s` gives is a closed loop's replacement
        on its way: it reaches the engines after the schedules at its instant (the
        fleet's loop orders it so), not before them as an arrival does."""
        return (self._on_the_way is not None and self._head is not None
                and not self._free_at_once() and bool(self._on_the_way))

    def issue(self, now_s: float, sink: ArrivalSink) -> None:
        """Hand the head, due at ``now_s`` or earlier, to ``sink`` (refused or added).

        A closed loop's head takes a slot free at once (arriving at ``now_s``), else the
        oldest replacement on its way (arriving when that slot was freed: the client
        sent it then); a refused head leaves the slot to the next one."""
        assert self._head is not None, "issue() with no request left"
        index, source = self._head
        way = None
        if not self._concurrency:
            arrival = self.next_s
        elif self._free_at_once():
            arrival = now_s
        else:
            way = self._on_the_way
            assert way, "issue() with no closed-loop slot free"
            arrival = way[0]
        self.num_issued += 1
        if self.rules.rejects(int(source.input_len), int(source.output_len)):
            sink.reject_request(index, source, arrival)  # frees its closed-loop slot
        else:
            if way is not None:
                way.popleft()
            self.in_flight += 1
            sink.add_request(index, source, arrival)
        self._read_on()

    def issue_due(self, now_s: float, sink: ArrivalSink) -> None:
        """Issue every request due before a schedule at ``now_s``, in order
        (:meth:`next_arrival_s`'s rule, unrolled per load: this runs once per step): a
        closed loop's replacement on its way only if its slot was freed before ``now_s``
        (the schedule at that very instant does not see it)."""
        concurrency = self._concurrency
        if concurrency:
            way = self._on_the_way
            while self._head is not None:
                on_the_way = len(way) if way else 0
                if (self.in_flight + on_the_way >= concurrency
                        and not (on_the_way and way[0] < now_s)):  # type: ignore[index]
                    break
                self.issue(now_s, sink)
        else:
            while self.next_s <= now_s:  # inf once nothing is left
                self.issue(now_s, sink)

    def release(self, num_finished: int, now_s: float) -> None:
        """``num_finished`` admitted requests left the engines at ``now_s`` (finished, or
        refused downstream): a closed loop's slots free up, their replacements on their
        way (module doc) unless ``replacement_misses_step`` is off."""
        self.in_flight -= num_finished
        way = self._on_the_way
        if way is not None:
            way.extend([now_s] * num_finished)

    def engine_idle(self) -> None:
        """The engine has nothing waiting, running or in flight: vLLM's engine core
        blocks on its input queue, so the replacements on their way reach it as they
        come (their slots are free at once: the single-engine loop's idle jump; the
        fleet's loop gets the same from its order of events)."""
        way = self._on_the_way
        if way:
            way.clear()


class BatchQueue:
    """One batch queue and its CPU and GPU clocks (see the module doc).

    ``depth`` batches may be scheduled ahead of their outputs. Entries are ``(step,
    end_s)`` in launch order; ``step`` is whatever the loop keeps for the update (an
    engine's step, or one per rank of a lockstep group).
    """

    __slots__ = ("depth", "queue", "gpu_free_s", "cpu_free_s")

    def __init__(self, depth: int) -> None:
        if depth < 1:
            raise ValueError(f"batch_queue_depth={depth} must be >= 1")
        self.depth = depth
        self.queue: deque[tuple[Any, float]] = deque()
        self.gpu_free_s = 0.0  # when the GPU finishes the last queued batch
        self.cpu_free_s = 0.0  # when the CPU launched the last batch

    def launch(self, step: Any, now_s: float, cpu_s: float, gpu_s: float) -> float:
        """Queue ``step``, scheduled at ``now_s``: the CPU launches it ``cpu_s`` later, the
        GPU runs it for ``gpu_s`` from ``max(launch, the previous batch's end)``. Returns
        its GPU start; :attr:`cpu_free_s` is the launch (the CPU's time from here on)."""
        launch = now_s + cpu_s
        gpu_free = self.gpu_free_s
        start = launch if launch > gpu_free else gpu_free
        self.gpu_free_s = start + gpu_s
        self.cpu_free_s = launch
        self.queue.append((step, start + gpu_s))
        return start

    def outputs_s(self) -> float:
        """When the oldest batch's outputs can be applied: its end, or later when the CPU
        was still launching the next batch."""
        end = self.queue[0][1]
        return end if end > self.cpu_free_s else self.cpu_free_s

    def pop(self, now_s: float) -> tuple[Any, float]:
        """The oldest batch and when its outputs are applied (``now_s`` is the CPU's time:
        never before :meth:`outputs_s`)."""
        step, end = self.queue.popleft()
        if self.cpu_free_s > end:
            end = self.cpu_free_s
        return step, (end if end > now_s else now_s)
