"""Fit the per-kernel step-time model to a real server's probes (measured step times).

Pure math, no I/O: ``tuner calibrate`` measures steps on a server and hands this module
``(StepBatch, seconds)`` pairs. The fitted quantities are the model's physical
parameters for the kernel formats the model uses (per format ``eta_mem``,
``eta_compute``, ``m_half``, ``t0``; KV bandwidth, attention efficiencies and floor;
all-reduce latency and bandwidth; the CPU and launch overheads), each bounded and pulled
weakly towards the GPU's default (its preset's priors and the shipped fit) by
:func:`tuner.perf.fit.least_squares.fit_params`. The residuals are relative (predicted / measured
- 1): a 2 ms decode step and a 200 ms prefill weigh the same, which is what "within
X %" promises. Probes price vectorised (:meth:`RooflineStepTimeModel.terms`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tuner.perf.fit.coefficients import Coefficients
from tuner.perf.fit.least_squares import Param, fit_params
from tuner.perf.fit.parameters import batch_arrays, bounds_of, step_times, used_formats
from tuner.perf.fit.published import default_coefficients
from tuner.perf.hardware import HardwareSpec
from tuner.perf.models import ModelSpec
from tuner.perf.step_time import RooflineStepTimeModel
from tuner.sim.batch import StepBatch

#: Relative noise of a measured probe (repeats of one probe on a quiet server scatter by
#: about 1 %); residuals are divided by it, so the prior terms weigh as much as one
#: probe that is off by ``sigma`` e-folds x this.
PROBE_NOISE = 0.01


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
            :func:`tuner.perf.fit.published.default_coefficients`).
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
