"""The ``vllm-core`` driver: replays a trace through vLLM's own ``Scheduler``, in process.

This file runs inside the Python that has vLLM installed (``--vllm-python``), not in
tuner's environment. It is started as a script::

    VLLM_PYTHON tuner/replay/_vllm_core_driver.py JOB.pickle RESULT.pickle

and imports only vLLM, the standard library and the plain-Python parts of tuner
(``tuner.sim``, ``tuner.records``, ``tuner.vllm_plugin``), with the repository root
put on ``sys.path``. The job holds plain data (request tuples, settings dicts) plus the
twin's step-time model and load object, pickled; the result is a pickled
``tuner.records.ReplayResult``. Progress goes to stdout as JSON lines
(``{"progress": done_s, "total": total_s}``).

What is real and what is faked (see docs/fidelity.md):

* real: ``Scheduler`` (or ``CacheAwareScheduler`` from the plugin), ``KVCacheManager``,
  ``BlockPool``, request queues, block hashing, ``update_from_output``;
* faked: the model. ``ModelConfig`` reads only a local ``config.json``
  (tests/data/tiny-llama); the KV-cache config is a fake with the twin's number of blocks
  and block size; each step "samples" one token per request whose prefill is complete
  and none while a prefill is partial, as vLLM's model runner does;
* the clock: the twin's step-time model gives each step's duration; arrivals are fed by
  that clock (``OpenLoop``) or by completions (``ClosedLoop``), as the twin does.

Prompt tokens are derived from the trace's block hashes: block ``h`` is the ``B`` token
ids drawn from ``random.Random(h)``, so equal trace hashes give equal token blocks and
therefore equal vLLM block hashes, and different ones differ. The partial tail of a
prompt is unique per request unless the trace knows the block the output completes
(``output_block_hashes[0]``), in which case it is that block's first tokens; generated
tokens follow ``output_block_hashes`` the same way, and are unique per request beyond.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

VOCAB_LOW, VOCAB_HIGH = 3, 999  # token ids drawn from [3, 999]; 0-2 are special in tiny-llama


# ----------------------------------------------------------------------------------------
# Token ids from block hashes
# ----------------------------------------------------------------------------------------
class TokenFactory:
    """Deterministic token ids: equal trace block hashes -> equal token blocks."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._blocks: dict[int, list[int]] = {}

    def block(self, block_hash: int) -> list[int]:
        toks = self._blocks.get(block_hash)
        if toks is None:
            rng = random.Random(block_hash)
            toks = [rng.randint(VOCAB_LOW, VOCAB_HIGH) for _ in range(self.block_size)]
            self._blocks[block_hash] = toks
        return toks

    @staticmethod
    def unique(request_id: str, what: str, n: int) -> list[int]:
        rng = random.Random(f"{request_id}\x00{what}")  # str seed: sha512, stable across runs
        return [rng.randint(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]

    def prompt(self, req: "DriverRequest") -> list[int]:
        bs = self.block_size
        full = req.input_len // bs
        if len(req.block_hashes) < full:
            raise ValueError(f"request {req.request_id}: {len(req.block_hashes)} block hashes "
                             f"for {req.input_len} tokens at block size {bs}")
        toks: list[int] = []
        for h in req.block_hashes[:full]:
            toks.extend(self.block(h))
        tail = req.input_len - full * bs
        if tail:
            if req.output_block_hashes:
                toks.extend(self.block(req.output_block_hashes[0])[:tail])
            else:
                toks.extend(self.unique(req.request_id, "tail", tail))
        return toks

    def output_tokens(self, req: "DriverRequest") -> list[int]:
        """All ``output_len`` generated token ids, in order."""
        bs = self.block_size
        first_block = req.input_len // bs
        extra = self.unique(req.request_id, "out", req.output_len)
        out = []
        for k in range(req.output_len):
            pos = req.input_len + k
            j = pos // bs - first_block
            if j < len(req.output_block_hashes):
                out.append(self.block(req.output_block_hashes[j])[pos % bs])
            else:
                out.append(extra[k])
        return out


@dataclass(slots=True)
class DriverRequest:
    """A trace request as plain data (no ``tuner.trace`` import here: no pyarrow)."""

    request_id: str
    arrival_s: float
    input_len: int
    output_len: int
    block_hashes: tuple[int, ...]
    output_block_hashes: tuple[int, ...] = ()
    session_id: str | None = None
    priority: int = 0


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
_SETTING_FIELDS = ("max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold",
                   "enable_chunked_prefill", "policy", "scheduler_reserve_full_isl",
                   "watermark", "prefill_schedule_interval")
#: SchedulerConfig class defaults: a setting at this value may be left out when the
#: installed vLLM lacks the field (e.g. 0.32 has no local prefill cadence knob semantics).
_DEFAULTS = {"long_prefill_token_threshold": 0, "enable_chunked_prefill": True,
             "policy": "fcfs", "scheduler_reserve_full_isl": True, "watermark": 0.0,
             "prefill_schedule_interval": 1}


def build_scheduler(*, model_dir: str, settings: dict[str, Any], block_size: int,
                    num_gpu_blocks: int, enable_prefix_caching: bool = True,
                    max_model_len: int = 8192, async_scheduling: bool = False,
                    scheduler_cls: type | None = None) -> Any:
    """vLLM's ``Scheduler`` (or ``scheduler_cls``) over a fake KV cache.

    Mirrors vLLM's ``tests/v1/core/utils.py::create_scheduler``: a fake
    ``KVCacheConfig`` with one full-attention group of ``num_gpu_blocks`` blocks (block
    0 is vLLM's null block), no model weights, CPU device.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    import dataclasses as dc

    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from tuner import vllm_plugin

    if scheduler_cls is None:
        scheduler_cls = (vllm_plugin.CacheAwareAsyncScheduler if async_scheduling
                         else vllm_plugin.CacheAwareScheduler)
    known = {f.name for f in dc.fields(SchedulerConfig)}
    kwargs: dict[str, Any] = {}
    for name in _SETTING_FIELDS:
        if name not in settings:
            continue
        if name in known:
            kwargs[name] = settings[name]
        elif settings[name] != _DEFAULTS.get(name):
            raise ValueError(f"setting {name}={settings[name]!r} is not supported by the "
                             f"installed vLLM (SchedulerConfig has no field {name!r})")
    model_config = ModelConfig(model=model_dir, dtype="float32", seed=0,
                               skip_tokenizer_init=True, max_model_len=max_model_len)
    sched_config = SchedulerConfig(max_model_len=max_model_len, is_encoder_decoder=False,
                                   async_scheduling=async_scheduling, **kwargs)
    cache_config = CacheConfig(block_size=block_size,
                               enable_prefix_caching=enable_prefix_caching)
    extra = {k: settings[k] for k in ("cache_aware_admission_window",
                                      "cache_aware_admission_threshold") if k in settings}
    vllm_config = VllmConfig(scheduler_config=sched_config, model_config=model_config,
                             cache_config=cache_config, device_config=DeviceConfig(device="cpu"),
                             additional_config=extra)
    kv_cache_config = KVCacheConfig(
        num_blocks=num_gpu_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    cache_config.num_gpu_blocks = num_gpu_blocks
    return scheduler_cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                         block_size=block_size, log_stats=True,
                         structured_output_manager=StructuredOutputManager(vllm_config))


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


def fake_model_output(scheduler: Any, output: Any, next_token: Any) -> Any:
    """``ModelRunnerOutput`` for ``output``: one token per request whose prefill is done.

    ``next_token(request)`` gives the id to "sample". After ``schedule()``
    ``num_computed_tokens`` already includes this step's tokens, so a request still short
    of ``num_tokens`` is mid-prefill and gets ``[]`` (vLLM's runner discards that sample).
    """
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(output.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        r = scheduler.requests[rid]
        sampled.append([next_token(r)] if r.num_computed_tokens >= r.num_tokens else [])
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled)


# ----------------------------------------------------------------------------------------
# The replay loop
# ----------------------------------------------------------------------------------------
class VllmCoreReplay:
    """Replays requests through vLLM's scheduler on the twin's clock.

    Loop per step (same clock as ``tuner.sim.engine.Simulator``): feed every request that
    has arrived by ``now`` -> ``schedule()`` -> duration from the step-time model ->
    fake model output -> ``update_from_output`` -> ``now += duration``. With nothing to
    schedule, the clock jumps to the next arrival.
    """

    def __init__(self, job: dict[str, Any]) -> None:
        from tuner.sim.batch import StepBatch

        self._StepBatch = StepBatch
        self.job = job
        cache = job["cache"]
        self.block_size = int(cache["block_size"])
        self.requests = [DriverRequest(**r) for r in job["requests"]]
        self.step_time = job["step_time"]
        self.load = job.get("load")
        self.record_steps = bool(job.get("record_steps", True))
        self.num_gpus = int(job.get("num_gpus", 1))
        t0 = time.perf_counter()
        self.scheduler = build_scheduler(
            model_dir=job["model_dir"], settings=job["settings"], block_size=self.block_size,
            num_gpu_blocks=int(cache["num_gpu_blocks"]),
            enable_prefix_caching=bool(cache.get("enable_prefix_caching", True)),
            max_model_len=int(cache["max_model_len"]))
        self.build_s = time.perf_counter() - t0
        self.hasher = make_block_hasher(self.block_size)
        self.tokens = TokenFactory(self.block_size)
        self.preempted_now: list[str] = []
        self._wrap_preempt()

    def _wrap_preempt(self) -> None:
        sched = self.scheduler
        original = sched._preempt_request
        record = self.preempted_now

        def preempt(request: Any, *args: Any, **kwargs: Any) -> Any:
            record.append(request.request_id)
            return original(request, *args, **kwargs)

        sched._preempt_request = preempt

    def _step_duration(self, batch: Any) -> float:
        st = self.step_time
        fn = getattr(st, "step_time_s", None)
        return float(fn(batch) if fn is not None else st(batch))

    def _rejects(self, r: DriverRequest) -> bool:
        """The twin's arrival-time refusals (``Simulator._make_request``), which vLLM's
        front end makes before its scheduler sees a request: empty prompt or
        ``max_tokens < 1``, prompt + output beyond ``max_model_len``, or a sequence needing
        more blocks than the whole cache (it would preempt itself forever)."""
        cache = self.job["cache"]
        bs = self.block_size
        return (r.input_len < 1 or r.output_len < 1
                or r.input_len + r.output_len > int(cache["max_model_len"])
                or -(-(r.input_len + r.output_len - 1) // bs) > int(cache["num_gpu_blocks"]) - 1)

    def run(self) -> Any:
        from tuner.records import ReplayResult, RequestResult, StepRecord

        sched = self.scheduler
        closed = self.load is not None and type(self.load).__name__ == "ClosedLoop"
        speedup = 1.0 if closed else float(getattr(self.load, "speedup", 1.0) or 1.0)
        concurrency = int(getattr(self.load, "concurrency", 0) or 0) if closed else 0
        # Issue order: by arrival time, ties by trace position (as the twin).
        order = sorted(range(len(self.requests)),
                       key=lambda i: (float(self.requests[i].arrival_s), i))
        live: dict[str, _Live] = {}
        rejected: dict[str, float] = {}
        nxt = 0
        in_flight = 0
        now = 0.0
        steps: list[Any] = []
        itl: list[tuple[float, int]] = []
        ts: dict[str, list[float]] = {k: [] for k in (
            "t_s", "kv_usage", "num_running", "num_waiting", "num_scheduled_tokens")}
        counters = {"prefix_cache_queries": 0.0, "prefix_cache_hits": 0.0, "preemptions": 0.0,
                    "num_steps": 0.0}
        running_ids: set[str] = set()
        wall0 = time.perf_counter()
        last_progress = wall0
        notes: list[str] = []

        def next_arrival() -> float:
            if nxt >= len(order):
                return math.inf
            if closed:
                return now if in_flight < concurrency else math.inf
            return self.requests[order[nxt]].arrival_s / speedup

        def admit_arrivals() -> None:
            nonlocal in_flight, nxt
            while nxt < len(order):
                r = self.requests[order[nxt]]
                if closed:
                    if in_flight >= concurrency:
                        return
                    at = now
                else:
                    at = r.arrival_s / speedup
                    if at > now:
                        return
                nxt += 1
                if self._rejects(r):
                    rejected[r.request_id] = at
                    continue
                in_flight += 1
                live[r.request_id] = _Live(req=r, outputs=self.tokens.output_tokens(r),
                                           arrival_s=at)
                sched.add_request(make_vllm_request(
                    r.request_id, self.tokens.prompt(r), r.output_len, self.hasher,
                    arrival_time=at, priority=r.priority))

        while True:
            admit_arrivals()
            if not sched.requests:
                t_next = next_arrival()
                if t_next == math.inf:
                    break
                now = max(now, t_next)
                continue
            self.preempted_now.clear()
            out = sched.schedule()
            scheduled = out.num_scheduled_tokens
            if not scheduled:
                sched.update_from_output(out, fake_model_output(sched, out, lambda r: 0))
                notes.append(f"t={now}: vLLM scheduled nothing with {len(sched.running)} "
                             f"running and {len(sched.requests) - len(sched.running)} "
                             "waiting; stopped (the rest is reported unfinished)")
                break
            items = []
            cached_now: dict[str, int] = {}
            for rid, n in scheduled.items():
                r = sched.requests[rid]
                before = r.num_computed_tokens - n
                items.append((before, n))
                if rid not in running_ids:  # admitted this step (new or resumed)
                    cached_now[rid] = before
                    lv = live[rid]
                    if lv.num_cached_tokens < 0:
                        lv.num_cached_tokens = before
                        lv.first_scheduled_s = now
                        counters["prefix_cache_queries"] += r.num_tokens
                        counters["prefix_cache_hits"] += before
            for rid in self.preempted_now:
                live[rid].num_preemptions += 1
            dur = self._step_duration(self._StepBatch.from_requests(items))
            end = now + dur
            usage = float(sched.kv_cache_manager.usage)
            num_running = len(sched.running)
            num_waiting = len(sched.requests) - num_running
            if self.record_steps:
                steps.append(StepRecord(
                    step=len(steps), start_s=now, duration_s=dur,
                    num_scheduled_tokens=dict(scheduled), preempted=tuple(self.preempted_now),
                    num_running=num_running, num_waiting=num_waiting, kv_usage=usage,
                    cached_tokens=cached_now))
            ts["t_s"].append(now)
            ts["kv_usage"].append(usage)
            ts["num_running"].append(float(num_running))
            ts["num_waiting"].append(float(num_waiting))
            ts["num_scheduled_tokens"].append(float(sum(scheduled.values())))
            counters["num_steps"] += 1
            counters["preemptions"] += len(self.preempted_now)

            def next_token(r: Any) -> int:
                outs = live[r.request_id].outputs
                k = len(r.output_token_ids)
                return outs[k] if k < len(outs) else VOCAB_LOW

            eco = sched.update_from_output(out, fake_model_output(sched, out, next_token))
            gaps: dict[float, int] = {}
            for rid in scheduled:
                r = sched.requests.get(rid)
                lv = live[rid]
                n_out = len(r.output_token_ids) if r is not None else lv.req.output_len
                if n_out > lv.num_generated:
                    if lv.num_generated == 0:
                        lv.first_token_s = end
                    else:
                        gap = end - lv.last_token_s
                        gaps[gap] = gaps.get(gap, 0) + 1
                    lv.last_token_s = end
                    lv.num_generated = n_out
            itl.extend(gaps.items())
            for outputs in eco.values():
                for o in outputs.outputs:
                    if o.finish_reason is not None:
                        live[o.request_id].finish_s = end
                        in_flight -= 1
            running_ids = {r.request_id for r in sched.running}
            now = end
            if time.perf_counter() - last_progress > 0.5:
                last_progress = time.perf_counter()
                print(json.dumps({"progress": nxt / max(1, len(order))}), flush=True)

        results = []
        num_finished = 0
        for r in self.requests:
            lv = live.get(r.request_id)
            if lv is None:
                at = rejected.get(r.request_id)
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

        counters.update({"rejected": float(len(rejected)),
                         "num_requests": float(len(self.requests)),
                         "num_finished": float(num_finished),
                         "cache_aware_reorders": float(getattr(
                             sched, "num_cache_aware_reorders", 0))})
        notes.insert(0, f"vllm {vllm.__version__}; scheduler {type(sched).__name__}; "
                        f"built in {self.build_s:.2f}s")
        first_arrival = min((x.arrival_s for x in results if x.arrival_s == x.arrival_s),
                            default=0.0)
        return ReplayResult(
            backend="vllm-core", requests=results, itl_samples=itl, timeseries=ts,
            counters=counters, simulated_s=max(0.0, now - min(first_arrival, now)),
            wall_s=wall, num_gpus=self.num_gpus, steps=steps if self.record_steps else None,
            notes=notes)


def main(argv: list[str]) -> int:
    """``JOB.pickle RESULT.pickle``: a job dict gives a ``ReplayResult``; a list of jobs
    (one vLLM import for many replays, as the parity tests use) gives a list."""
    if len(argv) != 3:
        print("usage: _vllm_core_driver.py JOB.pickle RESULT.pickle", file=sys.stderr)
        return 2
    with open(argv[1], "rb") as f:
        job = pickle.load(f)
    if isinstance(job, list):
        result: Any = [VllmCoreReplay(j).run() for j in job]
    else:
        result = VllmCoreReplay(job).run()
    from tuner.outputs import write_bytes  # standard library only, like this driver

    write_bytes(argv[2], pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL), announce=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
