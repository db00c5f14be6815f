"""``FleetSimulator``: the twin's replay of a data-parallel deployment or a fleet.

``replicas x dp`` engine twins (``FleetTwinEngine``), each with its own scheduler and
KV cache, on one clock (``tuner.sim.fleet.loop.FleetLoop``). The result is one
``ReplayResult`` for the whole deployment, as the single-engine ``Simulator`` gives:

* ``requests``: one table, trace order, with the ``engine`` column filled in;
* ``itl_samples``: every engine's gaps, pooled; ``counters``: sums over engines (plus
  ``num_engines``, ``dummy_steps``); ``steps`` (with ``record_steps``): engine by engine;
* ``timeseries``: the deployment at each engine step: waiting and running summed over
  the engines, KV usage averaged (each engine's latest value), scheduled tokens of that
  step;
* ``engines``: one ``EngineSummary`` per engine.

Why not the single-engine ``Simulator`` N times: engines of one deployment share the
arrivals (who gets which request depends on every engine's state at that instant) and,
for MoE models, the step clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from tuner.records import EngineSummary, GapSamples, ReplayResult, StepRecord
from tuner.sim.clock import batch_queue_depth
from tuner.sim.engine import ListArrivals
from tuner.sim.fleet.engines import FleetTwinEngine
from tuner.sim.fleet.loop import DP_SYNC_INTERVAL, FleetLoop
from tuner.sim.fleet.router import RouterSettings, make_router
from tuner.sim.fleet.timeseries import merge_timeseries
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.loop import AdmissionRules, StepTime
from tuner.sim.scheduler import Scheduler
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

__all__ = ["FleetSimulator", "merge_timeseries", "pool_gaps"]


class FleetSimulator:
    """Replay ``requests`` on ``replicas`` copies of a ``dp``-rank deployment.

    Args:
        requests: as ``Simulator`` (a request list, an in-memory interned list with
            ``num_hash_ids``, or a streaming source that interns as it reads: it binds
            every engine's scheduler into one id space, ``tuner.sim.hash_space.
            FleetIdSpace``; refused for the prefix-aware router, whose block counts are
            indexed by hash id).
        settings, cache, step_time: per engine (one TP group), as ``Simulator``.
        dp: ranks per replica (vLLM ``--data-parallel-size``); ``replicas``: copies.
        moe: the model is a mixture of experts, so a replica's ranks run in lockstep
            (vLLM's ``DPEngineCoreProc``); dense ranks are independent.
        router: the router in front of the replicas (ignored with one replica unless
            it targets ranks).
        options, load, num_gpus, num_hash_ids: as ``Simulator`` (each engine's batch
            queue is ``tuner.sim.clock.batch_queue_depth(options.async_scheduling)``).
    """

    def __init__(self, requests: Iterable[Any], settings: SchedulerSettings,
                 cache: CacheSettings, step_time: StepTime, *, dp: int = 1,
                 replicas: int = 1, moe: bool = False,
                 router: RouterSettings = RouterSettings(),
                 options: SimOptions = SimOptions(), load: OpenLoop | ClosedLoop = OpenLoop(),
                 num_gpus: int = 1, num_hash_ids: int | None = None,
                 dp_sync_interval: int = DP_SYNC_INTERVAL) -> None:
        if hasattr(requests, "bind") and hasattr(requests, "table"):
            source = requests
        else:
            source = ListArrivals(requests, num_hash_ids)
        self.source = source
        self.dp, self.replicas, self.moe = dp, replicas, moe
        self.lockstep = moe and dp > 1
        self.num_gpus = num_gpus
        self.router_settings = router
        rank_options = options
        if self.lockstep:  # the DP wave counter paces prefill_schedule_interval
            rank_options = replace(options, prefill_interval_mode="dp")
        self.table = source.table()
        self.engines: list[FleetTwinEngine] = []
        for _ in range(dp * replicas):
            scheduler = Scheduler(settings, cache, rank_options,
                                  num_hash_ids=source.num_hash_ids)
            source.bind(scheduler)
            self.engines.append(FleetTwinEngine(scheduler, cache.block_size, rank_options,
                                                self.table))
        engines = self.engines
        if hasattr(source, "hold_in_transit"):  # a stream: its renumbering sees the queues
            source.hold_in_transit(lambda: [s for queue in self.loop.pending
                                            for _, s, _ in queue])
        # The session router refuses a trace without session ids: a list is checked by its
        # requests, a stream by its table's session column ([] = none carries one).
        sources = getattr(source, "sources", None)
        if sources is None and not any(self.table.session_id or ()):
            sources = []
        router_obj = None
        if replicas > 1 or router.policy == "prefix-aware":
            router_obj = make_router(
                router, replicas, dp, kv_block_size=cache.block_size,
                num_hash_ids=source.num_hash_ids,
                cached_blocks=lambda e, s: engines[e].cached_prefix_blocks(s),
                first_token=lambda e, i: self.loop.first_token(e, i),
                sources=sources)
            if hasattr(source, "hold_hash_ids") and hasattr(router_obj, "mark_hash_ids"):
                source.hold_hash_ids(router_obj)  # a stream renumbers its counts too
        self.loop = FleetLoop(engines, source, step_time, AdmissionRules.of(settings, cache),
                              self.table, dp=dp, replicas=replicas, lockstep=self.lockstep,
                              router=router_obj, load=load, num_requests=source.num_requests,
                              batch_queue_depth=batch_queue_depth(options.async_scheduling),
                              dp_sync_interval=dp_sync_interval)

    def run(self, progress: Callable[[float], None] | None = None) -> ReplayResult:
        """Replay to the end; ``progress`` gets the fraction of requests issued."""
        return self._result(run_engines(self.engines, self.loop, progress))

    def engine_summaries(self) -> list[EngineSummary]:
        return [engine_summary(e, engine, replica=e // self.dp, dp_rank=e % self.dp,
                               num_dummy_steps=engine.num_dummy_steps)
                for e, engine in enumerate(self.engines)]

    def _result(self, wall_s: float) -> ReplayResult:
        engines, table = self.engines, self.table
        steps: list[StepRecord] | None = [] if engines[0].steps is not None else None
        for engine in engines:
            if steps is not None and engine.steps is not None:
                steps.extend(engine.steps)
        summaries = self.engine_summaries()
        gaps = pool_gaps(engines)
        counters: dict[str, float] = {
            "prefix_cache_queries": sum(e.prefix_cache_queries for e in summaries),
            "prefix_cache_hits": sum(e.prefix_cache_hits for e in summaries),
            "preemptions": sum(e.preemptions for e in summaries),
            "num_steps": sum(e.num_steps for e in summaries),
            "rejected": self.loop.num_rejected,
            "num_requests": len(table),
            "num_finished": sum(e.num_finished for e in summaries),
            "num_engines": len(engines),
            "dummy_steps": sum(e.num_dummy_steps for e in summaries),
        }
        first_arrival = min((a for a in table.arrival_s if a == a), default=0.0)
        now = self.loop.now_s
        notes = [f"fleet: {self.replicas} replica(s) x DP {self.dp}"
                 + (f" ({'lockstep MoE' if self.lockstep else 'independent'} ranks)"
                    if self.dp > 1 else "")
                 + (f", router {self.router_settings.policy}" if self.replicas > 1 else ""),
                 "timeseries: the deployment at each engine step (waiting/running summed, "
                 "KV usage averaged over engines)"]
        return ReplayResult(
            backend="sim", requests=table, itl_samples=gaps,
            timeseries=merge_timeseries([e.timeseries for e in engines], compact=True),
            counters=counters, simulated_s=max(0.0, now - min(first_arrival, now)),
            wall_s=wall_s, num_gpus=self.num_gpus, steps=steps, notes=notes,
            engines=summaries)


def run_engines(engines: "list[Any]", loop: Any,
                progress: Callable[[float], None] | None) -> float:
    """Run a fleet loop over its engines to the end; the wall seconds it took. Interned
    requests are materialised before (the loop reads them) and after (records need them)."""
    wall0 = time.perf_counter()
    for engine in engines:
        engine.scheduler.materialize_all()
    loop.run(progress)
    for engine in engines:
        engine.scheduler.materialize_all()
        engine.finish()
    return time.perf_counter() - wall0


def engine_summary(index: int, engine: Any, *, replica: int, dp_rank: int,
                   num_dummy_steps: int = 0) -> EngineSummary:
    """One engine's line of a fleet's replay (``ReplayResult.engines``)."""
    scheduler = engine.scheduler
    kv = engine.timeseries["kv_usage"]
    return EngineSummary(
        engine=index, replica=replica, dp_rank=dp_rank,
        num_requests=engine.num_added, num_finished=engine.num_finished,
        prefix_cache_queries=scheduler.prefix_cache_queries,
        prefix_cache_hits=scheduler.prefix_cache_hits,
        preemptions=scheduler.num_preemptions,
        kv_usage_mean=sum(kv) / len(kv) if kv else float("nan"),
        kv_usage_max=max(kv) if kv else float("nan"),
        num_steps=engine.num_steps, num_dummy_steps=num_dummy_steps)


def pool_gaps(engines: "list[Any]") -> GapSamples:
    """Every engine's inter-token gaps in one pool, engine by engine (the order the
    metrics read them in). The engines' own pools are moved, not copied, and left empty:
    an 8-engine fleet's six hours are ~8 M pairs, 128 MB a copy."""
    gaps = GapSamples()
    for engine in engines:
        own = engine.itl_samples
        if not len(gaps):
            gaps.gap_s, gaps.count = own.gap_s, own.count
        else:
            gaps.gap_s.extend(own.gap_s)
            gaps.count.extend(own.count)
        engine.itl_samples = GapSamples()
    gaps.maybe_compact()
    return gaps
