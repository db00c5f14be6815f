"""``tuner calibrate``: measure step times on a live vLLM server and fit the step-time model.

Each probe is timed on the server, from the engine-side histograms of ``/metrics``
(before/after deltas; ``vllm/v1/metrics/stats.py`` @ 0.32), while the server serves
nothing else:

* ``decode``  N concurrent requests with unique L-token prompts, T tokens each: the mean
  of ``vllm:inter_token_latency_seconds`` over the probe (engine-core output timestamps)
  is the N-request decode step at context ~L + T/2.
* ``prefill`` one lone request of P unique tokens, ``max_tokens=1``: its
  ``vllm:request_prefill_time_seconds`` (first token - the SCHEDULED event) is exactly the
  one step that ran it, without the HTTP and IPC time a client's TTFT would add.
* ``mixed``   N decoders running at context ~L, then one P-token prefill joins: the
  joining request is the only one to finish meanwhile, so the prefill-time delta is the
  step that ran the prefill together with the N decode tokens.

Run the server with synchronous scheduling (``tuner calibrate --launch`` passes
``--no-async-scheduling``; vLLM's CPU platform forces it): under async scheduling step k+1
is scheduled while step k runs, so a prefill time would include the step in flight.

Why not client-side token times: on a shared or loaded client the asyncio loop reads
several steps' tokens in one burst, which distorts gaps and spans (measured on the
2-core CI machine: a decode probe read 0.13 ms for a 5 ms step). The replay itself still
stamps tokens client-side: that is the user-visible latency it reports.

Each probe becomes a ``StepBatch``; :func:`tuner.perf.fit.to_probes.fit_step_time` fits
the roofline's coefficients by non-negative least squares over its feature vector and the
result is written with ``save_calibration`` (``--calibration FILE`` in the twin).
Prompts are fresh random tokens every run, so the prefix cache never shortens a probe.
"""

from __future__ import annotations

import asyncio
import math
import random
import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import tuner.serve.http as http
from tuner.errors import BackendError, ConfigError
from tuner.serve.server import VllmServer
from tuner.sim.batch import StepBatch
from tuner.perf.fit.calibration_file import Calibration
from tuner.perf.fit.to_probes import StepTimeFit, fit_step_time
from tuner.perf.hardware import load_hardware
from tuner.perf.models import load_model

ProbeKind = Literal["prefill", "decode", "mixed"]
_VOCAB_LOW, _VOCAB_HIGH = 3, 999  # as the replay's TokenFactory: valid for any vocab >= 1000
#: Engine-side timings in /metrics (vllm/v1/metrics/stats.py @ 0.32: ITL from engine-core
#: output timestamps; prefill time = first token - SCHEDULED event of the request).
ITL_HISTOGRAM = "vllm:inter_token_latency_seconds"
PREFILL_HISTOGRAM = "vllm:request_prefill_time_seconds"


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """Which probes to run. Defaults fit a small CPU server in about a minute."""

    prefill_lens: tuple[int, ...] = (32, 256, 512, 1024)  # lone prefills (tokens)
    decode_batch_sizes: tuple[int, ...] = (1, 4, 16)  # concurrent decoders
    decode_ctx_lens: tuple[int, ...] = (64, 512)  # their prompt lengths
    decode_tokens: int = 24  # tokens each decoder generates
    mixed: tuple[tuple[int, int, int], ...] = ((8, 128, 256), (8, 128, 1024))  # (N, L, P)
    repeats: int = 3  # runs per probe (the median is kept)

    def validate(self, max_num_batched_tokens: int | None, max_model_len: int | None) -> None:
        budget = max_num_batched_tokens or math.inf
        for p in self.prefill_lens:
            if p > budget:
                raise ConfigError(f"prefill probe of {p} tokens exceeds max_num_batched_tokens="
                                  f"{max_num_batched_tokens}: it would be chunked over steps")
        for n, _, p in self.mixed:
            if n + p > budget:
                raise ConfigError(f"mixed probe ({n} decoders + {p}-token prefill) exceeds "
                                  f"max_num_batched_tokens={max_num_batched_tokens}")
        longest = max([*self.prefill_lens, *(c + self.decode_tokens for c in self.decode_ctx_lens),
                       *(lc + 64 for _, lc, _ in self.mixed)], default=0)
        if max_model_len is not None and longest > max_model_len:
            raise ConfigError(f"a probe needs {longest} tokens but max_model_len={max_model_len}")
        if self.repeats < 1 or self.decode_tokens < 4:
            raise ConfigError("repeats must be >= 1 and decode_tokens >= 4")


@dataclass(frozen=True, slots=True)
class Probe:
    """One measured step shape."""

    kind: ProbeKind
    label: str  # e.g. "decode N=16 L=512"
    batch: StepBatch
    measured_s: float  # median step time (for a TTFT probe: the time to first token)
    num_samples: int  # intervals behind the median


@dataclass(slots=True)
class CalibrationResult:
    """Probes, the fit and the calibration to write."""

    probes: list[Probe]
    fit: StepTimeFit
    calibration: Calibration
    errors_by_kind: dict[str, dict[str, float]] = field(default_factory=dict)

    def table(self) -> list[dict[str, Any]]:
        """One row per probe: measured, predicted, error (for printing / JSON)."""
        return [{"kind": p.kind, "probe": p.label, "measured_ms": p.measured_s * 1e3,
                 "predicted_ms": pred * 1e3, "error_pct": err * 100, "samples": p.num_samples}
                for p, pred, err in zip(self.probes, self.fit.predicted_s, self.fit.rel_errors)]


# --------------------------------------------------------------------------- probes


class _Prober:
    """Runs the probes of a :class:`ProbePlan` against one idle server."""

    def __init__(self, server: VllmServer, progress: Callable[[str], None] | None) -> None:
        assert server.endpoint is not None
        self.server = server
        self.ep = server.endpoint
        self.rng = random.Random(secrets.randbits(64))  # fresh prompts: no prefix-cache hits
        self.progress = progress or (lambda _msg: None)

    def _prompt(self, n: int) -> list[int]:
        return [self.rng.randint(_VOCAB_LOW, _VOCAB_HIGH) for _ in range(n)]

    async def _stream(self, prompt: list[int], max_tokens: int) -> tuple[float, list[float]]:
        """(send time, token times) of one streamed request (perf_counter seconds)."""
        payload = {"model": self.server.model_name, "prompt": prompt, "max_tokens": max_tokens,
                   "ignore_eos": True, "temperature": 0.0, "stream": True, "return_token_ids": True}
        times: list[float] = []
        t_send = time.perf_counter()
        async with http.SseStream(self.ep, "/v1/completions", payload) as events:
            async for t, obj in events:
                for choice in obj.get("choices") or ():
                    times.extend([t] * len(choice.get("token_ids") or []))
        if len(times) != max_tokens:
            raise BackendError(f"calibration request got {len(times)} tokens, {max_tokens} asked")
        return t_send, times

    async def _histogram_delta(self, name: str, before: Any) -> tuple[float, float]:
        """(sum, count) added to histogram ``name`` since the snapshot ``before``."""
        after = (await self.server.scrape_async()).histogram(name)
        if after is None:
            raise BackendError(f"/metrics has no {name}: cannot time steps on the server")
        d = after.minus(before.histogram(name))
        return d.sum, d.count

    async def decode(self, n: int, ctx: int, tokens: int) -> tuple[float, int]:
        """Mean engine-side inter-token latency of N requests decoding together."""
        before = await self.server.scrape_async()
        await asyncio.gather(*(self._stream(self._prompt(ctx), tokens) for _ in range(n)))
        total, count = await self._histogram_delta(ITL_HISTOGRAM, before)
        if count < 1:
            raise BackendError(f"decode probe N={n} L={ctx}: no inter-token latencies recorded")
        return total / count, int(count)

    async def ttft(self, length: int) -> float:
        """Engine-side prefill time (scheduled -> first token) of a lone request."""
        before = await self.server.scrape_async()
        await self._stream(self._prompt(length), 1)
        total, count = await self._histogram_delta(PREFILL_HISTOGRAM, before)
        if count != 1:
            raise BackendError(f"prefill probe P={length}: {count:g} requests finished, 1 expected")
        return total

    async def mixed(self, n: int, ctx: int, prefill: int) -> tuple[float, int, float]:
        """(prefill time of a request joining N decoders, 1, mean decoder context then)."""
        head = 8  # decoder tokens before the prefill joins
        total = head + 88  # long decoders: they must outlive the prefill by far
        progress: list[list[float]] = [[] for _ in range(n)]

        async def decoder(i: int) -> list[float]:
            payload = {"model": self.server.model_name, "prompt": self._prompt(ctx),
                       "max_tokens": total, "ignore_eos": True, "temperature": 0.0,
                       "stream": True, "return_token_ids": True}
            async with http.SseStream(self.ep, "/v1/completions", payload) as events:
                async for t, obj in events:
                    for choice in obj.get("choices") or ():
                        progress[i].extend([t] * len(choice.get("token_ids") or []))
            return progress[i]

        tasks = [asyncio.create_task(decoder(i)) for i in range(n)]
        try:
            while min(len(p) for p in progress) < head:
                if any(t.done() for t in tasks):
                    break
                await asyncio.sleep(0.002)
            ctx_at = ctx + statistics.mean(len(p) for p in progress)
            before = await self.server.scrape_async()
            await self._stream(self._prompt(prefill), 1)
            # the joining request is the only one finishing here: its prefill time is the
            # duration of the mixed step (the decoders finish much later)
            step, count = await self._histogram_delta(PREFILL_HISTOGRAM, before)
            still_running = not all(t.done() for t in tasks)
        finally:
            await asyncio.gather(*tasks, return_exceptions=True)
        if count != 1 or not still_running:
            raise BackendError(f"mixed probe N={n} L={ctx} P={prefill}: the decoders did not "
                               "run across the prefill")
        return step, 1, ctx_at

    async def run(self, plan: ProbePlan) -> list[Probe]:
        """Every probe once per round, ``repeats`` rounds, medians kept.

        Rounds interleave the probes, so a slow spell of a shared machine spreads over all
        probes instead of inflating one of them.
        """
        for _ in range(2):  # warm-up: first requests pay one-off costs (allocations)
            await self._stream(self._prompt(16), 4)
        for length in plan.prefill_lens:  # ... and so does the first prefill of a new shape
            await self.ttft(length)
        shapes: list[tuple[ProbeKind, tuple[int, ...]]] = (
            [("prefill", (p,)) for p in plan.prefill_lens]
            + [("decode", (n, c)) for n in plan.decode_batch_sizes for c in plan.decode_ctx_lens]
            + [("mixed", m) for m in plan.mixed])
        samples: dict[int, list[tuple[float, int, float]]] = {i: [] for i in range(len(shapes))}
        for rnd in range(plan.repeats):
            for i, (kind, args) in enumerate(shapes):
                if kind == "prefill":
                    samples[i].append((await self.ttft(args[0]), 1, 0.0))
                elif kind == "decode":
                    value, k = await self.decode(args[0], args[1], plan.decode_tokens)
                    samples[i].append((value, k, 0.0))
                else:
                    for _ in range(3):  # a run can miss the mixed step (client lag): retry
                        try:
                            samples[i].append(await self.mixed(*args))
                            break
                        except BackendError:
                            continue
            self.progress(f"round {rnd + 1}/{plan.repeats} done")
        probes = []
        for i, (kind, args) in enumerate(shapes):
            got = samples[i]
            if not got:
                raise BackendError(f"{kind} probe {args}: no run had the decoders running "
                                   "across the prefill; lower the load on the server")
            measured = statistics.median(v for v, _, _ in got)
            count = sum(k for _, k, _ in got)
            if kind == "prefill":
                (length,) = args
                probes.append(Probe("prefill", f"prefill P={length}", StepBatch(
                    num_prefill_reqs=1, num_prefill_tokens=length,
                    prefill_attn_pairs=length * (length + 1) / 2), measured, count))
            elif kind == "decode":
                n, ctx = args
                mid = ctx + plan.decode_tokens / 2
                probes.append(Probe("decode", f"decode N={n} L={ctx}", StepBatch(
                    num_decode_reqs=n, decode_ctx_tokens=int(round(n * mid))), measured, count))
            else:
                n, ctx, p = args
                ctx_at = statistics.mean(c for _, _, c in got)
                probes.append(Probe("mixed", f"mixed N={n} L={ctx} P={p}", StepBatch(
                    num_prefill_reqs=1, num_prefill_tokens=p, prefill_attn_pairs=p * (p + 1) / 2,
                    num_decode_reqs=n, decode_ctx_tokens=int(round(n * (ctx_at + 1)))),
                    measured, count))
        return probes


def run_probes(server: VllmServer, plan: ProbePlan = ProbePlan(), *,
               progress: Callable[[str], None] | None = None) -> list[Probe]:
    """Measure the probes on an idle, started server."""
    return asyncio.run(_Prober(server, progress).run(plan))


# --------------------------------------------------------------------------- fit


def fit_probes(probes: list[Probe], *, hardware: str, model: str, tp: int = 1,
               vllm_version: str | None = None,
               extra_fit: dict[str, Any] | None = None, quantization: str | None = None,
               kv_cache_dtype: str | None = None) -> CalibrationResult:
    """Fit the step-time model to ``probes`` and build the calibration to save.

    Args:
        probes: measured probes (:func:`run_probes`).
        hardware: hardware preset or YAML path the twin will run with (recorded in the file).
        model: model preset or config path (recorded in the file).
        tp: tensor-parallel size of the server.
    """
    hw = load_hardware(hardware)
    spec = load_model(model).with_dtypes(quantization=quantization,
                                         kv_cache_dtype=kv_cache_dtype)
    fit = fit_step_time(hw, spec, tp, [p.batch for p in probes], [p.measured_s for p in probes])
    by_kind: dict[str, dict[str, float]] = {}
    for kind in ("prefill", "decode", "mixed"):
        errs = [abs(e) for p, e in zip(probes, fit.rel_errors) if p.kind == kind]
        if errs:
            by_kind[kind] = {"num_probes": len(errs), "mean_abs_pct": 100 * statistics.mean(errs),
                             "max_abs_pct": 100 * max(errs)}
    info: dict[str, Any] = {
        "vllm_version": vllm_version, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "method": ("bounded log-space Levenberg-Marquardt over the per-kernel model's "
                   "physical coefficients, weak priors at the GPU's defaults"),
        "num_probes": len(probes), "rms_rel_error_pct": 100 * fit.rms_rel_error,
        "errors_by_kind": by_kind,
        "regime_rounds": fit.rounds, "regimes_stable": fit.regimes_stable,
        "pinned_efficiencies": list(fit.pinned), "unused_features": list(fit.unused),
        "probes": [{"kind": p.kind, "probe": p.label, "measured_ms": round(p.measured_s * 1e3, 4),
                    "predicted_ms": round(pred * 1e3, 4)}
                   for p, pred in zip(probes, fit.predicted_s)],
    }
    info.update(extra_fit or {})
    calibration = Calibration(hardware=hardware, model=model, tp=tp,
                              coefficients=fit.coefficients, fit=info)
    return CalibrationResult(probes=probes, fit=fit, calibration=calibration,
                             errors_by_kind=by_kind)


def calibrate(server: VllmServer, *, hardware: str, model: str, tp: int = 1,
              plan: ProbePlan = ProbePlan(), max_num_batched_tokens: int | None = None,
              max_model_len: int | None = None,
              progress: Callable[[str], None] | None = None,
              quantization: str | None = None,
              kv_cache_dtype: str | None = None) -> CalibrationResult:
    """Probe a started server and fit: the library behind ``tuner calibrate``."""
    plan.validate(max_num_batched_tokens, max_model_len)
    probes = run_probes(server, plan, progress=progress)
    return fit_probes(probes, hardware=hardware, model=model, tp=tp,
                      vllm_version=server.vllm_version, quantization=quantization,
                      kv_cache_dtype=kv_cache_dtype)
