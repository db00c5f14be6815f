"""Which summary field takes which error band, and the likely range it gives.

Kept apart from :mod:`tuner.metrics.bands` so that ``Summary.to_dict`` can write the
ranges without importing the module that builds summaries' bands (no import circle).
"""

from __future__ import annotations

import math
from typing import Any

from tuner.perf.fit.bands import Band, PredictionBands

#: Summary field -> (band metric, orientation): -1 when the field is the metric's inverse
#: (interactivity = 1 / TPOT), so a band (low, high) becomes (1/high, 1/low).
FIELD_METRIC: dict[str, tuple[str, int]] = {
    **{f"ttft_{p}_s": ("ttft", 1) for p in ("mean", "p50", "p90", "p99")},
    **{f"tpot_{p}_s": ("tpot", 1) for p in ("mean", "p50", "p90", "p99")},
    **{f"itl_{p}_s": ("tpot", 1) for p in ("mean", "p50", "p90", "p99")},
    **{f"e2e_{p}_s": ("e2e", 1) for p in ("p50", "p90", "p99")},
    **{f"p{p}_interactivity": ("tpot", -1) for p in (50, 90, 99)},
    **{name: ("throughput", 1) for name in (
        "request_throughput", "output_throughput", "total_throughput",
        "output_throughput_per_gpu", "total_throughput_per_gpu")},
}


def field_band(bands: PredictionBands, name: str) -> tuple[float, float] | None:
    """The multiplicative (low, high) for one summary field, or None if it has no band.

    End-to-end latency is TTFT plus the decode time: it gets the union of both bands.
    """
    if name not in FIELD_METRIC:
        return None
    metric, sign = FIELD_METRIC[name]
    if metric == "e2e":
        t, d = bands.bands["ttft"], bands.bands["tpot"]
        return min(t.low, d.low), max(t.high, d.high)
    b: Band = bands.bands[metric]
    return (b.low, b.high) if sign > 0 else (1.0 / b.high, 1.0 / b.low)


def likely(bands: PredictionBands, name: str, value: float) -> tuple[float, float] | None:
    """The likely range of summary field ``name`` whose predicted value is ``value``."""
    f = field_band(bands, name)
    if f is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value * f[0], value * f[1]


def likely_dict(bands: PredictionBands, values: Any) -> dict[str, list[float]]:
    """Every banded field of ``values`` (a Summary) -> ``[low, high]`` (the JSON
    ``bands.likely``)."""
    out = {}
    for name in FIELD_METRIC:
        r = likely(bands, name, getattr(values, name, None))
        if r is not None:
            out[name] = [float(f"{r[0]:.6g}"), float(f"{r[1]:.6g}")]
    return out
