"""The single-engine replay loop: the step sequence of one engine on the replay clock.

One loop drives both the twin (``tuner.sim.engine``) and vLLM's own scheduler
(``tuner.vllm_core.driver``, which runs inside a vLLM interpreter, so this module is
plain Python). Each engine implements :class:`StepEngine`; the loop decides *when*
things happen, the engine *what* happens. The clock's rules below are written once, in
:mod:`tuner.sim.clock` (``Arrivals``, ``BatchQueue``, ``launch_price_function``), and the
fleet's loop (``tuner.sim.fleet.loop``) runs the same objects for many engines:

* **Arrivals.** Requests are issued in order of arrival time, ties by trace position.
  Open loop: a request reaches the engine at ``arrival_s / speedup`` of the replay clock.
  Closed loop: ``concurrency`` requests in flight, the next one sent when one finishes
  or is rejected; a replacement misses the schedule at the instant its predecessor
  finished and joins the one after (vLLM's engine core has scheduled again before the
  client's new request exists, docs/step-time-model.md §1.4), unless the engine is idle.
  A request that can never run is refused at arrival by :class:`AdmissionRules`, the one
  copy of those rules (``Arrivals`` asks it).
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
  price the two parts apart (``split_price_function``) and keep two clocks: the
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

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from tuner.sim._step_rules import cdiv
from tuner.sim.batch import StepBatch
from tuner.sim.clock import INF, Arrivals, BatchQueue, StepTime, launch_price_function
from tuner.sim.load import ClosedLoop, OpenLoop

__all__ = ["AdmissionRules", "ReplayLoop", "StepEngine", "StepTime"]

_EMPTY = (0.0, 0.0)


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

    The clock's rules live in :mod:`tuner.sim.clock` (:class:`~tuner.sim.clock.Arrivals`,
    :class:`~tuner.sim.clock.BatchQueue`), shared with the fleet's loop; this class is
    their one-engine sequence.

    Args:
        engine: a :class:`StepEngine`.
        arrivals: ``(index, source)`` pairs in issue order (arrival time, then index);
            each source has ``arrival_s``, ``input_len`` and ``output_len``. Read lazily:
            only the next pair is held, and the next is read only after the engine took
            the previous one (``add_request``/``reject_request``).
        step_time: see :func:`~tuner.sim.clock.launch_price_function`.
        rules: the arrival-time refusals.
        load: ``OpenLoop`` or ``ClosedLoop``.
        num_requests: how many pairs ``arrivals`` yields (for progress).
        batch_queue_depth: batches scheduled ahead of their outputs (1: synchronous;
            ``tuner.sim.clock.batch_queue_depth`` maps the scheduling mode to it).
    """

    def __init__(self, engine: StepEngine, arrivals: Iterable[tuple[int, Any]],
                 step_time: StepTime, rules: AdmissionRules, *,
                 load: OpenLoop | ClosedLoop = OpenLoop(), num_requests: int = 0,
                 batch_queue_depth: int = 1) -> None:
        self.batches = BatchQueue(batch_queue_depth)
        self.arrivals = Arrivals(arrivals, rules, load)
        self.engine = engine
        self.price = launch_price_function(step_time, batch_queue_depth)
        self.rules = rules
        self.load = load
        self.batch_queue_depth = batch_queue_depth
        self.num_requests = num_requests
        self.now_s = 0.0
        self.num_steps = 0
        self.stopped = False  # the engine could not go on (StepEngine.schedule -> None)

    # ----------------------------------------------------------------- the loop
    def run(self, progress: Callable[[float], None] | None = None) -> None:
        """Replay to the end; ``progress`` gets the fraction of requests issued (every
        1,000 steps and once at the end). ``now_s`` is the engine-core CPU's time; the
        clock rules are in the module doc."""
        engine, price, arrivals, batches = self.engine, self.price, self.arrivals, self.batches
        queue, depth, launch, pop = batches.queue, batches.depth, batches.launch, batches.pop
        total = max(1, self.num_requests)
        wait = getattr(engine, "empty_step_s", None)
        while True:
            if arrivals.next_s <= self.now_s:
                arrivals.issue_due(self.now_s, engine)
            if len(queue) < depth and engine.has_requests():
                now = self.now_s
                step = engine.schedule(now)
                if step is None:
                    self.stopped = True
                    break
                batch = engine.batch(step)
                if batch is not None:
                    cpu, gpu = price(batch)
                elif wait is None:
                    cpu, gpu = _EMPTY
                else:  # a KV connector's empty step waits for a transfer
                    cpu, gpu = 0.0, wait(now, arrivals.next_s)
                engine.start(step, launch(step, now, cpu, gpu), gpu)
                self.num_steps += 1
                self.now_s = now + cpu  # the CPU launched it
                if len(queue) < depth:
                    continue  # the engine loop does not block on a queue with room
            if queue:
                step, self.now_s = pop(self.now_s)  # the CPU waits for the batch's outputs
                finished = engine.update(step, self.now_s)
                if finished:
                    arrivals.release(finished, self.now_s)
                if progress is not None and self.num_steps % 1000 == 0:
                    progress(arrivals.num_issued / total)
                continue
            nxt = arrivals.next_arrival_s(self.now_s)
            if nxt == INF:
                break
            if nxt > self.now_s:
                self.now_s = nxt
            arrivals.engine_idle()  # a replacement on its way reaches an idle engine at once
            engine.idle()
        if progress is not None:
            progress(1.0)
