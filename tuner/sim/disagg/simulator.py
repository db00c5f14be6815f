"""``PDSimulator``: the twin's replay of a disaggregated prefill/decode deployment.

``P`` prefill and ``D`` decode instances, each a full twin engine (scheduler, prefix
cache, scheduling mode) with its own pool's KV capacity and step-time model, on one
clock (:class:`tuner.sim.disagg.loop.PDLoop`). Its ``ReplayResult`` is a fleet's
(``tuner.sim.fleet.simulator``): one record per request as the user saw it (the
decoder's tokens; TTFT from the arrival at the proxy to the decoder's first token), one
``EngineSummary`` per engine (prefill engines first), and ``pd_*`` counters:

* the TTFT split, mean and p50/p90 over finished requests (seconds): ``prefill_queue``
  (arrival -> first prefill schedule), ``prefill`` (-> the prefill's token),
  ``decode_queue`` (-> the read starts: the decoder admits the request and allocates its
  blocks), ``transfer`` (the read), ``first_decode`` (-> the decoder's first token);
  the five add up to the request's TTFT;
* per pool (``prefill_*``, ``decode_*``): GPU utilisation (busy step time / span),
  mean KV usage, prefix-cache queries and hits, GPUs;
* the transfers: reads, blocks, bytes, link seconds.
"""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from tuner.errors import ConfigError
from tuner.records import _STATUS_CODES, EngineSummary, GapSamples, ReplayResult, StepRecord
from tuner.sim.clock import batch_queue_depth
from tuner.sim.disagg.engines import (DecodeEngine, PrefillEngine, fence_decoder,
                                      replace_kv_cache_manager)
from tuner.sim.disagg.loop import PDLoop
from tuner.sim.disagg.nixl import HoldingKVCacheManager
from tuner.sim.disagg.settings import PDSettings
from tuner.sim.engine import ListArrivals
from tuner.sim.kv_cache_manager import KVCacheManager
from tuner.sim.fleet.simulator import engine_summary, merge_timeseries, run_engines
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.loop import AdmissionRules, StepTime
from tuner.sim.scheduler import Scheduler
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

__all__ = ["PDPool", "PDSimulator", "TTFT_PARTS"]

_FINISHED = _STATUS_CODES.index("finished")

#: the TTFT split, in order (see the module doc)
TTFT_PARTS = ("prefill_queue", "prefill", "decode_queue", "transfer", "first_decode")


def hold_at_free(scheduler: Scheduler, num_hash_ids: int | None) -> None:
    """Give a fresh prefill scheduler the manager whose free keeps the blocks its
    connector holds for the decoder's read (``HoldingKVCacheManager``: the same pool
    state as freeing and taking them back, without the two passes). Built like
    ``fence_decoder``'s: before anything is allocated or bound."""
    old = scheduler.kv_cache_manager
    assert type(old) is KVCacheManager, (
        f"a prefill instance runs the plain manager, not {type(old).__name__} (tuner bug)")
    replace_kv_cache_manager(scheduler, HoldingKVCacheManager, num_hash_ids)


class PDPool:
    """One pool's per-engine inputs: scheduler settings, KV cache and step-time model."""

    def __init__(self, settings: SchedulerSettings, cache: CacheSettings,
                 step_time: StepTime) -> None:
        self.settings, self.cache, self.step_time = settings, cache, step_time


class PDSimulator:
    """Replay ``requests`` on a P:D deployment (see the module doc).

    Args:
        requests: as ``FleetSimulator`` (a list, or a streaming source that binds every
            engine's scheduler into one id space).
        prefill, decode: the two pools.
        pd: the deployment's shape and transfer figures.
        options, load, num_hash_ids: as ``Simulator``.
        aborts: trace index -> when the client aborts the request (seconds on the
            replay clock); replayed while the request's KV is in flight to its decoder
            (``DecodeEngine``), recorded ``aborted``. A trace carries no abort times
            (its ``status`` says a request was aborted, not when), so a replay from the
            CLI has none.
    """

    def __init__(self, requests: Iterable[Any], prefill: PDPool, decode: PDPool,
                 pd: PDSettings, *, options: SimOptions = SimOptions(),
                 load: OpenLoop | ClosedLoop = OpenLoop(),
                 num_hash_ids: int | None = None,
                 aborts: dict[int, float] | None = None) -> None:
        pd.validate()
        if options.speculative is not None or options.kv_offload is not None:
            raise ConfigError("--pd with speculative decoding or a CPU KV tier is not "
                              "modelled yet: replay one or the other")
        if prefill.cache.block_size != decode.cache.block_size:
            raise ConfigError(f"--pd: the pools' KV block sizes differ "
                              f"({prefill.cache.block_size} and {decode.cache.block_size}); pass "
                              "--block-size so NIXL moves whole blocks of one size")
        if hasattr(requests, "bind") and hasattr(requests, "table"):
            source: Any = requests
        else:
            source = ListArrivals(requests, num_hash_ids)
        if aborts:  # an abort lands between schedules: the plain step takes every one
            options = replace(options, fast_forward=False)
        self.aborts = dict(aborts or {})
        self.source = source
        self.pd = pd
        self.table = source.table()
        self.prefill_times: dict[int, tuple[float, float, int, int]] = {}
        self.reads: dict[int, tuple[float, float]] = {}  # trace index -> read (start, end)
        self.prefill: list[PrefillEngine] = []
        self.decode: list[DecodeEngine] = []
        for _ in range(pd.num_prefill):
            scheduler = Scheduler(prefill.settings, prefill.cache, options,
                                  num_hash_ids=source.num_hash_ids)
            hold_at_free(scheduler, source.num_hash_ids)
            source.bind(scheduler)
            engine = PrefillEngine(scheduler, prefill.cache.block_size, options, self.table,
                                   pd)
            scheduler.kv_cache_manager.keep = engine.connector.keep_at_free
            scheduler.kv_cache_manager.kept_hashed = engine.connector.kept_hashed
            engine.prefill_times = self.prefill_times
            self.prefill.append(engine)
        for _ in range(pd.num_decode):
            scheduler = Scheduler(decode.settings, decode.cache, options,
                                  num_hash_ids=source.num_hash_ids)
            if options.async_scheduling:  # vLLM's defer_block_free on a kv_consumer
                fence_decoder(scheduler, source.num_hash_ids)
            source.bind(scheduler)
            self.decode.append(DecodeEngine(scheduler, decode.cache.block_size, options,
                                            self.table, pd, self._on_read,
                                            self.prefill_times, self.aborts))
            if pd.variant == "push":  # the request's prefill engine times the write
                self.decode[-1].connector.push_write = self._push_write
        if hasattr(source, "hold_in_transit"):  # a stream: its renumbering sees the queues
            source.hold_in_transit(self._in_transit)
        self.loop = PDLoop(self.prefill, self.decode, source, prefill.step_time,
                           decode.step_time, AdmissionRules.of(prefill.settings, prefill.cache),
                           AdmissionRules.of(decode.settings, decode.cache), self.table,
                           load=load, num_requests=source.num_requests,
                           batch_queue_depth=batch_queue_depth(options.async_scheduling),
                           router=self._router(decode.cache.block_size, source.num_hash_ids))

    def _router(self, block_size: int, num_hash_ids: int) -> Any:
        """The proxy's choices (``tuner.sim.disagg.routers``); it reads the engines and,
        once built, the loop's input queues."""
        from tuner.sim.disagg.routers import PDView, make_pd_router

        engines = self.engines

        def waiting(e: int) -> int:
            return len(self.loop.pending[e]) + len(engines[e].scheduler.waiting)

        view = PDView(self.pd.num_prefill, self.pd.num_decode, kv_block_size=block_size,
                      num_hash_ids=num_hash_ids or 0,
                      cached_blocks=lambda e, s: engines[e].cached_prefix_blocks(s),
                      waiting=waiting, first_token=lambda e, i: self.loop.first_token(e, i))
        return make_pd_router(self.pd.router, view)

    @property
    def engines(self) -> list[Any]:
        return [*self.prefill, *self.decode]

    def _in_transit(self) -> list[Any]:
        held = [s for queue in self.loop.pending for _, s, _ in queue]
        for engine in self.prefill:
            held.extend(engine.sources.values())
        return held

    def _push_write(self, index: int, ready_s: float, num_blocks: int) -> tuple[float, float]:
        prefill = self.prefill[self.loop.prefill_of[index]]
        return prefill.connector.write(index, ready_s, num_blocks)

    def _on_read(self, index: int, start_s: float, end_s: float) -> None:
        self.reads[index] = (start_s, end_s)
        self.loop.read_started(index, start_s, end_s)

    def run(self, progress: Callable[[float], None] | None = None) -> ReplayResult:
        """Replay to the end; ``progress`` gets the fraction of requests issued."""
        return self._result(run_engines(self.engines, self.loop, progress))

    # ----------------------------------------------------------------- results
    def _summaries(self) -> list[EngineSummary]:
        return [engine_summary(e, engine, replica=e, dp_rank=0)
                for e, engine in enumerate(self.engines)]

    def ttft_parts(self) -> dict[str, np.ndarray]:
        """The TTFT split (module doc) of every finished request, seconds, trace order."""
        table, reads, times = self.table, self.reads, self.prefill_times
        parts: dict[str, list[float]] = {k: [] for k in TTFT_PARTS}
        for i in range(len(table)):
            if table.status[i] != _FINISHED or i not in reads:
                continue
            arrival, first_token = table.arrival_s[i], table.first_token_s[i]
            first_sched, done, _, _ = times[i]
            start, end = reads[i]
            for key, value in zip(TTFT_PARTS, (first_sched - arrival, done - first_sched,
                                               start - done, end - start,
                                               first_token - end)):
                parts[key].append(value)
        return {k: np.asarray(v, dtype=float) for k, v in parts.items()}

    def pd_counters(self, span_s: float, summaries: list[EngineSummary]) -> dict[str, float]:
        pd = self.pd
        out: dict[str, float] = {"pd_num_prefill": pd.num_prefill,
                                 "pd_num_decode": pd.num_decode,
                                 "pd_prefill_tp": pd.prefill_tp, "pd_decode_tp": pd.decode_tp,
                                 "pd_refused_at_decode": self.loop.num_refused_at_decode}
        for key, values in self.ttft_parts().items():
            ok = values.size > 0
            out[f"pd_ttft_{key}_mean_s"] = float(values.mean()) if ok else float("nan")
            out[f"pd_ttft_{key}_p50_s"] = float(np.percentile(values, 50)) if ok else float("nan")
            out[f"pd_ttft_{key}_p90_s"] = float(np.percentile(values, 90)) if ok else float("nan")
        n = pd.num_prefill
        for pool, engines, rows in (("prefill", self.prefill, summaries[:n]),
                                    ("decode", self.decode, summaries[n:])):
            busy = sum(e.busy_s for e in engines)
            out[f"pd_{pool}_utilization"] = busy / (span_s * len(engines)) if span_s else 0.0
            kv = [r.kv_usage_mean for r in rows if r.kv_usage_mean == r.kv_usage_mean]
            out[f"pd_{pool}_kv_usage_mean"] = sum(kv) / len(kv) if kv else float("nan")
            out[f"pd_{pool}_prefix_cache_queries"] = sum(r.prefix_cache_queries for r in rows)
            out[f"pd_{pool}_prefix_cache_hits"] = sum(r.prefix_cache_hits for r in rows)
        for engine in self.engines:
            for key, value in engine.connector.counters().items():
                out[key] = out.get(key, 0) + value
        out["pd_read_bytes"] = pd.transfer_bytes(int(out.get("pd_read_blocks", 0)))
        return out

    def _result(self, wall_s: float) -> ReplayResult:
        engines, table = self.engines, self.table
        gaps = GapSamples()
        steps: list[StepRecord] | None = [] if engines[0].steps is not None else None
        for engine in self.decode:  # the user's tokens come from the decoders
            gaps.gap_s.extend(engine.itl_samples.gap_s)
            gaps.count.extend(engine.itl_samples.count)
        gaps.maybe_compact()
        for engine in engines:
            if steps is not None and engine.steps is not None:
                steps.extend(engine.steps)
        summaries = self._summaries()
        first_arrival = min((a for a in table.arrival_s if a == a), default=0.0)
        now = self.loop.now_s
        span = max(0.0, now - min(first_arrival, now))
        finished = int(sum(1 for s in table.status if s == _FINISHED))
        counters: dict[str, float] = {
            "prefix_cache_queries": sum(e.prefix_cache_queries for e in summaries),
            "prefix_cache_hits": sum(e.prefix_cache_hits for e in summaries),
            "preemptions": sum(e.preemptions for e in summaries),
            "num_steps": sum(e.num_steps for e in summaries),
            "rejected": self.loop.num_rejected + self.loop.num_refused_at_decode,
            "num_requests": len(table),
            "num_finished": finished,
            "num_engines": len(engines),
            "dummy_steps": 0,
        }
        counters.update(self.pd_counters(span, summaries))
        pd = self.pd
        notes = [f"disaggregated: {pd.num_prefill} prefill x TP {pd.prefill_tp} + "
                 f"{pd.num_decode} decode x TP {pd.decode_tp}, NIXL {pd.variant} over "
                 f"{pd.link_name or 'the pool link'}, {pd.router} router",
                 "timeseries: the deployment at each engine step (waiting/running summed, "
                 "KV usage averaged over engines)"]
        return ReplayResult(
            backend="sim", requests=table, itl_samples=gaps,
            timeseries=merge_timeseries([e.timeseries for e in engines]),
            counters=counters, simulated_s=span, wall_s=wall_s,
            num_gpus=pd.num_prefill * pd.prefill_tp + pd.num_decode * pd.decode_tp,
            steps=steps, notes=notes, engines=summaries)
