"""Fit the step-time model's per-GPU physics to published serving benchmarks.

``tuner calibrate --from-benchmarks CSV`` and bench/calibration_fit.py run this. Per
GPU, the fitted quantities are physical and few: for each GEMM kernel format the rows
use, its bandwidth and compute efficiencies and its kernel floor; the KV bandwidth,
attention efficiencies, all-reduce latency and bandwidth, and the CPU overheads. Each
is bounded (:data:`tuner.perf.fit.parameters.BOUNDS`) and pulled towards the hardware
preset's prior (whose source the preset cites) by a log-normal prior, so a parameter
the rows barely constrain stays physical instead of absorbing a row's noise.

Every GPU's parameters touch only that GPU's rows, so the fit splits by GPU exactly.
The residuals are ``log(predicted / published)`` over every reported figure, divided by
:data:`FIGURE_NOISE` (published figures of one setup scatter by about that much
between software builds and runs), under a soft-L1 loss (robust to a row whose setup
the file under-states). Leave-one-series-out (:func:`leave_one_series_out`)
refits without each series and predicts it: what to expect on results the fit has not
seen.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tuner.errors import ConfigError
from tuner.perf.fit.benchmark_rows import BenchmarkRow, RecordedRun
from tuner.perf.fit.coefficients import Coefficients
from tuner.perf.fit.least_squares import Param, fit_params
from tuner.perf.fit.parameters import bounds_of, used_formats
from tuner.perf.step_time import RooflineStepTimeModel

#: Relative scatter of a published figure around what its setup "should" give.
FIGURE_NOISE = 0.10
#: Prior widths (e-folds): kernel efficiencies are known to within ~x2, overheads less.
SIGMA = {"eta_mem": 0.7, "eta_compute": 0.7, "t0_s": 0.7, "kv_bw_eff": 0.5,
         "attn_prefill_eff": 0.7, "attn_decode_eff": 0.7, "allreduce_latency_s": 0.7,
         "allreduce_bw_eff": 0.5, "step_overhead_s": 1.0, "request_overhead_s": 1.0,
         "moe_layer_overhead_s": 1.0}
#: Prior width (e-folds) of a coefficient whose prior is fitted to measured kernel tables
#: (``HardwareSpec.measured_priors``): the serving rows may move it by about a quarter,
#: not by the factor of two an engineering estimate allows. Where one row cannot separate
#: two formats (Kimi-K2.5 on H200: bf16 MLA projections beside INT4 experts) this keeps
#: the measured one in place and lets the estimate take the difference.
MEASURED_SIGMA = 0.25
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
        # formats whose compute a row prices as another's (2024 ROCm FP8 as BF16)
        fmts.update(run.resolved.hardware.gemm_compute_as.values())
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
        if name.endswith(".eta_compute"):  # no faster than the cited max-achievable rate
            hi = min(hi, hardware.eta_compute_ceiling(name.split(".")[1]))
        prior = min(max(flat[name], lo * 1.001), hi / 1.001)
        out.append(Param(name, lo, hi, prior, prior_sigma(name, hardware)))
    return out


def prior_sigma(name: str, hardware: Any) -> float:
    """Prior width (e-folds) of flat coefficient ``name`` on ``hardware``: tighter where
    the preset lists it under ``step_time.measured`` (a prior fitted to measured kernels)."""
    # a listed name covers itself and its fields: "gemm.fp8" is gemm.fp8.*, not gemm.fp8b.*
    if any(name == p or name.startswith(p + ".") for p in getattr(hardware, "measured_priors", ())):
        return MEASURED_SIGMA
    return SIGMA[name.rsplit(".", 1)[-1]]


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
        r = np.concatenate(parts)
        # soft-L1: quadratic within the noise, linear beyond, so one figure whose setup the
        # row does not fully state (a KV dtype, a kernel fallback) cannot drag a GPU's
        # physics to a bound
        return np.sign(r) * np.sqrt(2.0 * (np.sqrt(1.0 + r * r) - 1.0))

    result = fit_params(residual, params, max_iter=80)
    coeffs = base.with_flat(result.values)
    info = {"parameters": len(params), "figures": int(sum(len(r.row.figures) for r in runs)),
            "iterations": result.iterations, "converged": result.converged,
            "at_bounds": list(result.at_bounds)}
    return coeffs, info


def fittable(run: RecordedRun) -> str | None:
    """None if ``run`` enters the fit, else why not (it is still predicted and reported).

    A model with linear-attention layers (Qwen3.5/3.6 Gated DeltaNet) has its GDN kernels
    priced from H200 measurements only (tuner/perf/linear_attention.py) and its hybrid
    state memory is not in the KV capacity; its MI355X rows are still ~1.8x faster than
    published, so fitting them would bend the GEMM efficiencies of every other model on
    that GPU to absorb what is missing.
    """
    if run.resolved.model.num_linear_layers:
        return "linear-attention layers are priced from H200 kernel shapes only"
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


# ------------------------------------------------------------------ the whole job
@dataclass(slots=True)
class BenchmarkFit:
    """Everything ``tuner calibrate --from-benchmarks`` computes for one CSV."""

    source: str
    runs: list[RecordedRun]
    skipped: list[Any]  # benchmarks.SkippedRow
    priors: dict[str, Coefficients]
    fitted: dict[str, Coefficients]
    infos: dict[str, Any]
    in_sample: list[Prediction]
    at_priors: list[Prediction]
    loso: list[Prediction] | None = None

    def document(self) -> dict[str, Any]:
        """The fitted-presets YAML (``presets/fitted/published.yaml`` layout)."""
        hardware: dict[str, Any] = {}
        for gpu in sorted(self.infos):
            rows = [r.row for r in self.runs if r.row.hardware == gpu]
            fitted_rows = [r.row for r in self.runs
                           if r.row.hardware == gpu and fittable(r) is None]
            hardware[gpu] = {
                "represents": sorted({r.versions for r in fitted_rows}),
                "rows": sorted(r.id for r in fitted_rows),
                "not_fitted": sorted(r.id for r in rows if r not in fitted_rows),
                "fit": self.infos[gpu],
                "coefficients": changed(self.fitted[gpu], self.priors[gpu]),
            }
        return {
            "source": self.source,
            "method": ("per-GPU bounded log-space Levenberg-Marquardt over the step-time "
                       "model's physical coefficients, log-normal priors from the hardware "
                       f"presets, figure noise {FIGURE_NOISE:g}; each row replayed by the "
                       "twin (tuner.perf.fit.benchmark_rows)"),
            "command": "tuner calibrate --from-benchmarks <csv> -o <this file>",
            "median_abs_error_pct": {
                "in_sample": round(100 * median_abs_error(self.in_sample), 2),
                "priors_only": round(100 * median_abs_error(self.at_priors), 2),
                **({"leave_one_series_out": round(100 * median_abs_error(self.loso), 2)}
                   if self.loso is not None else {})},
            "hardware": hardware,
        }


def fit_benchmarks(csv_path: str | Path, *, loso: bool = False) -> BenchmarkFit:
    """Replay every usable row, fit per GPU, predict in sample (and leave-one-series-out)."""
    from tuner.perf.fit.benchmark_rows import load_rows, record
    from tuner.perf.hardware import load_hardware

    rows, skipped = load_rows(csv_path)
    if not rows:
        raise ConfigError(f"{csv_path}: no row the twin can replay "
                          f"({len(skipped)} skipped: {skipped[0].reason if skipped else 'empty'})")
    runs = [record(r) for r in rows]
    priors = {g: load_hardware(g).coefficients for g in sorted({r.hardware for r in rows})}
    fitted, infos = fit_all(runs, priors)
    return BenchmarkFit(
        source=str(csv_path), runs=runs, skipped=skipped, priors=priors, fitted=fitted,
        infos=infos, in_sample=predict(runs, fitted), at_priors=predict(runs, priors),
        loso=leave_one_series_out(runs, priors) if loso else None)


def save_document(path: str | Path, document: dict[str, Any], *,
                  inputs: Sequence[str | Path] = ()) -> Path:
    """Write the fitted-presets YAML atomically, never over one of ``inputs``
    (:mod:`tuner.outputs` rules: refuses devices and folders, writes through a temp file)."""
    import yaml

    from tuner.outputs import write_text

    header = ("# Step-time coefficients fitted to published serving benchmarks.\n"
              "# Written by `tuner calibrate --from-benchmarks`; do not edit by hand:\n"
              "# re-run the command (bench/calibration_fit.py reports the errors).\n")
    return write_text(Path(path).expanduser(),
                      header + yaml.safe_dump(document, sort_keys=False, width=100),
                      inputs=inputs, mode=0o644)


def table(preds: Sequence[Prediction], loso: Sequence[Prediction] | None = None) -> list[str]:
    """Markdown rows: id, series, figure, published, predicted, error (and LOSO)."""
    by_key = {(p.row.id, p.figure): p for p in loso or []}
    head = "| row | series | figure | published | predicted | error |"
    sep = "|---|---|---|---:|---:|---:|"
    if loso is not None:
        head += " LOSO predicted | LOSO error |"
        sep += "---:|---:|"
    lines = [head, sep]
    for p in preds:
        line = (f"| {p.row.id} | {p.row.series} | {p.figure} | {p.published:.4g} | "
                f"{p.predicted:.4g} | {100 * p.rel_error:+.1f}% |")
        if loso is not None:
            q = by_key.get((p.row.id, p.figure))
            line += (f" {q.predicted:.4g} | {100 * q.rel_error:+.1f}% |" if q else " | |")
        lines.append(line)
    return lines
