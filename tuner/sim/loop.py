"""The replay clock: arrivals, the step sequence and the step-time call, for every engine.

One loop drives both the twin (``tuner.sim.engine``) and vLLM's own scheduler
(``tuner.vllm_core.driver``, which runs inside a vLLM interpreter, so this module is
plain Python). Each engine implements :class:`StepEngine`; the loop decides *when*
things happen, the engine *what* happens:

* **Arrivals.** Requests are issued in order of arrival time, ties by trace position.
  Open loop: a request reaches the engine at ``arrival_s / speedup`` of the replay clock.
  Closed loop: ``concurrency`` requests in flight, the next one issued (at the current
  time) when one finishes or is rejected. A request that can never run is refused at
  arrival by :class:`AdmissionRules`, the one copy of those rules.
* **Steps.** At the engine-loop time ``now`` every request that has arrived is added,
  then a batch is scheduled, priced by the step-time model and queued. The GPU runs
  queued batches back to back: a batch starts at ``max(now, end of the previous
  batch)``. When the queue holds ``batch_queue_depth`` batches, the oldest is waited for:
  ``now`` becomes its end and its outputs are applied (``update``). With nothing to
  schedule and nothing in flight the clock jumps to the next arrival.
* **Batch queue depth.** Depth 1 is ``--no-async-scheduling``: schedule(N), update(N),
  schedule(N+1). Depth 2 is vLLM's ``step_with_batch_queue`` (v1/engine/core.py @ 0.33.0,
  used by async scheduling): schedule(N+1) runs before update(N), so an arrival during
  batch N is first seen by schedule(N+2).
* **The step clock** (docs/step-time-model.md §1.3). Depth 1 prices a step as one total
  (``step_time_s``: the CPU part, then the GPU part): the batch starts at the engine
  time and its outputs are applied at its end, so the period is CPU + GPU. Deeper queues
  price the two parts apart (:func:`split_price_function`) and keep two clocks: the
  engine-core CPU, which schedules step N+1, prepares its inputs and launches it
  ``cpu`` seconds after it began (that CPU time also stands for update(N), which runs
  between the wait for N and schedule(N+2)), and the GPU, which starts a batch when it
  is launched and the previous batch has ended. The CPU then waits for the oldest batch
  and applies its outputs at ``max(its end, the CPU's time)``: a token is out only when
  the GPU produced it and the CPU got to it. In steady state the period is
  ``max(cpu, gpu)``.

No wall clock and no randomness enter the result: two runs give the same records.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol

from tuner.sim._step_rules import cdiv
from tuner.sim.batch import StepBatch
from tuner.sim.load import ClosedLoop, OpenLoop

__all__ = ["AdmissionRules", "ReplayLoop", "StepEngine", "StepTime", "price_function",
           "split_price_function"]

#: A step-time model: a ``StepTimeModel`` (anything with ``step_time_s(batch)``, and for
#: the async clock ``step_parts_s(batch) -> (cpu, gpu)``) or a plain callable
#: ``batch -> seconds`` (all GPU time).
StepTime = Any
_INF = float("inf")
_EMPTY = (0.0, 0.0)


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


@dataclass(frozen=True, slots=True)
class AdmissionRules:
    """Requests refused at arrival, as vLLM refuses them before its scheduler sees them.

    Empty prompt or ``max_tokens < 1``; prompt + output beyond ``max_model_len``; a
    sequence needing more blocks than the whole KV cache (it would preempt itself
    forever); with chunked prefill off, a sequence longer than
    ``max_num_batched_tokens`` (vLLM's config check ``max_num_batched_tokens >=
    max_model_len`` makes that impossible there; the replay checks it per request).
    """

    block_size: int
    num_gpu_blocks: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    max_num_batched_tokens: int = 0

    @classmethod
    def of(cls, settings: Any, cache: Any) -> "AdmissionRules":
        """From ``SchedulerSettings``/``CacheSettings`` or their ``to_dict``/``asdict`` forms."""
        def get(obj: Any, name: str, default: Any = None) -> Any:
            return obj.get(name, default) if isinstance(obj, dict) else getattr(obj, name, default)

        return cls(block_size=int(get(cache, "block_size")),
                   num_gpu_blocks=int(get(cache, "num_gpu_blocks")),
                   max_model_len=int(get(cache, "max_model_len")),
                   enable_chunked_prefill=bool(get(settings, "enable_chunked_prefill", True)),
                   max_num_batched_tokens=int(get(settings, "max_num_batched_tokens", 0) or 0))

    def rejects(self, input_len: int, output_len: int) -> bool:
        longest = input_len + output_len - 1  # tokens computed by its last step
        return (input_len < 1 or output_len < 1
                or input_len + output_len > self.max_model_len
                or cdiv(longest, self.block_size) > self.num_gpu_blocks - 1
                or (not self.enable_chunked_prefill and longest > self.max_num_batched_tokens))


class StepEngine(Protocol):
    """What the loop needs from an engine (the twin, or vLLM's scheduler in a driver).

    Call order: ``add_request``/``reject_request`` for arrivals at the loop time, then
    ``schedule``; the loop prices the step's batch and calls ``start`` with its start
    time and duration before any later ``schedule``; ``update`` applies the step's
    outputs once the batch has ended (with a batch queue deeper than 1, after the next
    ``schedule``). Steps are updated in the order they were scheduled.
    """

    def add_request(self, index: int, source: Any, arrival_s: float) -> None:
        """Request ``index`` (trace position) of ``source`` arrives at ``arrival_s``."""

    def reject_request(self, index: int, source: Any, arrival_s: float) -> None:
        """Request ``index`` arrived at ``arrival_s`` and is refused (AdmissionRules)."""

    def has_requests(self) -> bool:
        """Whether any request is waiting or running."""

    def schedule(self, now_s: float) -> Any:
        """Schedule one step at ``now_s``; None when the engine cannot go on (the loop
        stops, the rest is reported unfinished)."""

    def batch(self, step: Any) -> StepBatch | None:
        """The step's work for the step-time model; None for an empty batch (0 s)."""

    def start(self, step: Any, start_s: float, duration_s: float) -> None:
        """The step runs from ``start_s`` for ``duration_s`` (record it): at depth 1 from
        its scheduling, CPU part included; deeper, its GPU part from the GPU start."""

    def update(self, step: Any, end_s: float) -> int:
        """Apply the step's outputs at ``end_s`` (the batch's end, or later when the CPU
        was still launching the next batch); how many requests finished."""

    def idle(self) -> None:
        """Nothing waiting, running or in flight: the clock jumps to the next arrival."""


class ReplayLoop:
    """Replays ``arrivals`` through ``engine`` on the clock described in the module doc.

    Args:
        engine: a :class:`StepEngine`.
        arrivals: ``(index, source)`` pairs in issue order (arrival time, then index);
            each source has ``arrival_s``, ``input_len`` and ``output_len``. Read lazily:
            only the next pair is held, and the next is read only after the engine took
            the previous one (``add_request``/``reject_request``).
        step_time: see :func:`price_function` (depth 1) and :func:`split_price_function`
            (deeper queues).
        rules: the arrival-time refusals.
        load: ``OpenLoop`` or ``ClosedLoop``.
        num_requests: how many pairs ``arrivals`` yields (for progress).
        batch_queue_depth: batches scheduled ahead of their outputs (1: synchronous).
    """

    def __init__(self, engine: StepEngine, arrivals: Iterable[tuple[int, Any]],
                 step_time: StepTime, rules: AdmissionRules, *,
                 load: OpenLoop | ClosedLoop = OpenLoop(), num_requests: int = 0,
                 batch_queue_depth: int = 1) -> None:
        if batch_queue_depth < 1:
            raise ValueError(f"batch_queue_depth={batch_queue_depth} must be >= 1")
        if not isinstance(load, (OpenLoop, ClosedLoop)):
            raise TypeError(f"load {load!r}: expected OpenLoop or ClosedLoop")
        self.engine = engine
        self.price = price_function(step_time)
        self.price_parts = split_price_function(step_time) if batch_queue_depth > 1 else None
        self.rules = rules
        self.load = load
        self.batch_queue_depth = batch_queue_depth
        self.num_requests = num_requests
        self._arrivals: Iterator[tuple[int, Any]] = iter(arrivals)
        self._head: tuple[int, Any] | None = next(self._arrivals, None)
        self._speedup = load.speedup if isinstance(load, OpenLoop) else 1.0
        self._concurrency = load.concurrency if isinstance(load, ClosedLoop) else 0
        self.now_s = 0.0
        self.num_steps = 0
        self.num_issued = 0
        self.in_flight = 0  # admitted, not finished (the closed loop's count)
        self.stopped = False  # the engine could not go on (StepEngine.schedule -> None)

    # ----------------------------------------------------------------- arrivals
    def next_arrival_s(self) -> float:
        """When the next request arrives (inf if none can arrive without a finish)."""
        if self._head is None:
            return _INF
        if self._concurrency:
            return self.now_s if self.in_flight < self._concurrency else _INF
        return float(self._head[1].arrival_s) / self._speedup

    def _admit_arrivals(self) -> None:
        engine, rules, now = self.engine, self.rules, self.now_s
        closed = self._concurrency
        while self._head is not None:
            index, source = self._head
            if closed:
                if self.in_flight >= closed:
                    return
                arrival = now
            else:
                arrival = float(source.arrival_s) / self._speedup
                if arrival > now:
                    return
            self.num_issued += 1
            if rules.rejects(int(source.input_len), int(source.output_len)):
                engine.reject_request(index, source, arrival)  # frees its closed-loop slot
            else:
                self.in_flight += 1
                engine.add_request(index, source, arrival)
            # Read on only once the engine holds the request: a source reading lazily may
            # renumber what the engine holds when it reads its next window.
            self._head = next(self._arrivals, None)

    # ----------------------------------------------------------------- the loop
    def run(self, progress: Callable[[float], None] | None = None) -> None:
        """Replay to the end; ``progress`` gets the fraction of requests issued (every
        1,000 steps and once at the end). ``now_s`` is the engine-core CPU's time; the
        clock rules are in the module doc."""
        engine, price, depth = self.engine, self.price, self.batch_queue_depth
        parts = self.price_parts  # None at depth 1: one total, CPU then GPU
        queue: deque[tuple[Any, float]] = deque()
        gpu_free_s = 0.0  # when the GPU finishes the last queued batch
        total = max(1, self.num_requests)
        while True:
            self._admit_arrivals()
            if len(queue) < depth and engine.has_requests():
                now = self.now_s
                step = engine.schedule(now)
                if step is None:
                    self.stopped = True
                    break
                batch = engine.batch(step)
                if parts is None:
                    launch = now
                    duration = float(price(batch)) if batch is not None else 0.0
                else:  # the CPU part (schedule, input prep, update of the last batch)
                    cpu, duration = parts(batch) if batch is not None else _EMPTY
                    launch = now + cpu
                start = launch if launch > gpu_free_s else gpu_free_s
                gpu_free_s = start + duration
                engine.start(step, start, duration)
                queue.append((step, gpu_free_s))
                self.num_steps += 1
                self.now_s = launch
                if len(queue) < depth:
                    continue  # the engine loop does not block on a queue with room
            if queue:
                step, end = queue.popleft()
                if end > self.now_s:
                    self.now_s = end  # the CPU waits for the batch's outputs
                self.in_flight -= engine.update(step, self.now_s)
                if progress is not None and self.num_steps % 1000 == 0:
                    progress(self.num_issued / total)
                continue
            nxt = self.next_arrival_s()
            if nxt == _INF:
                break
            if nxt > self.now_s:
                self.now_s = nxt
            engine.idle()
        if progress is not None:
            progress(1.0)
