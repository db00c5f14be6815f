"""Fit the step-time model's per-GPU physics to published serving benchmarks.

``tuner calibrate --from-benchmarks CSV`` and bench/calibration_fit.py run this. Per
GPU, the fitted quantities are physical and few: for each GEMM kernel format the rows
use, its bandwidth and compute efficiencies and its kernel floor; the KV bandwidth,
attention efficiencies, all-reduce latency and bandwidth, and the CPU overheads. Each
is bounded (:data:`tuner.perf.calibration_fit.BOUNDS`) and pulled towards the hardware
preset's prior (whose source the preset cites) by a log-normal prior, so a parameter
the rows barely constrain stays physical instead of absorbing a row's noise.

Every GPU's parameters touch only that GPU's rows, so the fit splits by GPU exactly.
The residuals are ``log(predicted / published)`` over every reported figure, divided by
:data:`FIGURE_NOISE` (published figures of one setup scatter by about that much
between software builds and runs). Leave-one-series-out (:func:`leave_one_series_out`)
refits without each series and predicts it: what to expect on results the fit has not
seen.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.perf.benchmarks import BenchmarkRow, RecordedRun
from tuner.perf.calibration_fit import bounds_of, used_formats
from tuner.perf.coefficients import Coefficients
from tuner.perf.fitting import Param, fit_params
from tuner.perf.step_time import RooflineStepTimeModel

#: Relative scatter of a published figure around what its setup "should" give.
FIGURE_NOISE = 0.10
#: Prior widths (e-folds): kernel efficiencies are known to within ~x2, overheads less.
SIGMA = {"eta_mem": 0.7, "eta_compute": 0.7, "t0_s": 0.7, "kv_bw_eff": 0.5,
         "attn_prefill_eff": 0.7, "attn_decode_eff": 0.7, "allreduce_latency_s": 0.7,
         "allreduce_bw_eff": 0.5, "step_overhead_s": 1.0, "request_overhead_s": 1.0,
         "moe_layer_overhead_s": 1.0}
#: Parameters fitted per GPU besides the per-format GEMM ones.
GPU_PARAMS = ("kv_bw_eff", "attn_prefill_eff", "attn_decode_eff", "step_overhead_s",
              "request_overhead_s")


@dataclass(frozen=True, slots=True)
class Prediction:
    row: BenchmarkRow
    figure: str
    published: float
    predicted: float

    @property
    def rel_error(self) -> float:
        return self.predicted / self.published - 1.0


def _params(runs: Sequence[RecordedRun], base: Coefficients, hardware: Any) -> list[Param]:
    names: list[str] = []
    fmts: set[str] = set()
    tp_gt1 = moe = False
    for run in runs:
        spec = run.resolved.model
        fmts.update(used_formats(spec))
        tp_gt1 |= run.row.tp > 1
        moe |= spec.is_moe
    for f in sorted(fmts):
        names += [f"gemm.{f}.eta_mem", f"gemm.{f}.eta_compute", f"gemm.{f}.t0_s"]
    names += list(GPU_PARAMS)
    if tp_gt1:
        names += ["allreduce_latency_s", "allreduce_bw_eff"]
    if moe:
        names.append("moe_layer_overhead_s")
    flat = base.flat()
    flat.setdefault("allreduce_latency_s", hardware.allreduce_latency_s)
    out = []
    for name in names:
        lo, hi = bounds_of(name)
        prior = min(max(flat[name], lo * 1.001), hi / 1.001)
        out.append(Param(name, lo, hi, prior, SIGMA[name.rsplit(".", 1)[-1]]))
    return out


def _model(run: RecordedRun, coeffs: Coefficients) -> RooflineStepTimeModel:
    res = run.resolved
    return RooflineStepTimeModel(res.hardware, res.model, run.row.tp, coeffs)


def fit_gpu(runs: Sequence[RecordedRun], base: Coefficients) -> tuple[Coefficients, dict[str, Any]]:
    """Fitted coefficients for one GPU's rows (``base`` = its priors) and fit facts."""
    hardware = runs[0].resolved.hardware
    params = _params(runs, base, hardware)
    published = [np.array([math.log(v) for v in run.row.figures.values()]) for run in runs]

    def residual(values: dict[str, float]) -> np.ndarray:
        coeffs = base.with_flat(values)
        parts = []
        for run, logs in zip(runs, published):
            pred = run.figures(_model(run, coeffs))
            parts.append((np.log([pred[k] for k in run.row.figures]) - logs) / FIGURE_NOISE)
        return np.concatenate(parts)

    result = fit_params(residual, params, max_iter=80)
    coeffs = base.with_flat(result.values)
    info = {"parameters": len(params), "figures": int(sum(len(r.row.figures) for r in runs)),
            "iterations": result.iterations, "converged": result.converged,
            "at_bounds": list(result.at_bounds)}
    return coeffs, info


def fittable(run: RecordedRun) -> str | None:
    """None if ``run`` enters the fit, else why not (it is still predicted and reported).

    A model with linear-attention layers (Qwen3.5/3.6 Gated DeltaNet) spends time in
    kernels the step-time model does not price (the recurrent scan): fitting its rows
    would bend the GEMM efficiencies of every other model on that GPU to absorb it.
    """
    if run.resolved.model.num_linear_layers:
        return "linear-attention layers are not priced"
    return None


def fit_all(runs: Sequence[RecordedRun], priors: dict[str, Coefficients], *,
            exclude_series: str | None = None) -> tuple[dict[str, Coefficients], dict[str, Any]]:
    """Per-GPU fits over ``runs`` (minus one series); GPUs with no rows keep their priors."""
    by_gpu: dict[str, list[RecordedRun]] = {}
    for run in runs:
        if run.row.series != exclude_series and fittable(run) is None:
            by_gpu.setdefault(run.row.hardware, []).append(run)
    fitted = dict(priors)
    infos: dict[str, Any] = {}
    for gpu, gpu_runs in sorted(by_gpu.items()):
        fitted[gpu], infos[gpu] = fit_gpu(gpu_runs, priors[gpu])
    return fitted, infos


def predict(runs: Sequence[RecordedRun], coeffs: dict[str, Coefficients]) -> list[Prediction]:
    out = []
    for run in runs:
        pred = run.figures(_model(run, coeffs[run.row.hardware]))
        out += [Prediction(run.row, k, v, pred[k]) for k, v in run.row.figures.items()]
    return out


def leave_one_series_out(runs: Sequence[RecordedRun],
                         priors: dict[str, Coefficients]) -> list[Prediction]:
    """Each series predicted by a fit that never saw it."""
    out: list[Prediction] = []
    for series in sorted({r.row.series for r in runs}):
        fitted, _ = fit_all(runs, priors, exclude_series=series)
        out += predict([r for r in runs if r.row.series == series], fitted)
    return out


def median_abs_error(preds: Sequence[Prediction]) -> float:
    return statistics.median(abs(p.rel_error) for p in preds) if preds else float("nan")


def changed(fitted: Coefficients, prior: Coefficients) -> dict[str, Any]:
    """The coefficients the fit moved, as a calibration-style nested mapping."""
    new, old = fitted.flat(), prior.flat()
    out: dict[str, Any] = {}
    for name, value in new.items():
        if not math.isclose(value, old.get(name, math.nan), rel_tol=1e-12):
            parts = name.split(".")
            if parts[0] == "gemm":
                out.setdefault("gemm", {}).setdefault(parts[1], {})[parts[2]] = float(f"{value:.6g}")
            else:
                out[name] = float(f"{value:.6g}")
    return out
