"""The ``vllm-core`` driver for a data-parallel deployment: one vLLM ``Scheduler`` per rank.

Runs inside the vLLM Python like ``tuner.vllm_core.driver``, as a script with the same
arguments (``VLLM_PYTHON tuner/vllm_core/dp_driver.py JOB.pickle RESULT.pickle``); the
backend starts it instead of ``driver.py`` when a job has ``dp > 1``, and it replays the
other jobs of a list with ``driver.VllmCoreReplay``. Each DP rank is a real vLLM ``Scheduler`` with
its own KV cache (``build_scheduler``); the ranks share the twin's fleet loop
(``tuner.sim.fleet.loop.FleetLoop``): vLLM's internal load balancer picks the rank of
each arrival from the ranks' published counts, and a MoE deployment's ranks step in
lockstep with dummy batches, the slowest rank's step time and the DP step counter.

What vLLM's engine core does around a MoE rank's scheduler is done here the same way:
``schedule(throttle_prefills)`` gets ``step_counter % prefill_schedule_interval != 0``
(``DPEngineCoreProc._should_throttle_prefills``, v1/engine/core.py:2455-2463), and the
scheduler's own single-engine cadence is off, as vLLM turns it off for a DP rank of size
> 1 (v1/core/sched/scheduler.py:404-408). Dense ranks keep the local cadence (vLLM
reconfigures them as independent size-1 engines).

One deployment only: a fleet's router (``--replicas``) runs on the twin.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tuner.vllm_core.driver import (VllmCoreEngine, VllmCoreReplay,  # noqa: E402
                                    build_scheduler, make_block_hasher)
from tuner.vllm_core.job_file import run_job_file  # noqa: E402
from tuner.vllm_core.tokens import DriverRequest, TokenFactory  # noqa: E402


class VllmCoreFleetEngine(VllmCoreEngine):
    """vLLM's scheduler as one rank of the fleet loop (``tuner.sim.fleet.engines``)."""

    def __init__(self, scheduler: Any, tokens: TokenFactory, hasher: Any, *,
                 num_requests: int, record_steps: bool, interval: int,
                 lockstep: bool) -> None:
        super().__init__(scheduler, tokens, hasher, num_requests=num_requests,
                         record_steps=record_steps)
        self.num_added = 0
        self.num_dummy_steps = 0
        self.index_of: dict[str, int] = {}  # live request id -> trace position
        self.first_token_of: dict[int, str] = {}  # trace position -> request id
        self._finished: list[int] = []
        self._throttle = False
        self._interval = interval
        if lockstep and interval > 1:
            scheduler.local_prefill_interval = 1  # the DP engine core paces prefills
            original = scheduler.schedule

            def schedule(*args: Any, **kwargs: Any) -> Any:
                return original(self._throttle)

            scheduler.schedule = schedule

    def add_request(self, index: int, r: DriverRequest, arrival_s: float) -> None:
        super().add_request(index, r, arrival_s)
        self.index_of[r.request_id] = index
        self.first_token_of[index] = r.request_id
        self.num_added += 1

    def update(self, step: Any, end_s: float) -> int:
        finished = super().update(step, end_s)
        if finished:
            for rid in step.output.num_scheduled_tokens:
                lv = self.live[rid]
                if lv.finish_s == end_s and rid in self.index_of:
                    self._finished.append(self.index_of.pop(rid))
        return finished

    def request_counts(self) -> tuple[int, int, float]:
        sched = self.scheduler
        counts = getattr(sched, "get_request_counts", None)
        running, waiting = counts() if counts is not None else (
            len(sched.running), len(sched.waiting))
        return int(waiting), int(running), float(sched.kv_cache_manager.usage)

    def cached_prefix_blocks(self, source: Any) -> int:
        """Not offered: the vllm-core backend replays one deployment without a router
        (the backend refuses ``--replicas`` and ``--router``), so nothing asks."""
        raise TypeError("a KV-aware router runs on the sim backend only")

    def has_first_token(self, index: int) -> bool:
        rid = self.first_token_of.get(index)
        return rid is None or not math.isnan(self.live[rid].first_token_s)

    def take_finished(self) -> list[int]:
        out, self._finished = self._finished, []
        return out

    def align_step_counter(self, counter: int) -> None:
        self._throttle = self._interval > 1 and counter % self._interval != 0

    def dummy_step(self, start_s: float, duration_s: float) -> None:
        self.num_dummy_steps += 1


class VllmCoreDPReplay:
    """A job with ``dp > 1`` (keys as ``VllmCoreReplay``'s plus ``dp`` and ``moe``)."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        cache = job["cache"]
        self.block_size = int(cache["block_size"])
        self.requests = [DriverRequest(**r) for r in job["requests"]]
        self.dp = int(job["dp"])
        self.lockstep = bool(job.get("moe")) and self.dp > 1
        self.record_steps = bool(job.get("record_steps", True))
        #: vLLM's resolved ``async_scheduling`` (as ``VllmCoreReplay``): every rank an
        #: ``AsyncScheduler`` under a batch queue of depth 2
        self.async_scheduling = bool(job.get("async_scheduling", False))
        settings = job["settings"]
        interval = int(settings.get("prefill_schedule_interval", 1) or 1)
        t0 = time.perf_counter()
        tokens = TokenFactory(self.block_size)
        self.engines = [VllmCoreFleetEngine(
            build_scheduler(model_dir=job["model_dir"], settings=settings,
                            block_size=self.block_size,
                            num_gpu_blocks=int(cache["num_gpu_blocks"]),
                            enable_prefix_caching=bool(cache.get("enable_prefix_caching", True)),
                            max_model_len=int(cache["max_model_len"]),
                            async_scheduling=self.async_scheduling),
            tokens, make_block_hasher(self.block_size), num_requests=len(self.requests),
            record_steps=self.record_steps, interval=interval, lockstep=self.lockstep)
            for _ in range(self.dp)]
        self.build_s = time.perf_counter() - t0

    def run(self) -> Any:
        from tuner.records import EngineSummary, ReplayResult, RequestTable
        from tuner.sim.clock import batch_queue_depth
        from tuner.sim.fleet.loop import FleetLoop
        from tuner.sim.load import OpenLoop
        from tuner.sim.loop import AdmissionRules

        requests, engines, job = self.requests, self.engines, self.job
        table = RequestTable([r.request_id for r in requests], [r.input_len for r in requests],
                             [r.session_id for r in requests])
        order = sorted(range(len(requests)), key=lambda i: (float(requests[i].arrival_s), i))
        loop = FleetLoop(engines, ((i, requests[i]) for i in order), job["step_time"],
                         AdmissionRules.of(job["settings"], job["cache"]), table,
                         dp=self.dp, replicas=1, lockstep=self.lockstep,
                         load=job.get("load") or OpenLoop(), num_requests=len(requests),
                         batch_queue_depth=batch_queue_depth(self.async_scheduling))
        wall0 = time.perf_counter()
        loop.run()
        wall = time.perf_counter() - wall0
        for index, r in enumerate(requests):
            e = table.engine[index]
            if e < 0:
                continue  # rejected: recorded by the loop
            lv = engines[e].live[r.request_id]
            done = not math.isnan(lv.finish_s)
            table.record(index, "finished" if done else "unfinished", lv.arrival_s,
                         output_len=lv.num_generated, first_scheduled_s=lv.first_scheduled_s,
                         first_token_s=lv.first_token_s, finish_s=lv.finish_s,
                         num_cached_tokens=max(lv.num_cached_tokens, 0),
                         num_preemptions=lv.num_preemptions)
        summaries, steps, itl = [], [], []
        counters: dict[str, float] = {}
        for e, engine in enumerate(engines):
            kv = engine.ts["kv_usage"]
            c = engine.counters
            summaries.append(EngineSummary(
                engine=e, replica=0, dp_rank=e, num_requests=engine.num_added,
                num_finished=sum(1 for lv in engine.live.values()
                                 if not math.isnan(lv.finish_s)),
                prefix_cache_queries=int(c["prefix_cache_queries"]),
                prefix_cache_hits=int(c["prefix_cache_hits"]),
                preemptions=int(c["preemptions"]),
                kv_usage_mean=sum(kv) / len(kv) if kv else math.nan,
                kv_usage_max=max(kv) if kv else math.nan, num_steps=int(c["num_steps"]),
                num_dummy_steps=engine.num_dummy_steps))
            steps.extend(engine.steps)
            itl.extend(engine.itl)
            for key, value in c.items():
                counters[key] = counters.get(key, 0.0) + value
        import vllm

        from tuner.sim.fleet.simulator import merge_timeseries

        counters.update({"rejected": float(loop.num_rejected),
                         "num_requests": float(len(requests)),
                         "num_finished": float(sum(s.num_finished for s in summaries)),
                         "num_engines": float(self.dp),
                         "dummy_steps": float(sum(s.num_dummy_steps for s in summaries))})
        first = min((a for a in table.arrival_s if a == a), default=0.0)
        now = loop.now_s
        mode = "async scheduling" if self.async_scheduling else "no async scheduling"
        notes = [f"vllm {vllm.__version__}; {self.dp} schedulers "
                 f"({'lockstep MoE' if self.lockstep else 'independent'} DP ranks, {mode}); "
                 f"built in {self.build_s:.2f}s"]
        for engine in engines:
            notes.extend(engine.notes)
        return ReplayResult(
            backend="vllm-core", requests=table, itl_samples=itl,
            timeseries=merge_timeseries([engine.ts for engine in engines]), counters=counters,
            simulated_s=max(0.0, now - min(first, now)), wall_s=wall,
            num_gpus=int(job.get("num_gpus", 1)), steps=steps if self.record_steps else None,
            notes=notes, engines=summaries)


def replay_job(job: dict[str, Any]) -> Any:
    """One job's ``ReplayResult``: DP ranks here, a single engine by ``VllmCoreReplay``."""
    if int(job.get("dp", 1)) > 1:
        return VllmCoreDPReplay(job).run()
    return VllmCoreReplay(job).run()


def main(argv: list[str]) -> int:
    """``JOB.pickle RESULT.pickle`` (``tuner.vllm_core.job_file``): a DP job or a replay."""
    return run_job_file(argv, replay_job, "dp_driver.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
