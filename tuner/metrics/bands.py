"""Error bands on a replay's summary: which band applies, and the "likely" ranges it gives.

The bands themselves (how they are derived, per metric, GPU family and regime) live in
:mod:`tuner.perf.fit.bands`; this module places one replay in a cell (its GPU family from
the hardware preset, its regime from its mean running batch against the knee) and turns
the summary's figures into ranges: ``TTFT p90 1.9 s, likely 1.4-2.8 s``. Reporting only:
nothing here changes a replay or a decision.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from tuner.metrics.band_fields import likely
from tuner.metrics.summary import Summary
from tuner.perf.fit.bands import PredictionBands, bands_for, knee_batch, regime_of
from tuner.records import ReplayResult
from tuner.units import duration

#: The lines the printed summary shows (field, label, unit formatter).
HEADLINE = (("ttft_p90_s", "TTFT p90"), ("tpot_p90_s", "TPOT p90"), ("itl_p90_s", "ITL p90"),
            ("e2e_p90_s", "E2E p90"), ("p90_interactivity", "p90 interactivity"),
            ("output_throughput_per_gpu", "output throughput"))


def replay_bands(summary: Summary, result: ReplayResult, resolved: Any) -> PredictionBands:
    """The bands that apply to ``summary`` of a replay on ``resolved`` (a ResolvedTarget).

    The knee is priced by the replay's own step-time model at the counted requests' mean
    context (prompt + half the output); the running batch and queue depth are the
    summary's step means, per engine.
    """
    engines = max(int(getattr(resolved.target, "num_engines", 1) or 1), 1)
    done = [r for r in result.requests if r.status == "finished"] or list(result.requests)
    context = (sum(r.input_len + r.output_len / 2 for r in done) / len(done)) if done else 1.0
    knee = knee_batch(resolved.step_time, context)
    running = _finite(summary.num_running_mean) / engines
    queue = _finite(summary.queue_depth_mean) / engines
    calibration = None
    path = getattr(resolved.target, "calibration", None)
    if path:
        from tuner.perf.fit.calibration_file import load_calibration

        calibration = load_calibration(path)
    return bands_for(resolved.hardware.vendor, regime_of(running, queue, knee), knee=knee,
                     running_per_engine=running, calibration=calibration,
                     calibration_path=path)


def with_bands(summary: Summary, result: ReplayResult, resolved: Any) -> Summary:
    """``summary`` carrying its bands (``Summary.bands``; JSON ``bands``)."""
    return dataclasses.replace(summary, bands=replay_bands(summary, result, resolved))


def _finite(x: float) -> float:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else 0.0


def _fmt(name: str, value: float) -> str:
    if name.endswith("_s"):
        return duration(value)
    return f"{value:,.1f}"


def band_text(bands: PredictionBands, name: str, label: str, value: float) -> str | None:
    """``TTFT p90 1.9 s, likely 1.4 s-2.8 s`` (None when the value is missing)."""
    r = likely(bands, name, value)
    if r is None:
        return None
    unit = " tok/s/GPU" if name.endswith("_per_gpu") else (
        " tok/s/user" if "interactivity" in name else "")
    return f"{label} {_fmt(name, value)}{unit}, likely {_fmt(name, r[0])}-{_fmt(name, r[1])}{unit}"


def band_lines(summary: Summary) -> list[str]:
    """The printed band lines of a summary (empty when it carries no bands)."""
    b = summary.bands
    if b is None:
        return []
    lines = [t for name, label in HEADLINE
             if (t := band_text(b, name, label, getattr(summary, name))) is not None]
    head = (f"Prediction bands ({b.family}, {b.regime} the knee: running "
            f"{b.running_per_engine:.1f} per engine vs knee batch {b.knee_batch}; "
            f"{'calibrated' if b.calibrated else 'uncalibrated'}): {b.note}")
    return [head, *("  " + line for line in lines)]


# ------------------------------------------------------------------ tune points
#: Scalar keys a tune trial's metrics carry so the front table and the profile can rebuild
#: the trial's bands without replaying (Optuna user attrs hold scalars only).
BAND_KEYS = ("band_vendor", "band_regime", "band_knee_batch", "band_running_per_engine")


def band_keys(bands: PredictionBands, vendor: str) -> dict[str, Any]:
    """The scalars :func:`bands_from_keys` needs (added to a trial's metrics)."""
    return {"band_vendor": vendor, "band_regime": bands.regime,
            "band_knee_batch": bands.knee_batch,
            "band_running_per_engine": round(bands.running_per_engine, 3)}


def bands_from_keys(metrics: dict[str, Any],
                    calibration: str | None = None) -> PredictionBands | None:
    """A trial's bands from its stored metrics (None for a trial stored without them)."""
    if any(metrics.get(k) is None for k in BAND_KEYS):
        return None
    cal = None
    if calibration:
        from tuner.perf.fit.calibration_file import load_calibration

        cal = load_calibration(calibration)
    return bands_for(str(metrics["band_vendor"]), str(metrics["band_regime"]),
                     knee=int(metrics["band_knee_batch"]),
                     running_per_engine=float(metrics["band_running_per_engine"]),
                     calibration=cal, calibration_path=calibration)


@functools.lru_cache(maxsize=16)
def _resolved(target: Any) -> Any:
    """The deployment behind a trial's bands, resolved once per process and target (a
    trial's step-time model does not depend on its scheduler settings)."""
    from tuner.perf.presets import resolve_target

    return resolve_target(target)


def trial_band_keys(summary: Summary, result: ReplayResult, target: Any) -> dict[str, Any]:
    """:func:`band_keys` of one trial's replay on ``target`` (a Target; what the tune
    evaluator stores beside the trial's metrics)."""
    resolved = _resolved(target)
    return band_keys(replay_bands(summary, result, resolved), resolved.hardware.vendor)


def metrics_likely(metrics: dict[str, Any], keys: list[str],
                   calibration: str | None = None) -> dict[str, list[float]]:
    """``{key: [low, high]}`` for the banded ``keys`` of a trial's metrics."""
    bands = bands_from_keys(metrics, calibration)
    if bands is None:
        return {}
    out = {}
    for k in keys:
        r = likely(bands, k, metrics.get(k))
        if r is not None:
            out[k] = [float(f"{r[0]:.6g}"), float(f"{r[1]:.6g}")]
    return out
