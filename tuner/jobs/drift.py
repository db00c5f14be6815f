"""Traffic drift between the window a profile was tuned on and the new window.

A window is summarised by :func:`window_stats` (``trace_stats`` figures plus length
quantiles). :func:`compare` gives one figure per aspect, each a relative change:

* ``arrival_rate``: |new - old| / old of the mean arrival rate;
* ``input_len`` / ``output_len``: the largest relative change of the p10/p50/p90/p99
  quantiles (a quantile-based, KS-like distance that needs only the stored summary);
* ``prefix_reuse``: absolute change of the ideal prefix-hit rate (already a fraction).

``score`` is the largest of them; a score above the configured threshold forces a full
search (no warm start), since the old optimum may sit far from the new one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_QUANTILES = (10, 50, 90, 99)


def window_stats(trace: Any) -> dict[str, Any]:
    """The figures drift needs, JSON-ready (stored in state and profile provenance)."""
    from tuner.trace import trace_stats

    stats = trace_stats(trace).to_dict()
    df = trace.lazy().collect()
    out: dict[str, Any] = {k: stats[k] for k in (
        "requests", "duration_s", "arrival_rate_mean_per_s", "ideal_prefix_hit_rate",
        "input_len_mean", "output_len_mean")}
    for col in ("input_len", "output_len"):
        values = df.get_column(col).to_numpy().astype(np.float64)
        out[f"{col}_quantiles"] = {str(q): float(np.percentile(values, q)) if len(values)
                                   else float("nan") for q in _QUANTILES}
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in out.items()}


def _rel(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or not math.isfinite(old) or old == 0:
        return None
    return abs(new - old) / abs(old)


def compare(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """Drift figures of ``new`` against ``old`` (None when there is nothing to compare)."""
    if not old:
        return {"reference": None, "score": None}
    figures: dict[str, float | None] = {
        "arrival_rate": _rel(new.get("arrival_rate_mean_per_s"),
                             old.get("arrival_rate_mean_per_s")),
    }
    for col in ("input_len", "output_len"):
        qa, qb = old.get(f"{col}_quantiles") or {}, new.get(f"{col}_quantiles") or {}
        changes = [c for q in qa if (c := _rel(qb.get(q), qa.get(q))) is not None]
        figures[col] = max(changes) if changes else None
    a, b = old.get("ideal_prefix_hit_rate"), new.get("ideal_prefix_hit_rate")
    figures["prefix_reuse"] = abs(b - a) if a is not None and b is not None else None
    known = [v for v in figures.values() if v is not None]
    return {**{k: None if v is None else round(v, 4) for k, v in figures.items()},
            "score": round(max(known), 4) if known else None}
