"""Per-engine balance: how a data-parallel deployment or a fleet split the traffic.

Why a section of its own: the deployment's percentiles average over engines, so a
router that sends one replica twice its share, or a DP load balancer that leaves one
rank's cache cold, looks like a uniformly slower deployment. The table shows, per
engine (replica x DP rank), the requests it served and its share, its prefix-cache hit
rate, its KV usage (mean and peak, vLLM's definition) and its preemptions and steps
(``tuner.records.EngineSummary``); a bar chart puts the shares side by side.

Sources, best first: the report's own replays (windowed like the rest of the page),
else the per-engine summaries a tuned profile stores (``predicted.<window>.engines``),
else those a study point stores in its metrics.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from tuner.report.charts import PALETTE, Chart, bar_chart
from tuner.report.html import Figures, Note, Section, Table, fmt
from tuner.report.study_data import ReportData

_COLUMNS = ("engine", "replica", "DP rank", "requests", "share", "finished",
            "prefix-cache hit rate", "KV usage mean", "KV usage peak", "preemptions", "steps")


def engine_rows(engines: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Table rows for ``EngineSummary.to_dict`` forms (share = of the routed requests)."""
    total = sum(float(e.get("num_requests") or 0) for e in engines)
    rows = []
    for e in engines:
        n = float(e.get("num_requests") or 0)
        rows.append([str(e.get("engine")), str(e.get("replica", "-")),
                     str(e.get("dp_rank", "-")), fmt(e.get("num_requests")),
                     f"{n / total * 100:.1f}%" if total else "\u2013",
                     fmt(e.get("num_finished")), fmt(e.get("prefix_cache_hit_rate")),
                     fmt(e.get("kv_usage_mean")), fmt(e.get("kv_usage_max")),
                     fmt(e.get("preemptions")),
                     fmt(e.get("num_steps")) + (f" ({fmt(e['num_dummy_steps'])} dummy)"
                                                if e.get("num_dummy_steps") else "")])
    return rows


def imbalance(engines: Sequence[dict[str, Any]]) -> str:
    """One line: the busiest engine's requests against the mean, and the hit-rate spread."""
    counts = [float(e.get("num_requests") or 0) for e in engines]
    mean = sum(counts) / len(counts) if counts else 0.0
    rates = [float(e["prefix_cache_hit_rate"]) for e in engines
             if isinstance(e.get("prefix_cache_hit_rate"), (int, float))
             and math.isfinite(float(e["prefix_cache_hit_rate"]))]
    text = (f"busiest engine: {max(counts):,.0f} requests, {max(counts) / mean:.2f}x the mean "
            f"of {mean:,.1f}" if mean else "no requests routed")
    if rates:
        text += f"; prefix-cache hit rate {min(rates):.3f} to {max(rates):.3f} across engines"
    return text


def _sources(data: ReportData, replays: Sequence[Any]
             ) -> tuple[str, list[tuple[str, str, list[dict[str, Any]]]]]:
    """(where the numbers come from, [(label, window, engines)]) with > 1 engine each."""
    found = [(r.label, r.window, list(r.summary.get("engines") or [])) for r in replays]
    found = _distinct([f for f in found if len(f[2]) > 1])
    if found:
        return "replayed now on the study's windows", found
    prof = data.profile
    if prof is not None:
        for window in ("train", "holdout"):
            stored = (prof.predicted.get(window) or {}).get("engines") or {}
            for role in ("baseline", "tuned"):
                if len(stored.get(role) or []) > 1:
                    found.append((role, window, list(stored[role])))
        if found:
            return "stored in the profile (predicted.<window>.engines)", _distinct(found)
    for role, point in (("baseline", data.baseline), ("tuned", data.chosen)):
        if point is None:
            continue
        for window, metrics in (("train", point.metrics), ("holdout", point.holdout or {})):
            if len(metrics.get("engines") or []) > 1:
                found.append((role, window, list(metrics["engines"])))
    return "stored by the study (stage-2 metrics)", _distinct(found)


def _distinct(found: list[tuple[str, str, list[dict[str, Any]]]]
              ) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """Drop a tuned table identical to the baseline's on its window (the pick is the
    baseline): one table says it, with the label ``baseline = tuned``."""
    out: list[tuple[str, str, list[dict[str, Any]]]] = []
    for label, window, engines in found:
        same = next((i for i, (lbl, w, e) in enumerate(out) if w == window and e == engines),
                    None)
        if same is None:
            out.append((label, window, engines))
        else:
            out[same] = (f"{out[same][0]} = {label}", window, engines)
    return out


def engine_section(data: ReportData, replays: Sequence[Any]) -> Section | None:
    """The per-engine balance section, or None when every replay ran on one engine."""
    source, found = _sources(data, replays)
    if not found:
        return None
    sec = Section("Per-engine balance")
    sec.blocks.append(Note(f"Engines are replica x DP rank (engine = replica x dp + rank); "
                           f"numbers {source}."))
    charts: list[Chart] = []
    for label, window, engines in found:
        sec.blocks.append(Table(list(_COLUMNS), engine_rows(engines),
                                caption=f"{label}, {window} window: {imbalance(engines)}"))
    for window in ("train", "holdout"):
        groups = [(label, [float(e.get("num_requests") or 0) for e in engines])
                  for label, w, engines in found if w == window]
        if not groups:
            continue
        n = max(len(g[1]) for g in groups)
        groups = [(lbl, vals + [0.0] * (n - len(vals))) for lbl, vals in groups]
        charts.append(bar_chart(
            [f"engine {i}" for i in range(n)], groups, colors=PALETTE,
            title=f"Requests per engine ({window} window)",
            caption="Requests each engine served. Even bars: the router (or vLLM's DP load "
                    "balancer) spread the traffic; one tall bar is an engine that queues "
                    "while the others idle.",
            y_label="requests", x_label="engine"))
    if charts:
        sec.blocks.append(Figures(charts))
    return sec


__all__ = ["engine_rows", "engine_section", "imbalance"]
