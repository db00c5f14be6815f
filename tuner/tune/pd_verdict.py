"""The answer a P/D search gives (``--disaggregated on|auto``): whether disaggregation
wins on this trace, by how much on each objective, and the knee ratio.

Why after the pick and not in the rule: the pick rule already chooses among every
measured point, aggregated or not; an operator asking "should I split prefill from
decode" also needs the best of the other kind beside it, measured on the same window, and
where along the prefill:decode ratio more decode stops paying. The pick is the best of its
kind; the best of the other kind is the one the pick rule scores highest against the
baseline (stage 2 where the kind reached it, else stage 1); both are replayed on the held-out window (the training window
without one) unless already measured there. Under ``on`` the only aggregated layout is
the baseline. The knee is read from the stage-1 P/D points (every one on the same window).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from tuner.tune.deployment_space import DEPLOYMENT_KEY, evaluate_point, split_settings
from tuner.tune.pd_space import Disaggregated, gpu_ratio, layout_gpus, prefill_share

#: A knee is the first ratio whose best value is within this fraction of the best ratio's.
KNEE_TOLERANCE = 0.02


def is_pd(point: Any) -> bool:
    """Whether a ``Point`` ran a P/D layout (its settings carry ``deployment.pd``)."""
    raw = point.settings.get(DEPLOYMENT_KEY)
    return isinstance(raw, dict) and raw.get("pd") is not None


@dataclass(frozen=True, slots=True)
class Knee:
    """One objective's knee along the prefill:decode GPU ratio (stage-1 window)."""

    objective: str  # the Summary key
    ratio: str  # prefill GPUs : decode GPUs, lowest terms ("1:3")
    best_ratio: str  # the ratio with the best value
    #: best value per ratio, ordered from prefill-heavy to decode-heavy
    curve: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"objective": self.objective, "ratio": self.ratio, "best_ratio": self.best_ratio,
                "curve": [[r, v] for r, v in self.curve]}


def knee_ratios(points: Sequence[Any], objectives: Sequence[Any],
                tolerance: float = KNEE_TOLERANCE) -> list[Knee]:
    """Per objective, the knee ratio of the P/D ``points`` (Points measured on one window).

    Each ratio (prefill GPUs : decode GPUs) gets the best value any point of that ratio
    reached; walking from prefill-heavy to decode-heavy, the knee is the first ratio
    within ``tolerance`` of the best ratio's value: more decode beyond it buys less than
    that (and past the best ratio costs). Fewer than two ratios give no knee.
    """
    by_ratio: dict[str, tuple[Fraction, list[Any]]] = {}
    for p in points:
        _, dep = split_settings(p.settings)
        if dep is None or dep.pd is None:
            continue
        key = gpu_ratio(dep.pd)
        share = prefill_share(dep.pd)
        by_ratio.setdefault(key, (share, []))[1].append(p)
    if len(by_ratio) < 2:
        return []
    order = sorted(by_ratio, key=lambda k: -by_ratio[k][0])  # prefill-heavy first
    out: list[Knee] = []
    for o in objectives:
        sign = 1.0 if o.direction == "maximize" else -1.0
        curve = []
        for key in order:
            values = [v for v in (_num(p.metrics.get(o.key)) for p in by_ratio[key][1])
                      if math.isfinite(v)]
            if values:
                curve.append((key, max(values) if sign > 0 else min(values)))
        if len(curve) < 2:
            continue
        best_key, best = max(curve, key=lambda kv: sign * kv[1])
        knee = next(k for k, v in curve
                    if sign * v >= sign * best - tolerance * abs(best))
        out.append(Knee(o.key, knee, best_key, tuple(curve)))
    return out


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else math.nan


@dataclass(frozen=True, slots=True)
class PDVerdict:
    """Whether disaggregation wins on this trace (see the module docstring)."""

    mode: str  # --disaggregated on | auto
    wins: bool  # the study's pick is a P/D layout
    window: str  # "holdout" or "train": where both are compared
    best_pd: str  # the best P/D point's deployment, described
    best_pd_trial: int
    best_aggregated: str  # the best aggregated point's (the baseline under "on")
    best_aggregated_trial: int
    objectives: tuple[str, ...]
    pd_metrics: dict[str, Any] = field(default_factory=dict)
    aggregated_metrics: dict[str, Any] = field(default_factory=dict)
    knees: tuple[Knee, ...] = ()
    n_pd: int = 0  # P/D points measured (stage 1)
    n_aggregated: int = 0  # aggregated points measured (stage 1, the baseline included)
    #: why the best P/D point is not the pick where it is not (the rule's exclusion, a
    #: failed check on the held-out window, or the point the rule preferred); "" if it is
    not_picked: str = ""

    def delta_pct(self, key: str) -> float | None:
        a, b = _num(self.pd_metrics.get(key)), _num(self.aggregated_metrics.get(key))
        if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
            return None
        return round((a - b) / abs(b) * 100.0, 2)

    def keys(self) -> list[str]:
        return list(dict.fromkeys(list(self.objectives) + ["ttft_p90_s", "tpot_p90_s"]))

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "wins": self.wins, "window": self.window,
                "best_pd": {"trial": self.best_pd_trial, "deployment": self.best_pd,
                            "metrics": {k: self.pd_metrics.get(k) for k in self.keys()}},
                "best_aggregated": {"trial": self.best_aggregated_trial,
                                    "deployment": self.best_aggregated,
                                    "metrics": {k: self.aggregated_metrics.get(k)
                                                for k in self.keys()}},
                "delta_pct": {k: self.delta_pct(k) for k in self.keys()},
                "knees": [k.to_dict() for k in self.knees],
                "points": {"pd": self.n_pd, "aggregated": self.n_aggregated}}

    def lines(self) -> list[str]:
        """The recommendation's answer, e.g. ``disaggregation wins on this trace: ...``."""
        where = "held-out" if self.window == "holdout" else "training"
        against = ("the baseline (--disaggregated on: the only aggregated layout)"
                   if self.mode == "on" else "the best aggregated layout")
        parts = []
        for key in self.keys():
            a, b, d = self.pd_metrics.get(key), self.aggregated_metrics.get(key), \
                self.delta_pct(key)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                parts.append(f"{key} {b:.4g} -> {a:.4g}" + ("" if d is None else f" ({d:+.1f} %)"))
        head = ("disaggregation wins on this trace" if self.wins
                else "disaggregation does not win on this trace")
        out = [f"{head}: the best P/D layout, {self.best_pd} ({_trial(self.best_pd_trial)}), against "
               f"{against} {self.best_aggregated} ({_trial(self.best_aggregated_trial)}), "
               f"{where} window: " + "; ".join(parts)
               + (f" -- not picked: {self.not_picked}" if self.not_picked else "")]
        if self.knees:
            out.append("P:D knee (prefill:decode GPUs, stage-1 window; more decode beyond it "
                       f"buys < {KNEE_TOLERANCE:.0%}): " + "; ".join(
                           f"{k.objective} {k.ratio} (best {k.best_ratio})" for k in self.knees))
        else:
            out.append("P:D knee: fewer than two P/D ratios were measured; raise --trials")
        return out


def _trial(number: int) -> str:
    return "the baseline" if number < 0 else f"trial {number}"


def _best(points: Sequence[Any], baseline: Any, objectives: Sequence[Any], rule: Any) -> Any:
    """The point the pick rule scores highest (ties: the preferred objective)."""
    from tuner.tune.select import preferred_objective, score

    main = (objectives[0] if rule.prefer == "balanced"
            else preferred_objective(objectives, rule.prefer))
    sign = 1.0 if main.direction == "maximize" else -1.0

    def key(p: Any) -> tuple[float, float]:
        s = 0.0 if p is baseline else score(p, baseline, objectives, rule)
        v = sign * p.value(main)
        return (s if math.isfinite(s) else -1e300, v if math.isfinite(v) else -1e300)

    return max((p for p in points if p.feasible), key=key, default=None)


def pd_verdict(evaluator: Any, mode: Disaggregated, *, stage1: Sequence[Any],
               stage2: Sequence[Any], baseline: Any, selection: Any, objectives: Sequence[Any],
               rule: Any) -> PDVerdict | None:
    """The best P/D point against the best aggregated one, both replayed on the held-out
    window (training without one; a point already measured there is not replayed), and
    the knees over the stage-1 P/D points. None under ``off`` or without a P/D point."""
    if mode == "off":
        return None
    pd1 = [p for p in stage1 if is_pd(p)]
    if not pd1:
        return None
    agg1 = [p for p in stage1 if not is_pd(p)]
    pd2 = [p for p in stage2 if is_pd(p)]
    agg2 = [p for p in stage2 if not is_pd(p)]
    pick = selection.point  # the pick is the best of its kind by definition
    best_pd = pick if is_pd(pick) else _best(pd2 or pd1, baseline, objectives, rule) or pd1[0]
    best_agg = (baseline if mode == "on" else pick if not is_pd(pick) else
                _best(agg2 or [baseline], baseline, objectives, rule) or baseline)
    window = "holdout" if evaluator.windows.has_holdout else "train"

    def measured(p: Any) -> dict[str, Any]:
        mine = (p.holdout if window == "holdout"
                else p.metrics if any(p is q for q in stage2) else None)
        if mine:
            return mine
        settings, dep = split_settings(p.settings)
        return evaluate_point(evaluator, settings, dep, window)

    def describe(p: Any) -> str:
        _, dep = split_settings(p.settings)
        dep = dep or evaluator.default_deployment
        gpus = layout_gpus(dep.pd) if dep.pd is not None else dep.split.gpus
        return f"{dep.describe()}, {gpus} GPUs"

    return PDVerdict(mode=mode, wins=is_pd(pick), window=window,
                     best_pd=describe(best_pd), best_pd_trial=best_pd.number,
                     best_aggregated=describe(best_agg),
                     best_aggregated_trial=-1 if best_agg.is_baseline else best_agg.number,
                     objectives=tuple(o.key for o in objectives),
                     pd_metrics=measured(best_pd), aggregated_metrics=measured(best_agg),
                     knees=tuple(knee_ratios(pd1, objectives)),
                     n_pd=len(pd1), n_aggregated=len(agg1),
                     not_picked="" if is_pd(pick) else _why_not(best_pd, selection))


def _why_not(point: Any, selection: Any) -> str:
    """Why ``point`` is not ``selection``'s pick, in the selection's own words."""
    for other, why in selection.excluded:
        if other is point or other.number == point.number:
            return why
    label = f"trial {point.number}:"
    for skipped in selection.skipped:
        if skipped.startswith(label):
            return skipped[len(label):].strip()
    return f"the rule prefers {selection.point.label} ({selection.reason})"


__all__ = ["KNEE_TOLERANCE", "Knee", "PDVerdict", "is_pd", "knee_ratios", "pd_verdict"]
