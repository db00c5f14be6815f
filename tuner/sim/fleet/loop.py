"""One time-ordered replay loop over the engines of a deployment or a fleet.

The single-engine clock of :class:`tuner.sim.loop.ReplayLoop`, run for many engines at
once on one replay clock. Engines are numbered ``replica * dp + rank``. What is new:

* **Routing at arrival.** A request is refused at the front end by ``AdmissionRules``
  (engine -1) or goes to a replica chosen by the router (``tuner.sim.fleet.router``;
  skipped with one replica), then to a DP rank chosen by that replica's API server
  (``tuner.sim.fleet.dp_balancer``, vLLM's internal load balancer; skipped with
  ``dp=1``). A router that targets ranks (prefix-aware) pins the rank itself.
* **Input queues.** As in vLLM's engine core, a request reaches its engine's scheduler
  between steps: it waits in the engine's input queue until the engine's next
  schedule (immediately if the engine is idle).
* **Units.** A *unit* owns a batch queue with its CPU and GPU clocks
  (:class:`tuner.sim.clock.BatchQueue`, the one ``ReplayLoop`` runs for its one engine:
  depth 1: schedule, update, schedule, one total per step; depth 2: schedule(N+1) before
  update(N), the CPU part overlapping the GPU's, docs/step-time-model.md §1.3). Arrivals
  are :class:`tuner.sim.clock.Arrivals`, ``ReplayLoop``'s too; this loop is the sink that
  routes what they issue. A dense model's engines are one unit each: independent engines
  (vLLM runs non-MoE DP ranks as separate ``EngineCoreProc``s, v1/engine/core.py:1546).
* **Lockstep.** A MoE replica's DP ranks are one unit (``DPEngineCoreProc``,
  core.py:2281-2560): while any rank has work every rank steps, a rank with nothing to
  run executes a dummy batch (``execute_dummy_batch``, 2507), and the step ends when
  the slowest rank's does. After each step the DP step counter advances; at step 1 and
  every ``dp_sync_interval`` steps (16, ``_has_global_unfinished_reqs``, 2554-2560) the
  ranks all-reduce whether any has unfinished requests, and if none has, the wave ends:
  the counter returns to 0 (2536-2537) and the ranks idle until a request arrives. The
  counter is each rank's ``prefill_schedule_interval`` clock (``_should_throttle_prefills``,
  2455-2463), so it is handed to every rank before it schedules.
* **Order of events at one instant:** batch ends (updates), then arrivals, then
  schedules, then a closed loop's replacements on their way (sent when a request
  finished at that instant, they reach the front end after every engine scheduled:
  docs/step-time-model.md §1.4; an idle engine picks one up at once); ties between
  engines by engine index. With one engine this is exactly ``ReplayLoop``'s order, so a
  one-engine fleet gives the same records.

The loop knows nothing of the twin: engines are :class:`~tuner.sim.fleet.engines.FleetEngine`s
(the twin's, or vLLM's own scheduler in the vLLM-core driver).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.records import RequestTable
from tuner.sim.batch import StepBatch
from tuner.sim.fleet.dp_balancer import STATS_INTERVAL_S, DPLoadBalancer
from tuner.sim.fleet.engines import FleetEngine
from tuner.sim.fleet.router import Router
from tuner.sim.clock import (INF, Arrivals, BatchQueue, StepTime, launch_price_function,
                             price_function, rank_price_function)
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.loop import AdmissionRules

__all__ = ["DP_SYNC_INTERVAL", "DUMMY_BATCH", "FleetLoop"]

_UPDATE, _ARRIVAL, _SCHEDULE = 0, 1, 2
#: vLLM ``ParallelConfig.dp_sync_interval`` default (config/parallel.py:163).
DP_SYNC_INTERVAL = 16
#: vLLM's dummy forward for an idle DP rank: one token (``_dummy_run(1)``).
DUMMY_BATCH = StepBatch(num_decode_reqs=1, decode_ctx_tokens=1)


@dataclass(slots=True)
class _Unit:
    """Engines that share a batch queue and a GPU clock (one, or a lockstep group)."""

    index: int
    engines: tuple[int, ...]
    lockstep: bool
    batches: BatchQueue  # (steps, end_s); steps: one per engine, None for a dummy batch
    version: int = 0  # bumps when its pending event changes (stale heap entries)
    active: bool = False  # has a pending event
    wave_running: bool = False  # lockstep: engines_running
    step_counter: int = 0  # lockstep: DPEngineCoreProc.step_counter
    #: one engine, priced alone (no lockstep, no expert-parallel group price): its
    #: schedule takes ``FleetLoop._schedule_solo``, the same step without the group's
    #: per-rank lists (every P/D and dense-replica unit; the per-event cost a P/D
    #: replay pays on top of its engines' own work)
    solo: bool = False


class FleetLoop:
    """Replays ``arrivals`` through ``engines`` (see the module doc).

    Args:
        engines: ``replicas * dp`` fleet engines, in engine order.
        arrivals: ``(index, source)`` in issue order (as ``ReplayLoop``).
        step_time: prices a batch (``price_function``); the same for every engine.
        rules: the front end's refusals.
        table: the shared request table (its ``engine`` column is written here).
        dp: ranks per replica; ``replicas``: copies behind the router.
        lockstep: MoE replica (ranks step together) or dense (independent engines).
        router: picks a replica (or an engine); None with one replica.
        load, num_requests, batch_queue_depth: as ``ReplayLoop``.
        dp_sync_interval, stats_interval_s: vLLM's DP sync period (steps) and the DP
            coordinator's publishing period (seconds).
    """

    def __init__(self, engines: Sequence[FleetEngine], arrivals: Iterable[tuple[int, Any]],
                 step_time: StepTime, rules: AdmissionRules, table: RequestTable, *,
                 dp: int, replicas: int, lockstep: bool, router: Router | None = None,
                 load: OpenLoop | ClosedLoop = OpenLoop(), num_requests: int = 0,
                 batch_queue_depth: int = 1, dp_sync_interval: int = DP_SYNC_INTERVAL,
                 stats_interval_s: float = STATS_INTERVAL_S) -> None:
        if len(engines) != dp * replicas:
            raise ValueError(f"{len(engines)} engines for dp={dp} x replicas={replicas}")
        if replicas > 1 and router is None:
            raise ValueError("a fleet of several replicas needs a router")
        self.engines = list(engines)
        self.price = price_function(step_time)
        #: (cpu, gpu) per batch as ``BatchQueue.launch`` takes them (ReplayLoop's prices)
        self.launch_price = launch_price_function(step_time, batch_queue_depth)
        #: expert parallelism over DP ranks: each rank's experts serve the whole group's
        #: tokens, so a lockstep rank is priced by ``rank_step_time_s(batch,
        #: group_tokens)``, not as a balanced step
        self.rank_price = rank_price_function(step_time) if lockstep else None
        self.rules = rules
        self.table = table
        self.dp, self.replicas = dp, replicas
        self.router = router
        self.depth = batch_queue_depth
        self.sync_interval = dp_sync_interval
        self.num_requests = num_requests
        self.arrivals = Arrivals(arrivals, rules, load)
        self.balancers = [DPLoadBalancer(dp, self._counts_of(r), stats_interval_s=stats_interval_s)
                          for r in range(replicas)] if dp > 1 else []
        if lockstep and dp > 1:
            self.units = [_Unit(r, tuple(range(r * dp, (r + 1) * dp)), True,
                                BatchQueue(batch_queue_depth)) for r in range(replicas)]
        else:
            self.units = [_Unit(e, (e,), False, BatchQueue(batch_queue_depth))
                          for e in range(dp * replicas)]
        for unit in self.units:
            unit.solo = not unit.lockstep and self.rank_price is None
        self.unit_of = [0] * len(self.engines)
        for unit in self.units:
            for e in unit.engines:
                self.unit_of[e] = unit.index
        self.pending: list[list[tuple[int, Any, float]]] = [[] for _ in self.engines]
        self.now_s = 0.0
        self.num_steps = 0  # executed unit steps (a lockstep step counts once)
        self.num_rejected = 0
        self.stopped = False
        self._heap: list[tuple[float, int, int, int]] = []
        #: hooks for pools of unlike engines (tuner.sim.disagg): each unit's launch price
        #: (all the same here) and the length of a step that scheduled nothing (None: 0 s)
        self.unit_prices = [self.launch_price] * len(self.units)
        self.empty_step_s: Callable[[_Unit, float], float] | None = None

    def _counts_of(self, replica: int) -> Callable[[int], tuple[int, int, float]]:
        engines, dp = self.engines, self.dp
        return lambda rank: engines[replica * dp + rank].request_counts()

    def first_token(self, engine: int, index: int) -> bool:
        """The router's view of a request's first token (False while still queued)."""
        if any(i == index for i, _, _ in self.pending[engine]):
            return False
        return self.engines[engine].has_first_token(index)

    # ----------------------------------------------------------------- events
    def _push(self, unit: _Unit, time_s: float, phase: int) -> None:
        unit.version += 1
        unit.active = True
        heapq.heappush(self._heap, (time_s, phase, unit.index, unit.version))

    # ----------------------------------------------------------------- the front end
    def reject_request(self, index: int, source: Any, arrival_s: float) -> None:
        """``Arrivals`` refused it (``AdmissionRules``): recorded at engine -1."""
        self.table.record(index, "rejected", arrival_s)
        self.table.engine[index] = -1
        self.num_rejected += 1

    def add_request(self, index: int, source: Any, arrival_s: float) -> None:
        """Route an admitted request to its engine's input queue; an idle engine picks it
        up at once."""
        engine = self._route(index, source, arrival_s)
        self.table.engine[index] = engine
        self.pending[engine].append((index, source, arrival_s))
        unit = self.units[self.unit_of[engine]]
        if not unit.active:
            self._push(unit, arrival_s, _SCHEDULE)

    def _route(self, index: int, source: Any, arrival: float) -> int:
        dp, router = self.dp, self.router
        if router is not None and (self.replicas > 1 or router.targets_engines):
            target = router.route(index, source, arrival)
            if router.targets_engines:
                if dp > 1:
                    self.balancers[target // dp].assign(index, target % dp)
                return target
            replica = target
        else:
            replica = 0
        if dp == 1:
            return replica
        return replica * dp + self.balancers[replica].choose(index, arrival)

    def _observe(self, time_s: float) -> None:
        for balancer in self.balancers:
            balancer.observe(time_s)

    # ----------------------------------------------------------------- the loop
    def run(self, progress: Callable[[float], None] | None = None) -> None:
        """Replay to the end; ``progress`` as ``ReplayLoop.run``."""
        heap, units, arrivals = self._heap, self.units, self.arrivals
        balancers = self.balancers  # DP > 1 only: the others skip the call per event
        total = max(1, self.num_requests)
        last_report = 0
        while True:
            while heap and heap[0][3] != units[heap[0][2]].version:
                heapq.heappop(heap)
            arrival = arrivals.next_arrival_s(self.now_s)
            if arrival != INF and (not heap or arrival < heap[0][0]
                                    or (arrival == heap[0][0] and heap[0][1] == _SCHEDULE
                                        and not arrivals.next_is_on_the_way())):
                if arrival > self.now_s:
                    self.now_s = arrival
                if balancers:
                    self._observe(self.now_s)
                arrivals.issue(self.now_s, self)
                continue
            if not heap:
                break
            time_s, phase, u, _ = heapq.heappop(heap)
            unit = units[u]
            unit.active = False
            if time_s > self.now_s:
                self.now_s = time_s
            if balancers:
                self._observe(self.now_s)
            if phase == _UPDATE:
                self._update(unit)
            elif unit.solo:
                self._schedule_solo(unit)
            else:
                self._schedule(unit)
            if self.stopped:
                break
            if progress is not None and self.num_steps - last_report >= 1000:
                last_report = self.num_steps
                progress(arrivals.num_issued / total)
        if progress is not None:
            progress(1.0)

    def _deliver(self, unit: _Unit) -> None:
        for e in unit.engines:
            queued = self.pending[e]
            if queued:
                engine = self.engines[e]
                for index, source, arrival in queued:
                    engine.add_request(index, source, arrival)
                queued.clear()

    def _schedule(self, unit: _Unit) -> None:
        self._deliver(unit)
        now, engines = self.now_s, self.engines
        busy = [engines[e].has_requests() for e in unit.engines]
        runs = any(busy) or (unit.lockstep and unit.wave_running)
        queue = unit.batches
        launched = False
        if len(queue.queue) < self.depth and runs:
            steps: list[Any] = []
            batches: list[StepBatch | None] = []
            duration = cpu = 0.0  # a lockstep step: the slowest rank's CPU and GPU parts
            price = self.unit_prices[unit.index]
            if unit.lockstep:
                unit.wave_running = True
            for e, has_work in zip(unit.engines, busy):
                engine = engines[e]
                if unit.lockstep:
                    engine.align_step_counter(unit.step_counter)
                batch: StepBatch | None = DUMMY_BATCH
                if has_work:
                    step = engine.schedule(now)
                    if step is None:
                        self.stopped = True
                        return
                    batch = engine.batch(step)
                    steps.append(step)
                else:
                    steps.append(None)
                batches.append(batch)
            group_tokens = 0
            if self.rank_price is not None:
                group_tokens = sum(b.num_prefill_tokens + b.num_decode_reqs
                                   for b in batches if b is not None)
            for batch in batches:
                if batch is None:
                    continue  # an empty batch: 0 s
                c, cost = price(batch)  # depth 1: c is 0 (the total is in cost)
                if c > cpu:
                    cpu = c
                if group_tokens:
                    # the experts' work of the whole group, not of a balanced step
                    cost += self.rank_price(batch, group_tokens) - self.price(batch)
                if cost > duration:
                    duration = cost
            if not duration and self.empty_step_s is not None:
                duration = self.empty_step_s(unit, now)  # e.g. waiting for a KV transfer
            start = queue.launch(steps, now, cpu, duration)
            for e, step in zip(unit.engines, steps):
                if step is None:
                    engines[e].dummy_step(start, duration)
                else:
                    engines[e].start(step, start, duration)
            self.num_steps += 1
            launched = True
        if not self._push_next(unit, launched):
            for e in unit.engines:  # nothing waiting, running or in flight: idle
                engines[e].idle()

    def _push_next(self, unit: _Unit, launched: bool) -> bool:
        """The unit's next event after a schedule (False: none, the unit idles): another
        schedule when it launched a step and its batch queue has room, else the update of
        its oldest batch in flight."""
        queue = unit.batches
        if launched and len(queue.queue) < self.depth:
            self._push(unit, queue.cpu_free_s, _SCHEDULE)
            return True
        if queue.queue:
            # the CPU waits for the oldest batch once it has launched its last one
            self._push(unit, queue.outputs_s(), _UPDATE)
            return True
        return False

    def _schedule_solo(self, unit: _Unit) -> None:
        """``_schedule`` for a one-engine unit priced alone (``_Unit.solo``): the same
        launch, in the same order, without the per-rank lists a lockstep group needs."""
        self._deliver(unit)
        engine = self.engines[unit.engines[0]]
        now = self.now_s
        queue = unit.batches
        launched = False
        if len(queue.queue) < self.depth and engine.has_requests():
            step = engine.schedule(now)
            if step is None:
                self.stopped = True
                return
            batch = engine.batch(step)
            cpu = duration = 0.0  # None: an empty batch, 0 s
            if batch is not None:  # one batch: its price is the step's (no max over ranks)
                cpu, duration = self.unit_prices[unit.index](batch)
            if not duration and self.empty_step_s is not None:
                duration = self.empty_step_s(unit, now)  # e.g. waiting for a KV transfer
            engine.start(step, queue.launch([step], now, cpu, duration), duration)
            self.num_steps += 1
            launched = True
        if not self._push_next(unit, launched):
            engine.idle()  # nothing waiting, running or in flight

    def _update(self, unit: _Unit) -> None:
        steps, end = unit.batches.pop(self.now_s)
        engines, router = self.engines, self.router
        for e, step in zip(unit.engines, steps):
            if step is None:
                continue
            engine = engines[e]
            finished = engine.update(step, end)
            if finished:
                self.arrivals.release(finished, end)
            done = engine.take_finished()
            if done:
                balancer = self.balancers[e // self.dp] if self.balancers else None
                for index in done:
                    if router is not None and (self.replicas > 1 or router.targets_engines):
                        router.finished(index)
                    if balancer is not None:
                        balancer.finished(index)
        if unit.lockstep:
            unit.step_counter += 1
            counter = unit.step_counter
            if counter == 1 or counter % self.sync_interval == 0:
                if not any(engines[e].has_requests() for e in unit.engines):
                    unit.wave_running = False  # the wave ends
                    unit.step_counter = 0
        self._push(unit, self.now_s, _SCHEDULE)
