"""Error bands: how far a prediction of the twin may be from what a real server measures.

The twin prints one number per metric; this module says how sure that number is. The
bands come from the leave-one-series-out (LOSO) residuals of the step-time model's fit to
the published benchmark rows (``data/benchmarks/published-train.csv``): each row is
predicted by a fit that never saw its series, so its ratio ``measured / predicted`` is what
to expect on a deployment the fit has not seen. ``bench/error_bands.py`` replays the rows,
derives the bands (:func:`derive_cells`) and writes ``data/error-bands.json``, which
:func:`load_bands` reads; docs/step-time-model.md ("Error bands") gives the method and the
measured coverage.

A band is a pair of multiplicative factors ``(low, high)`` on a prediction ``p``: the
measured value is likely in ``[p * low, p * high]``. Bands are kept per

* metric: ``ttft`` (time to first token), ``tpot`` (time per output token and inter-token
  latency; a batch run's end-to-end time, which its decode steps dominate, counts here;
  interactivity, its inverse, is turned round),
  ``throughput`` (tokens per second);
* GPU family: ``amd`` or ``nvidia`` (the hardware preset's vendor);
* regime: ``below`` or ``above`` the knee. The knee is the decode batch at which a step
  costs twice the one-request step at the workload's mean context (:func:`knee_batch`):
  below it decode is bound by reading the weights and adding a request is nearly free;
  above it every request slows the others. A run is ``above`` when its mean running batch
  per engine reaches the knee or requests wait (mean queue depth >= 1, which includes an
  offline run with every prompt queued).

A cell with fewer than ``min_rows`` samples borrows: (metric, family, regime) ->
(metric, family) -> (metric, regime) -> (metric); the cell records where its band came
from. A real-server calibration (``--calibration FILE``) narrows the bands with the file's
own residuals (:func:`narrowed`).

Plain Python (tests/test_layering.py): the sim and the vLLM driver may import it.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError

BANDS_PATH = Path(__file__).parents[1] / "data" / "error-bands.json"
METRICS = ("ttft", "tpot", "throughput")
FAMILIES = ("amd", "nvidia")
REGIMES = ("below", "above")
#: Published figure -> (metric, orientation): +1 when the figure scales like the metric,
#: -1 when it is its inverse (interactivity = 1 / TPOT).
FIGURE_METRIC: dict[str, tuple[str, int]] = {
    "ttft_mean": ("ttft", 1), "ttft_med": ("ttft", 1),
    "tpot_mean": ("tpot", 1), "tpot_med": ("tpot", 1), "intvty": ("tpot", -1),
    "e2el_mean_s": ("tpot", 1),
    "tok_s_gpu": ("throughput", 1), "out_tok_s": ("throughput", 1),
    "total_tok_s": ("throughput", 1),
}
#: Share of a cell's held-out |log(measured / predicted)| a band spans, and the fewest
#: samples a cell needs before it borrows from a wider pool (chosen on the held-out
#: coverage bench/error_bands.py prints: with fewer than 20 the family x regime cells are
#: too thin to cover the next series).
COVER = 0.95
MIN_ROWS = 20
#: A calibrated band is never narrower than this (log half-width): published figures of one
#: setup scatter by about 10 % between runs and builds (to_benchmarks.FIGURE_NOISE), and a
#: step-time probe fit says nothing about scheduling noise below that.
CALIBRATED_FLOOR = 0.10
#: Probe kinds of a calibration file (tuner calibrate) that speak for each metric.
PROBE_KINDS = {"ttft": ("prefill", "mixed"), "tpot": ("decode", "mixed"),
               "throughput": ("prefill", "decode", "mixed")}


@dataclass(frozen=True, slots=True)
class Sample:
    """One held-out row's error on one metric (a LOSO prediction)."""

    row: str  # benchmark row id
    series: str  # its series (the unit left out)
    metric: str  # "ttft", "tpot" or "throughput"
    family: str  # "amd" or "nvidia"
    regime: str  # "below" or "above" the knee
    ratio: float  # measured / predicted (geometric mean over the row's figures of the metric)

    def to_dict(self) -> dict[str, Any]:
        return {"row": self.row, "series": self.series, "metric": self.metric,
                "family": self.family, "regime": self.regime, "ratio": round(self.ratio, 6)}


@dataclass(frozen=True, slots=True)
class Band:
    """Multiplicative factors around a prediction, and where they come from."""

    metric: str
    low: float  # measured / predicted at the lower quantile (< 1 when the twin may be high)
    high: float  # ... at the upper quantile
    rows: int  # samples behind the band
    cell: str  # the cell the band was derived from ("ttft/nvidia/above", "ttft/*/*", ...)
    source: str = "published LOSO"  # or "calibration FILE"

    def around(self, value: float) -> tuple[float, float]:
        """The likely range of the measured value when the twin predicts ``value``."""
        return value * self.low, value * self.high

    def to_dict(self) -> dict[str, Any]:
        return {"low": round(self.low, 4), "high": round(self.high, 4), "rows": self.rows,
                "cell": self.cell, "source": self.source}


@dataclass(frozen=True, slots=True)
class PredictionBands:
    """The bands that apply to one replay's predictions."""

    family: str  # GPU family of the deployment
    regime: str  # "below" or "above" the knee
    knee_batch: int  # decode batch per engine at which a step costs twice the 1-request step
    running_per_engine: float  # the replay's mean running batch per engine
    bands: dict[str, Band]  # metric -> band
    calibrated: bool = False  # True when a calibration file narrowed the bands
    note: str = ""  # one line: what the bands are and whether a calibration narrowed them

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "regime": self.regime, "knee_batch": self.knee_batch,
                "running_per_engine": round(self.running_per_engine, 2),
                "calibrated": self.calibrated, "note": self.note,
                **{m: b.to_dict() for m, b in self.bands.items()}}

    def likely(self, metric: str, value: float) -> tuple[float, float]:
        return self.bands[metric].around(value)


# ------------------------------------------------------------------ regime and family
def family_of(vendor: str) -> str:
    """``amd`` or ``nvidia`` from a hardware preset's vendor."""
    v = vendor.lower()
    if v not in FAMILIES:
        raise ConfigError(f"GPU vendor {vendor!r} has no error band (expected amd or nvidia)")
    return v


def knee_batch(step_time: Any, context_tokens: float, *, limit: int = 4096) -> int:
    """Smallest decode batch whose step costs at least twice the one-request step.

    ``step_time`` is a :class:`~tuner.perf.step_time.StepTimeModel`; every request of the
    batch attends to ``context_tokens``. Returns ``limit`` if the step never doubles.
    """
    from tuner.sim.batch import StepBatch

    ctx = max(int(context_tokens), 1)

    def cost(b: int) -> float:
        return step_time.step_time_s(StepBatch(num_decode_reqs=b, decode_ctx_tokens=b * ctx))

    target = 2.0 * cost(1)
    if cost(limit) < target:
        return limit
    lo, hi = 1, limit  # cost(lo) < target <= cost(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if cost(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def regime_of(running_per_engine: float, queue_depth_mean: float, knee: int) -> str:
    """``above`` when the running batch reaches the knee or requests wait, else ``below``."""
    if running_per_engine >= knee or queue_depth_mean >= 1.0:
        return "above"
    return "below"


# ------------------------------------------------------------------ deriving the bands
def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default), in plain Python."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = q * (len(xs) - 1)
    i = int(math.floor(pos))
    j = min(i + 1, len(xs) - 1)
    return xs[i] + (xs[j] - xs[i]) * (pos - i)


def _pools(metric: str, family: str, regime: str) -> list[tuple[str, Any]]:
    """The fallback chain of a cell: its key and a predicate on samples, narrowest first."""
    return [
        (f"{metric}/{family}/{regime}",
         lambda s: s.metric == metric and s.family == family and s.regime == regime),
        (f"{metric}/{family}/*", lambda s: s.metric == metric and s.family == family),
        (f"{metric}/*/{regime}", lambda s: s.metric == metric and s.regime == regime),
        (f"{metric}/*/*", lambda s: s.metric == metric),
    ]


def derive_cells(samples: Sequence[Sample], *, cover: float = COVER,
                 min_rows: int = MIN_ROWS) -> dict[str, Band]:
    """A band for every (metric, family, regime), pooling where a cell is thin.

    The band is symmetric in log space: ``[exp(-a), exp(a)]`` with ``a`` the ``cover``
    quantile of the cell's ``|log(measured / predicted)|``. Symmetric because the LOSO
    errors of one series are shifted as a whole (a series the fit never saw is too fast
    or too slow throughout), so a band that follows one side's bias in the rows it was
    derived from misses the next series; widening by the larger side covers it. A metric
    without any sample gets no cells.
    """
    cells: dict[str, Band] = {}
    for metric in METRICS:
        for fam in FAMILIES:
            for reg in REGIMES:
                for key, pred in _pools(metric, fam, reg):
                    errs = [abs(math.log(s.ratio)) for s in samples if pred(s)]
                    if len(errs) >= min_rows or key.endswith("/*/*"):
                        break
                if not errs:
                    continue  # no sample of this metric at all: no cell
                a = quantile(errs, cover)
                cells[f"{metric}/{fam}/{reg}"] = Band(metric, math.exp(-a), math.exp(a),
                                                      len(errs), key)
    return cells


def coverage(samples: Iterable[Sample], cells: Mapping[str, Band]) -> tuple[int, int]:
    """(covered, judged): samples whose ratio lies inside their cell's band (a sample whose
    cell is missing is not judged)."""
    hit = total = 0
    for s in samples:
        band = cells.get(f"{s.metric}/{s.family}/{s.regime}")
        if band is None:
            continue
        total += 1
        hit += band.low <= s.ratio <= band.high
    return hit, total


def held_out_coverage(samples: Sequence[Sample], **kw: Any) -> tuple[int, int]:
    """Coverage with each series' samples judged by bands derived without that series.

    The in-sample coverage of a quantile band is its nominal share by construction; this
    is the honest figure: how often a band built from other series covers a new one. A
    series that owns every sample of a metric is not judged on that metric.
    """
    hit = total = 0
    for series in sorted({s.series for s in samples}):
        rest = [s for s in samples if s.series != series]
        h, t = coverage([s for s in samples if s.series == series], derive_cells(rest, **kw))
        hit, total = hit + h, total + t
    return hit, total


# ------------------------------------------------------------------ the shipped file
@functools.lru_cache(maxsize=4)
def load_bands(path: str = str(BANDS_PATH)) -> dict[str, Band]:
    """The shipped cells (``data/error-bands.json``, written by bench/error_bands.py)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
        cells = doc["cells"]
        return {key: Band(c["metric"], float(c["low"]), float(c["high"]), int(c["rows"]),
                          str(c["cell"])) for key, c in cells.items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{p}: cannot read the error bands ({exc}); regenerate it with "
                          "bench/error_bands.py") from None


def band_document(samples: Sequence[Sample], cells: Mapping[str, Band],
                  extra: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON the bench script writes (deterministic: sorted keys, rounded floats)."""
    return {**extra, "cover": COVER, "min_rows": MIN_ROWS,
            "cells": {k: {"metric": b.metric, **b.to_dict(), "low": round(b.low, 6),
                          "high": round(b.high, 6)} for k, b in sorted(cells.items())},
            "samples": [s.to_dict() for s in samples]}


# ------------------------------------------------------------------ calibration
def _probe_ratios(fit: Mapping[str, Any], kinds: tuple[str, ...]) -> list[float]:
    out = []
    for p in fit.get("probes") or []:
        try:
            if p.get("kind") in kinds and float(p["predicted_ms"]) > 0:
                out.append(float(p["measured_ms"]) / float(p["predicted_ms"]))
        except (TypeError, ValueError, KeyError, AttributeError):
            continue
    return out


def narrowed(band: Band, fit: Mapping[str, Any], source: str) -> Band | None:
    """``band`` narrowed by a calibration's own residuals, or None when the file has none.

    A calibration fitted on the user's server removes what differs between deployments
    (kernels, builds, the GPU's clocks); what remains is the fit's residual on the
    server's own probes: the band's log half-width becomes the :data:`COVER` quantile of
    the probes' ``|log(measured / predicted)|`` for the metric's probe kinds (prefill for
    TTFT, decode for TPOT; the file's ``rms_rel_error_pct`` x 2 without probe records),
    at least :data:`CALIBRATED_FLOOR` and never wider than the published band.
    """
    ratios = _probe_ratios(fit, PROBE_KINDS[band.metric])
    if len(ratios) >= 2:
        a, n = quantile([abs(math.log(r)) for r in ratios if r > 0], COVER), len(ratios)
    elif isinstance(fit.get("rms_rel_error_pct"), (int, float)):
        a = math.log1p(2.0 * float(fit["rms_rel_error_pct"]) / 100.0)
        n = int(fit.get("num_probes") or 0)
    else:
        return None
    a = min(max(a, CALIBRATED_FLOOR), math.log(band.high))
    return Band(band.metric, math.exp(-a), math.exp(a), n, band.cell, f"calibration {source}")


def bands_for(vendor: str, regime: str, *, knee: int, running_per_engine: float,
              calibration: Any = None, cells: Mapping[str, Band] | None = None,
              calibration_path: str | None = None) -> PredictionBands:
    """The bands for a deployment of ``vendor`` GPUs in ``regime`` (narrowed by a
    :class:`~tuner.perf.fit.calibration_file.Calibration` when given)."""
    fam = family_of(vendor)
    table = cells if cells is not None else load_bands()
    bands = {m: table[f"{m}/{fam}/{regime}"] for m in METRICS}
    note = (f"likely = the range holding {100 * COVER:.0f} % of the published rows "
            "held out of the fit (leave-one-series-out)")
    calibrated = False
    if calibration is not None:
        where = calibration_path or "file"
        narrower = {m: narrowed(b, calibration.fit or {}, where) for m, b in bands.items()}
        if all(b is not None for b in narrower.values()):
            bands = {m: b for m, b in narrower.items() if b is not None}
            calibrated = True
            note = (f"likely = narrowed by the calibration {where} (its own probe "
                    f"residuals, at least +-{100 * CALIBRATED_FLOOR:.0f} %)")
        else:
            note += f"; the calibration {where} records no residuals, so the bands are not narrowed"
    return PredictionBands(fam, regime, knee, running_per_engine, bands, calibrated, note)
