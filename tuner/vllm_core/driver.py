"""The ``vllm-core`` driver: replays a trace through vLLM's own ``Scheduler``, in process.

This file runs inside the Python that has vLLM installed (``--vllm-python``), not in
tuner's environment. It is started as a script::

    VLLM_PYTHON tuner/vllm_core/driver.py JOB.pickle RESULT.pickle

and imports only vLLM, the standard library and the plain-Python parts of tuner
(``tuner.sim``, ``tuner.records``, ``tuner.vllm_plugin``, ``tuner.vllm_core.tokens``), with
the repository root put on ``sys.path``. The job holds plain data (request tuples,
settings dicts) plus the twin's step-time model and load object, pickled; the result is
a pickled ``tuner.records.ReplayResult``. Progress goes to stdout as JSON lines
(``{"progress": fraction}``).

What is real and what is faked (see docs/fidelity.md):

* real: the scheduler class vLLM would build (``SchedulerConfig.get_scheduler_cls``:
  ``Scheduler``, or ``AsyncScheduler`` under async scheduling), or
  ``CacheAwareScheduler`` / ``CacheAwareAsyncScheduler`` from the plugin when the
  cache-aware admission window is on; ``KVCacheManager``, ``BlockPool``, request queues,
  block hashing, ``update_from_output`` and the stats it emits;
* faked: the model. ``ModelConfig`` reads only a local ``config.json``
  (tests/data/tiny-llama); the KV-cache config is a fake with the twin's number of blocks
  and block size; a scheduled request "samples" one token iff the step completes its
  sequence (it is not a prefill chunk after scheduling) and none while a prefill is
  partial, as vLLM's model runner does. That decision is taken when the step is
  scheduled, because under async scheduling ``update_from_output`` runs after the next
  ``schedule()`` has already advanced the request;
* the clock: the twin's, ``tuner.sim.loop.ReplayLoop`` (the same code drives the twin):
  arrivals (open or closed loop), the admission rules, the step sequence and the
  step-time model's duration for each step. :class:`VllmCoreEngine` is this side's
  ``StepEngine``. With ``async_scheduling`` the loop runs a batch queue of depth 2, as
  ``EngineCore.step_with_batch_queue`` (v1/engine/core.py @ 0.33.0): ``schedule(N+1)``
  before ``update_from_output(N)``, empty batches queued like any other.

Prompt and generated token ids come from the trace's block hashes
(``tuner.vllm_core.tokens.TokenFactory``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tuner.vllm_core.model_output import (  # noqa: E402,F401 (re-exported: scenarios use them)
    fake_model_output, model_runner_output, sampled_tokens, stats_gauge)
from tuner.vllm_core.offloading import kv_transfer_config, offloading_feed  # noqa: E402
from tuner.vllm_core.tokens import VOCAB_LOW, DriverRequest, TokenFactory  # noqa: E402


@dataclass(slots=True)
class _Live:
    """Per-request bookkeeping of the replay."""

    req: DriverRequest
    outputs: list[int]
    arrival_s: float
    first_scheduled_s: float = math.nan
    first_token_s: float = math.nan
    last_token_s: float = math.nan
    finish_s: float = math.nan
    num_generated: int = 0
    num_cached_tokens: int = -1
    num_preemptions: int = 0
    gaps: list[float] = field(default_factory=list)


# ----------------------------------------------------------------------------------------
# Building vLLM's Scheduler from a config.json-only model folder
# ----------------------------------------------------------------------------------------
#: SchedulerConfig class defaults: a setting at this value may be left out when the
#: installed vLLM lacks the field (e.g. 0.32 has no local prefill cadence knob semantics).
_DEFAULTS = {"long_prefill_token_threshold": 0, "enable_chunked_prefill": True,
             "policy": "fcfs", "scheduler_reserve_full_isl": True, "watermark": 0.0,
             "prefill_schedule_interval": 1}


def build_scheduler(*, model_dir: str, settings: dict[str, Any], block_size: int,
                    num_gpu_blocks: int, enable_prefix_caching: bool = True,
                    max_model_len: int = 8192, async_scheduling: bool = False,
                    scheduler_cls: type | str | None = None,
                    speculative: dict[str, Any] | None = None,
                    kv_offload: Any = None) -> Any:
    """The scheduler vLLM would build for ``settings``, over a fake KV cache.

    The class: ``scheduler_cls`` if given (a class or a dotted name, as
    ``--scheduler-cls``); else the plugin's ``CacheAwareScheduler`` /
    ``CacheAwareAsyncScheduler`` when ``cache_aware_admission_window`` > 0 (what a profile
    with the window deploys); else vLLM's own choice, ``SchedulerConfig.get_scheduler_cls()``
    (``AsyncScheduler`` under ``async_scheduling``, ``Scheduler`` otherwise).

    Mirrors vLLM's ``tests/v1/core/utils.py::create_scheduler``: a fake
    ``KVCacheConfig`` with one full-attention group of ``num_gpu_blocks`` blocks (block
    0 is vLLM's null block), no model weights, CPU device. ``kv_offload`` (an
    ``OffloadSettings``) adds vLLM's ``OffloadingConnector`` (``tuner.vllm_core.offloading``).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    import dataclasses as dc

    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from tuner import vllm_compat, vllm_plugin

    if scheduler_cls is None and int(settings.get("cache_aware_admission_window") or 0) > 0:
        scheduler_cls = (vllm_plugin.CacheAwareAsyncScheduler if async_scheduling
                         else vllm_plugin.CacheAwareScheduler)
    known = {f.name for f in dc.fields(SchedulerConfig)}
    kwargs: dict[str, Any] = {}
    # the fields every supported release has (tuner.vllm_compat's table, docs/vllm-versions.md)
    for name in vllm_compat.BASE_FIELDS:
        if name not in settings:
            continue
        if name in known:
            kwargs[name] = settings[name]
        elif settings[name] != _DEFAULTS.get(name):
            raise ValueError(f"setting {name}={settings[name]!r} is not supported by the "
                             f"installed vLLM (SchedulerConfig has no field {name!r})")
    if scheduler_cls is not None:
        kwargs["scheduler_cls"] = scheduler_cls
    model_config = ModelConfig(model=model_dir, dtype="float32", seed=0,
                               skip_tokenizer_init=True, max_model_len=max_model_len)
    sched_config = SchedulerConfig(max_model_len=max_model_len, is_encoder_decoder=False,
                                   async_scheduling=async_scheduling, **kwargs)
    cache_config = CacheConfig(block_size=block_size,
                               enable_prefix_caching=enable_prefix_caching)
    extra = {k: settings[k] for k in vllm_compat.ADMISSION_FIELDS if k in settings}
    spec_kw = {}
    if speculative is not None:
        spec_kw["speculative_config"] = speculative_config(speculative, model_config, model_dir)
    attention = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                                  dtype=torch.float32)
    if kv_offload is not None:
        spec_kw["kv_transfer_config"] = kv_transfer_config(kv_offload,
                                                           attention.page_size_bytes)
    vllm_config = VllmConfig(scheduler_config=sched_config, model_config=model_config,
                             cache_config=cache_config, device_config=DeviceConfig(device="cpu"),
                             additional_config=extra, **spec_kw)
    # vLLM's CPU platform turns async scheduling off (platforms/cpu.py, "not required on
    # CPU"); the replay models the engine of the target, so its resolved mode goes back.
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    kv_cache_config = KVCacheConfig(
        num_blocks=num_gpu_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], attention)])
    cache_config.num_gpu_blocks = num_gpu_blocks
    cls = vllm_config.scheduler_config.get_scheduler_cls()
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               block_size=block_size, log_stats=True,
               structured_output_manager=StructuredOutputManager(vllm_config))


def speculative_config(config: dict[str, Any], model_config: Any, model_dir: str) -> Any:
    """vLLM's ``SpeculativeConfig`` for a ``--speculative-config`` object, over the fake
    model. A drafter with a model of its own (eagle, eagle3) gets the fake model's folder
    as its draft model; ``mtp`` needs a target with MTP layers, which the fake has not,
    so it is built as ``eagle``: the scheduler's rules for both are the same
    (``use_eagle()``, ``k`` lookahead slots, config/speculative.py:2116-2120)."""
    from vllm.config import ParallelConfig, SpeculativeConfig

    kw = {k: v for k, v in config.items() if k not in ("model",)}
    if kw.get("method") == "mtp":
        kw["method"] = "eagle"
    if kw.get("method") != "ngram":
        kw["model"] = model_dir
    return SpeculativeConfig(target_model_config=model_config,
                             target_parallel_config=ParallelConfig(), **kw)


def make_block_hasher(block_size: int) -> Any:
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256)
    return get_request_block_hasher(block_size, sha256)


def make_vllm_request(request_id: str, prompt: list[int], max_tokens: int, hasher: Any, *,
                      arrival_time: float = 0.0, priority: int = 0) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    return Request(request_id=request_id, prompt_token_ids=prompt,
                   sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   pooling_params=None, arrival_time=arrival_time, priority=priority,
                   block_hasher=hasher)


# ----------------------------------------------------------------------------------------
# vLLM's scheduler as the loop's StepEngine
# ----------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Step:
    """One scheduled step: vLLM's output and what was read right after ``schedule()``."""

    output: Any
    items: list[tuple[int, int]]  # (computed before, scheduled) per request: the batch
    cached_now: dict[str, int]  # admitted this step -> tokens computed before (the hit)
    preempted: tuple[str, ...]
    usage: float
    num_running: int
    num_waiting: int
    sampled: list[list[int]]  # per scheduled request: the token it samples, or none
    record: int = -1  # index of its StepRecord (-1: steps not recorded)


class VllmCoreEngine:
    """vLLM's scheduler behind ``tuner.sim.loop.StepEngine``: ``schedule()`` -> the
    batch for the step-time model -> fake model output -> ``update_from_output``.

    Works at any batch-queue depth: everything the step needs later (the batch, the
    admissions, the samples) is read in :meth:`schedule`, before the loop may schedule
    the next step; :meth:`update` only applies the output and reads what vLLM reports
    then (finishes, token times, the stats gauge).
    """

    def __init__(self, scheduler: Any, tokens: TokenFactory, hasher: Any, *,
                 num_requests: int, record_steps: bool, spec: Any = None,
                 kv: Any = None) -> None:
        from tuner.sim.batch import StepBatch

        self._StepBatch = StepBatch
        self.scheduler = scheduler
        self.tokens = tokens
        self.hasher = hasher
        self.record_steps = record_steps
        self.live: dict[str, _Live] = {}
        self.rejected: dict[int, float] = {}  # trace position -> issue time
        self.steps: list[Any] = []
        self.itl: list[tuple[float, int]] = []
        self.ts: dict[str, list[float]] = {k: [] for k in (
            "t_s", "kv_usage", "num_running", "num_waiting", "num_scheduled_tokens")}
        self.counters = {"prefix_cache_queries": 0.0, "prefix_cache_hits": 0.0,
                         "preemptions": 0.0, "num_steps": 0.0}
        self.notes: list[str] = []
        self.preempted_now: list[str] = []
        self.num_busy_in_flight = 0  # queued steps that scheduled tokens, not yet updated
        #: speculative decoding: the twin's ``SpecDecoding`` (its seeded acceptance draw)
        self.spec = spec
        if spec is not None:
            self.counters.update({"spec_num_drafts": 0.0, "spec_num_draft_tokens": 0.0,
                                  "spec_num_accepted_tokens": 0.0})
            for i in range(spec.num_speculative_tokens):
                self.counters[f"spec_num_accepted_tokens_pos{i}"] = 0.0
        #: the CPU tier: ``tuner.vllm_core.offloading.OffloadingFeed`` (vLLM's connector
        #: and the fake worker) or None; its empty steps wait for a transfer (ReplayLoop)
        self.kv = kv
        self.empty_step_s = None if kv is None else kv.empty_step_s
        self._wrap_preempt()

    def _wrap_preempt(self) -> None:
        sched = self.scheduler
        original = sched._preempt_request
        record = self.preempted_now

        def preempt(request: Any, *args: Any, **kwargs: Any) -> Any:
            record.append(request.request_id)
            return original(request, *args, **kwargs)

        sched._preempt_request = preempt

    # ----------------------------------------------------------------- arrivals
    def add_request(self, index: int, r: DriverRequest, arrival_s: float) -> None:
        self.live[r.request_id] = _Live(req=r, outputs=self.tokens.output_tokens(r),
                                        arrival_s=arrival_s)
        self.scheduler.add_request(make_vllm_request(
            r.request_id, self.tokens.prompt(r), r.output_len, self.hasher,
            arrival_time=arrival_s, priority=r.priority))

    def reject_request(self, index: int, r: DriverRequest, arrival_s: float) -> None:
        self.rejected[index] = arrival_s

    def has_requests(self) -> bool:
        """Unfinished requests. vLLM's ``has_requests()`` is also true while finished ids
        wait to be sent to the workers, which costs it one empty ``schedule()`` that
        decides nothing; the replay leaves that call out. With a KV connector that
        step builds the finished requests' last stores, and vLLM steps on while
        transfers are pending: its own ``has_requests()`` answers."""
        if self.kv is not None:
            return self.scheduler.has_requests()
        return bool(self.scheduler.requests)

    def idle(self) -> None:
        """vLLM keeps no state across an idle engine that the replay models."""

    def _next_token(self, r: Any) -> int:
        """The trace's token at the position a step samples (``num_computed_tokens``
        after scheduling), so a stale delivery after a preemption carries the same id."""
        outs = self.live[r.request_id].outputs
        k = r.num_computed_tokens - r.num_prompt_tokens
        return outs[k] if 0 <= k < len(outs) else VOCAB_LOW

    # ----------------------------------------------------------------- steps
    def schedule(self, now_s: float) -> _Step | None:
        sched = self.scheduler
        self.preempted_now.clear()
        was_running = {r.request_id for r in sched.running}
        out = sched.schedule()
        scheduled = out.num_scheduled_tokens
        if self.kv is not None:
            self.kv.scheduled(out)
        if (not scheduled and not self.preempted_now and not self.num_busy_in_flight
                and (self.kv is None or not self.kv.can_progress(out))):
            # Nothing scheduled, nothing changed and nothing in flight whose output could
            # change it: every later schedule() would return the same.
            sched.update_from_output(out, model_runner_output(out, []))
            self.notes.append(f"t={now_s}: vLLM scheduled nothing with {len(sched.running)} "
                              f"running and {len(sched.requests) - len(sched.running)} "
                              "waiting; stopped (the rest is reported unfinished)")
            return None
        items = []
        cached_now: dict[str, int] = {}
        counters = self.counters
        for rid, n in scheduled.items():
            r = sched.requests[rid]
            before = r.num_computed_tokens - n
            items.append((before, n))
            if rid not in was_running:  # admitted this step (new or resumed)
                if self.kv is not None:  # the local (GPU) hit, as the twin records it
                    before = self.kv.local_hit(rid, before)
                cached_now[rid] = before
                lv = self.live[rid]
                if lv.num_cached_tokens < 0:
                    lv.num_cached_tokens = before
                    lv.first_scheduled_s = now_s
                    counters["prefix_cache_queries"] += r.num_tokens
                    counters["prefix_cache_hits"] += before
        for rid in self.preempted_now:
            self.live[rid].num_preemptions += 1
        if scheduled:
            self.num_busy_in_flight += 1
        num_running = len(sched.running)
        return _Step(output=out, items=items, cached_now=cached_now,
                     preempted=tuple(self.preempted_now),
                     usage=float(sched.kv_cache_manager.usage), num_running=num_running,
                     num_waiting=len(sched.requests) - num_running,
                     sampled=sampled_tokens(sched, out, self._next_token))

    def batch(self, step: _Step) -> Any:
        # An empty batch (every running request in flight on its last token, or a
        # priority request that preempted itself) costs nothing: vLLM's runner returns
        # at once.
        if not step.items:
            return None
        batch = self._StepBatch.from_requests(step.items)
        drafts = step.output.scheduled_spec_decode_tokens if self.spec is not None else None
        if drafts:  # verifies: the twin's batch carries the same two counts
            batch = replace(batch, num_spec_reqs=len(drafts),
                            num_spec_tokens=sum(len(d) for d in drafts.values()))
        return batch

    def start(self, step: _Step, start_s: float, duration_s: float) -> None:
        from tuner.records import StepRecord

        scheduled = step.output.num_scheduled_tokens
        if self.record_steps:
            step.record = len(self.steps)
            self.steps.append(StepRecord(
                step=len(self.steps), start_s=start_s, duration_s=duration_s,
                num_scheduled_tokens=dict(scheduled), preempted=step.preempted,
                num_running=step.num_running, num_waiting=step.num_waiting,
                kv_usage=step.usage, cached_tokens=step.cached_now,
                **({} if self.kv is None else {"waiting_for_kv": self.kv.waiting_ids()})))
        ts = self.ts
        ts["t_s"].append(start_s)
        ts["kv_usage"].append(step.usage)
        ts["num_running"].append(float(step.num_running))
        ts["num_waiting"].append(float(step.num_waiting))
        ts["num_scheduled_tokens"].append(float(sum(scheduled.values())))
        self.counters["num_steps"] += 1
        self.counters["preemptions"] += len(step.preempted)
        if self.kv is not None:
            self.kv.launch(step.output, start_s, duration_s)

    def update(self, step: _Step, end_s: float) -> int:
        sched, live = self.scheduler, self.live
        out = step.output
        if out.num_scheduled_tokens:
            self.num_busy_in_flight -= 1
        sampled = step.sampled if self.spec is None else self._verified(step)
        kv_out = None if self.kv is None else self.kv.output(end_s)
        eco = sched.update_from_output(out, model_runner_output(out, sampled, kv_out))
        if self.kv is not None:
            self.kv.after_update(eco)
        if self.spec is not None:
            self._spec_stats(eco)
            if not sched.scheduler_config.async_scheduling and out.total_num_scheduled_tokens:
                self._propose_drafts(out)  # EngineCore.post_step
        if step.record >= 0:
            self.steps[step.record] = replace(self.steps[step.record],
                                              kv_usage_at_update=stats_gauge(sched, eco))
        gaps: dict[float, int] = {}
        for rid in out.num_scheduled_tokens:
            r = sched.requests.get(rid)
            lv = live[rid]
            n_out = len(r.output_token_ids) if r is not None else lv.req.output_len
            if n_out > lv.num_generated:
                if lv.num_generated == 0:
                    lv.first_token_s = end_s
                else:
                    gap = end_s - lv.last_token_s
                    gaps[gap] = gaps.get(gap, 0) + 1
                lv.last_token_s = end_s
                lv.num_generated = n_out
        self.itl.extend(gaps.items())
        finished = 0
        for outputs in eco.values():
            for o in outputs.outputs:
                if o.finish_reason is not None:
                    live[o.request_id].finish_s = end_s
                    finished += 1
        return finished


    # ----------------------------------------------------------------- spec decoding
    def _verified(self, step: _Step) -> list[list[int]]:
        """What the runner returns for a verify: ``1 + accepted`` tokens per sampling
        request, the accepted count drawn from the twin's seeded profile at the
        request's known tokens now (``SpecDecoding.num_accepted``), 0 for the placeholder
        drafts of a padded admission; ids are the trace's tokens at the output positions."""
        sched, spec = self.scheduler, self.spec
        drafts = step.output.scheduled_spec_decode_tokens
        out = []
        for rid, samples in zip(step.output.num_scheduled_tokens, step.sampled):
            r = sched.requests.get(rid)
            if not samples or r is None:
                out.append(samples)
                continue
            accepted = 0
            scheduled = drafts.get(rid)
            if scheduled and rid not in step.cached_now:  # admitted: padding drafts
                accepted = spec.num_accepted(rid, r.num_tokens, len(scheduled))
            first = len(r.output_token_ids)
            outs = self.live[rid].outputs
            out.append([outs[i] if i < len(outs) else VOCAB_LOW
                        for i in range(first, first + 1 + accepted)])
        return out

    def _propose_drafts(self, output: Any) -> None:
        """The drafter's ``k`` drafts for every request of the step (the scheduler keeps
        them for requests that sampled and did not finish, ``update_draft_token_ids``)."""
        from vllm.v1.outputs import DraftTokenIds

        ids = list(output.num_scheduled_tokens)
        k = getattr(output, "num_spec_tokens_to_schedule",  # per batch size where set
                    self.spec.num_speculative_tokens)
        self.scheduler.update_draft_token_ids(
            DraftTokenIds(req_ids=ids, draft_token_ids=[[VOCAB_LOW] * k for _ in ids]))

    def _spec_stats(self, engine_core_outputs: dict[int, Any]) -> None:
        """Sum vLLM's ``SpecDecodingStats`` of this update into the counters."""
        c = self.counters
        for eco in engine_core_outputs.values():
            stats = getattr(getattr(eco, "scheduler_stats", None), "spec_decoding_stats", None)
            if stats is None:
                continue
            c["spec_num_drafts"] += stats.num_drafts
            c["spec_num_draft_tokens"] += stats.num_draft_tokens
            c["spec_num_accepted_tokens"] += stats.num_accepted_tokens
            for i, n in enumerate(stats.num_accepted_tokens_per_pos):
                c[f"spec_num_accepted_tokens_pos{i}"] += n


class VllmCoreReplay:
    """Replays a job's requests through vLLM's scheduler on the shared loop."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        cache = job["cache"]
        self.block_size = int(cache["block_size"])
        self.requests = [DriverRequest(**r) for r in job["requests"]]
        self.step_time = job["step_time"]
        self.load = job.get("load")
        self.record_steps = bool(job.get("record_steps", True))
        self.num_gpus = int(job.get("num_gpus", 1))
        #: vLLM's resolved ``async_scheduling``: AsyncScheduler placeholders and the
        #: engine's batch queue of depth 2 (``max_concurrent_batches`` at PP=1). A plain
        #: ``Scheduler`` given as ``scheduler_cls`` still gets the queue, as in vLLM.
        self.async_scheduling = bool(job.get("async_scheduling", False))
        t0 = time.perf_counter()
        self.scheduler = build_scheduler(
            model_dir=job["model_dir"], settings=job["settings"], block_size=self.block_size,
            num_gpu_blocks=int(cache["num_gpu_blocks"]),
            enable_prefix_caching=bool(cache.get("enable_prefix_caching", True)),
            max_model_len=int(cache["max_model_len"]), async_scheduling=self.async_scheduling,
            scheduler_cls=job.get("scheduler_cls"),
            speculative=(job["speculative"].vllm_config if job.get("speculative") else None),
            kv_offload=job.get("kv_offload"))
        self.build_s = time.perf_counter() - t0
        self.engine = VllmCoreEngine(self.scheduler, TokenFactory(self.block_size),
                                     make_block_hasher(self.block_size),
                                     num_requests=len(self.requests),
                                     record_steps=self.record_steps,
                                     spec=job.get("speculative"),
                                     kv=offloading_feed(self.scheduler, job.get("kv_offload")))

    def run(self) -> Any:
        from tuner.records import ReplayResult, RequestResult
        from tuner.sim.clock import batch_queue_depth
        from tuner.sim.load import OpenLoop
        from tuner.sim.loop import AdmissionRules, ReplayLoop

        requests, engine = self.requests, self.engine
        # Issue order: by arrival time, ties by trace position (as the twin).
        order = sorted(range(len(requests)), key=lambda i: (float(requests[i].arrival_s), i))
        loop = ReplayLoop(engine, ((i, requests[i]) for i in order), self.step_time,
                          AdmissionRules.of(self.job["settings"], self.job["cache"]),
                          load=self.load or OpenLoop(), num_requests=len(requests),
                          batch_queue_depth=batch_queue_depth(self.async_scheduling))
        wall0 = time.perf_counter()
        last_progress = [wall0]

        def progress(fraction: float) -> None:
            if time.perf_counter() - last_progress[0] > 0.5:
                last_progress[0] = time.perf_counter()
                print(json.dumps({"progress": fraction}), flush=True)

        loop.run(progress)
        now = loop.now_s
        results = []
        num_finished = 0
        for index, r in enumerate(requests):
            lv = engine.live.get(r.request_id)
            if lv is None:
                at = engine.rejected.get(index)
                results.append(RequestResult(
                    request_id=r.request_id, arrival_s=math.nan if at is None else at,
                    input_len=r.input_len, output_len=0, first_scheduled_s=math.nan,
                    first_token_s=math.nan, finish_s=math.nan, num_cached_tokens=0,
                    status="unfinished" if at is None else "rejected",
                    session_id=r.session_id))
                continue
            done = not math.isnan(lv.finish_s)
            num_finished += done
            results.append(RequestResult(
                request_id=r.request_id, arrival_s=lv.arrival_s, input_len=r.input_len,
                output_len=lv.num_generated, first_scheduled_s=lv.first_scheduled_s,
                first_token_s=lv.first_token_s, finish_s=lv.finish_s,
                num_cached_tokens=max(lv.num_cached_tokens, 0),
                num_preemptions=lv.num_preemptions,
                status="finished" if done else "unfinished", session_id=r.session_id))
        wall = time.perf_counter() - wall0
        import vllm

        counters = dict(engine.counters)
        counters.update({"rejected": float(len(engine.rejected)),
                         "num_requests": float(len(requests)),
                         "num_finished": float(num_finished),
                         "cache_aware_reorders": float(getattr(
                             self.scheduler, "num_cache_aware_reorders", 0))})
        if engine.kv is not None:
            counters.update(engine.kv.counters())
        mode = "async scheduling" if self.async_scheduling else "no async scheduling"
        notes = [f"vllm {vllm.__version__}; scheduler {type(self.scheduler).__name__}; "
                 f"{mode}; built in {self.build_s:.2f}s"] + engine.notes
        first_arrival = min((x.arrival_s for x in results if x.arrival_s == x.arrival_s),
                            default=0.0)
        return ReplayResult(
            backend="vllm-core", requests=results, itl_samples=engine.itl,
            timeseries=engine.ts, counters=counters,
            simulated_s=max(0.0, now - min(first_arrival, now)), wall_s=wall,
            num_gpus=self.num_gpus, steps=engine.steps if self.record_steps else None,
            notes=notes)


def main(argv: list[str]) -> int:
    """``JOB.pickle RESULT.pickle`` (``tuner.vllm_core.job_file``)."""
    from tuner.vllm_core.job_file import run_job_file

    return run_job_file(argv, lambda job: VllmCoreReplay(job).run(), "driver.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
