"""``tuner calibrate``: measure step times on a live vLLM server and fit the step-time model.

A client sees tokens, not steps, so each probe is built so that one client-side interval
*is* one engine step (the server serves nothing else meanwhile):

* ``decode``  N concurrent requests with unique L-token prompts decode together; once all
  N stream, every inter-token gap is one N-request decode step at context ~L + k.
  Measured: the median of those gaps.
* ``prefill`` one lone request of P unique tokens, ``max_tokens=1``. Its TTFT is the
  prefill step plus a fixed request overhead (HTTP, tokenizer-free input processing, the
  engine-core IPC both ways). The overhead is measured once as TTFT(4-token prompt) minus
  the 1-request decode step (a 4-token prefill costs what a 1-token decode costs), and
  subtracted. Measured: median over repeats.
* ``mixed``   N decoders running at context ~L, then one P-token prefill joins; the step
  that runs it also emits a token of every decoder, so the decoders' gap ending at the
  prefill's first token is one mixed step. Measured: median over decoders and repeats.

Each probe becomes a ``StepBatch``; :func:`tuner.sim.calibration_fit.fit_step_time` fits
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

from tuner.errors import BackendError, ConfigError
from tuner.replay import _serve_http as http
from tuner.replay._serve_server import VllmServer
from tuner.sim.batch import StepBatch
from tuner.sim.calibration import Calibration
from tuner.sim.calibration_fit import StepTimeFit, fit_step_time
from tuner.sim.hardware import load_hardware
from tuner.sim.models import load_model

ProbeKind = Literal["prefill", "decode", "mixed"]
_VOCAB_LOW, _VOCAB_HIGH = 3, 999  # as the replay's TokenFactory: valid for any vocab >= 1000


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
    measured_s: float  # median step time
    num_samples: int  # intervals behind the median


@dataclass(slots=True)
class CalibrationResult:
    """Probes, the fit and the calibration to write."""

    probes: list[Probe]
    fit: StepTimeFit
    calibration: Calibration
    request_overhead_s: float  # TTFT - step, subtracted from the prefill probes
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

    async def _stream(self, prompt: list[int], max_tokens: int,
                      started: asyncio.Event | None = None) -> tuple[float, list[float]]:
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

    async def decode(self, n: int, ctx: int, tokens: int) -> tuple[float, int]:
        runs = await asyncio.gather(*(self._stream(self._prompt(ctx), tokens) for _ in range(n)))
        start = max(times[0] for _, times in runs)  # all N decoding from here on
        # Per request: span / tokens over the steady part. Not the median gap: when the
        # client or the API server lags, tokens of several steps arrive in one SSE event
        # (a zero gap, then a double one), which biases gap statistics but not spans.
        per_request = []
        for _, times in runs:
            i0 = next(i for i, t in enumerate(times) if t >= start - 1e-6)
            i0 = _last_of_group(times, i0)
            if len(times) - 1 - i0 >= 2:
                per_request.append((times[-1] - times[i0]) / (len(times) - 1 - i0))
        if not per_request:
            raise BackendError(f"decode probe N={n} L={ctx}: no steady-state span")
        return statistics.median(per_request), len(per_request)

    async def ttft(self, length: int) -> float:
        t_send, times = await self._stream(self._prompt(length), 1)
        return times[0] - t_send

    async def mixed(self, n: int, ctx: int, prefill: int) -> tuple[float, int, float]:
        """(median mixed-step gap, samples, mean decoder context at injection)."""
        head = 8  # decoder tokens before the prefill joins
        total = head + 24
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
        while min(len(p) for p in progress) < head:
            if any(t.done() for t in tasks):
                break
            await asyncio.sleep(0.002)
        done_tokens = statistics.mean(len(p) for p in progress)
        t_send, ptimes = await self._stream(self._prompt(prefill), 1)
        decoders = await asyncio.gather(*tasks)
        t_first = ptimes[0]
        # Per decoder: a = its last token before the prefill was sent, b = a token well
        # after the prefill's first one (both the last of their SSE event, so their stamps
        # are exact). The span a->b holds (b - a - 1) decode steps and the mixed step.
        estimates = []
        for times in decoders:
            before = [i for i, t in enumerate(times) if t <= t_send]
            if len(before) < 3:
                continue
            a = _last_of_group(times, before[-1])
            if times[a] > t_send:
                a = before[-1]
            steady = (times[a] - times[1]) / max(a - 1, 1)
            after = [i for i, t in enumerate(times) if t >= t_first + 2 * steady]
            if not after:
                continue
            b = _last_of_group(times, after[0])
            tail = (times[-1] - times[b]) / (len(times) - 1 - b) if len(times) - 1 - b >= 2 else steady
            t_decode = (steady + tail) / 2
            estimates.append(times[b] - times[a] - (b - a - 1) * t_decode)
        if not estimates:
            raise BackendError(f"mixed probe N={n} L={ctx} P={prefill}: the decoders did not "
                               "run across the prefill")
        return max(statistics.median(estimates), 1e-6), len(estimates), ctx + done_tokens

    async def run(self, plan: ProbePlan) -> tuple[list[Probe], float]:
        probes: list[Probe] = []
        # warm-up: first requests pay one-off costs (allocations, caches)
        for _ in range(2):
            await self._stream(self._prompt(16), 4)
        one_step = [(await self.decode(1, 16, plan.decode_tokens))[0] for _ in range(plan.repeats)]
        tiny = [await self.ttft(4) for _ in range(plan.repeats)]
        overhead = max(statistics.median(tiny) - statistics.median(one_step), 0.0)
        self.progress(f"request overhead {overhead * 1e3:.1f} ms")
        for length in plan.prefill_lens:
            vals = [await self.ttft(length) - overhead for _ in range(plan.repeats)]
            measured = statistics.median(vals)
            probes.append(Probe("prefill", f"prefill P={length}", StepBatch(
                num_prefill_reqs=1, num_prefill_tokens=length,
                prefill_attn_pairs=length * (length + 1) / 2), max(measured, 1e-6), len(vals)))
            self.progress(probes[-1].label)
        for n in plan.decode_batch_sizes:
            for ctx in plan.decode_ctx_lens:
                runs = [await self.decode(n, ctx, plan.decode_tokens) for _ in range(plan.repeats)]
                measured = statistics.median(v for v, _ in runs)
                mid = ctx + plan.decode_tokens / 2
                probes.append(Probe("decode", f"decode N={n} L={ctx}", StepBatch(
                    num_decode_reqs=n, decode_ctx_tokens=int(round(n * mid))), measured,
                    sum(k for _, k in runs)))
                self.progress(probes[-1].label)
        for n, ctx, p in plan.mixed:
            runs3 = [await self.mixed(n, ctx, p) for _ in range(plan.repeats)]
            measured = statistics.median(v for v, _, _ in runs3)
            ctx_at = statistics.mean(c for _, _, c in runs3)
            probes.append(Probe("mixed", f"mixed N={n} L={ctx} P={p}", StepBatch(
                num_prefill_reqs=1, num_prefill_tokens=p, prefill_attn_pairs=p * (p + 1) / 2,
                num_decode_reqs=n, decode_ctx_tokens=int(round(n * (ctx_at + 1)))),
                measured, sum(k for _, k, _ in runs3)))
            self.progress(probes[-1].label)
        return probes, overhead


def run_probes(server: VllmServer, plan: ProbePlan = ProbePlan(), *,
               progress: Callable[[str], None] | None = None) -> tuple[list[Probe], float]:
    """Measure the probes on an idle, started server -> (probes, request overhead s)."""
    return asyncio.run(_Prober(server, progress).run(plan))


def _last_of_group(times: list[float], i: int) -> int:
    """The last index whose stamp equals ``times[i]`` (tokens that arrived in one event)."""
    while i + 1 < len(times) and times[i + 1] == times[i]:
        i += 1
    return i


# --------------------------------------------------------------------------- fit


def fit_probes(probes: list[Probe], *, hardware: str, model: str, tp: int = 1,
               request_overhead_s: float = math.nan, vllm_version: str | None = None,
               extra_fit: dict[str, Any] | None = None) -> CalibrationResult:
    """Fit the step-time model to ``probes`` and build the calibration to save.

    Args:
        probes: measured probes (:func:`run_probes`).
        hardware: hardware preset or YAML path the twin will run with (recorded in the file).
        model: model preset or config path (recorded in the file).
        tp: tensor-parallel size of the server.
    """
    hw = load_hardware(hardware)
    spec = load_model(model)
    fit = fit_step_time(hw, spec, tp, [p.batch for p in probes], [p.measured_s for p in probes])
    by_kind: dict[str, dict[str, float]] = {}
    for kind in ("prefill", "decode", "mixed"):
        errs = [abs(e) for p, e in zip(probes, fit.rel_errors) if p.kind == kind]
        if errs:
            by_kind[kind] = {"num_probes": len(errs), "mean_abs_pct": 100 * statistics.mean(errs),
                             "max_abs_pct": 100 * max(errs)}
    info: dict[str, Any] = {
        "vllm_version": vllm_version, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "method": "NNLS over RooflineStepTimeModel.features (relative least squares)",
        "num_probes": len(probes), "rms_rel_error_pct": 100 * fit.rms_rel_error,
        "errors_by_kind": by_kind, "request_overhead_ms": request_overhead_s * 1e3,
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
                             request_overhead_s=request_overhead_s, errors_by_kind=by_kind)


def calibrate(server: VllmServer, *, hardware: str, model: str, tp: int = 1,
              plan: ProbePlan = ProbePlan(), max_num_batched_tokens: int | None = None,
              max_model_len: int | None = None,
              progress: Callable[[str], None] | None = None) -> CalibrationResult:
    """Probe a started server and fit: the library behind ``tuner calibrate``."""
    plan.validate(max_num_batched_tokens, max_model_len)
    probes, overhead = run_probes(server, plan, progress=progress)
    return fit_probes(probes, hardware=hardware, model=model, tp=tp, request_overhead_s=overhead,
                      vllm_version=server.vllm_version)
