"""Pareto front and the rule that picks the recommended point from it.

Rules (``prefer``), all relative to the baseline (vLLM's defaults on the same window):

* ``throughput`` (default): among front points whose every *other* objective is at least
  the baseline's (with the default objectives: p90 interactivity not below the
  baseline's), the highest throughput objective (the first objective whose name contains
  ``throughput``, else the last objective).
* ``interactivity``: the same with the roles swapped (the first objective whose name
  contains ``interactivity``, else the first objective), every other objective at least
  the baseline's.
* ``balanced``: among front points at least as good as the baseline on *every* objective,
  the largest product of relative gains ``prod_i gain_i`` where ``gain_i = value / baseline``
  for a maximised objective and ``baseline / value`` for a minimised one (so +10% on one and
  -5% on another scores 1.10 * 0.95 = 1.045).

Ties go to the lower trial number (deterministic). When no front point qualifies the
baseline itself is recommended and the reason says so: the tool never recommends a point
that is worse than vLLM's defaults on a guarded objective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from tuner.errors import ConfigError
from tuner.tune.objectives import Objective

Prefer = Literal["throughput", "interactivity", "balanced"]
PREFER_CHOICES: tuple[str, ...] = ("throughput", "interactivity", "balanced")


@dataclass(slots=True)
class Point:
    """One evaluated configuration (a trial or the baseline)."""

    number: int  # trial number in its study (-1: the baseline evaluated outside any study)
    params: dict[str, Any]  # the searched fields only
    settings: dict[str, Any]  # the full SchedulerSettings.to_dict()
    metrics: dict[str, Any]  # Summary.to_dict() on the window the point was ranked on
    feasible: bool = True  # every constraint satisfied
    is_baseline: bool = False
    holdout: dict[str, Any] | None = None  # Summary.to_dict() on the held-out window
    extra: dict[str, Any] = field(default_factory=dict)

    def value(self, objective: Objective) -> float:
        v = self.metrics.get(objective.key)
        return float(v) if isinstance(v, (int, float)) and v is not None else float("nan")


@dataclass(frozen=True, slots=True)
class Selection:
    point: Point
    rule: str  # the rule in words
    reason: str  # why this point (or why the baseline)


def dominates(a: Point, b: Point, objectives: Sequence[Objective]) -> bool:
    """``a`` is no worse than ``b`` on every objective and better on one."""
    better = False
    for obj in objectives:
        va, vb = a.value(obj), b.value(obj)
        if obj.direction == "minimize":
            va, vb = -va, -vb
        if va < vb:
            return False
        if va > vb:
            better = True
    return better


def pareto_front(points: Sequence[Point], objectives: Sequence[Objective]) -> list[Point]:
    """Feasible points with finite objective values that no other such point dominates.

    Points with identical objective values collapse into one: the baseline if it is among
    them, else the lowest trial number (the search cannot tell them apart, and a tie must
    not move an operator off vLLM's defaults). Sorted by the first objective (best first),
    then trial number.
    """
    valid = [p for p in points if p.feasible
             and all(math.isfinite(p.value(o)) for o in objectives)]
    front = [p for p in valid if not any(dominates(q, p, objectives) for q in valid if q is not p)]
    unique: dict[tuple[float, ...], Point] = {}
    for p in sorted(front, key=lambda p: (not p.is_baseline, p.number)):
        unique.setdefault(tuple(p.value(o) for o in objectives), p)
    first = objectives[0]
    sign = -1.0 if first.direction == "maximize" else 1.0
    return sorted(unique.values(), key=lambda p: (sign * p.value(first), p.number))


def _find(objectives: Sequence[Objective], word: str, fallback: int) -> Objective:
    for obj in objectives:
        if word in obj.key:
            return obj
    return objectives[fallback]


def select(points: Sequence[Point], baseline: Point, objectives: Sequence[Objective],
           prefer: Prefer = "throughput") -> Selection:
    """Pick the recommended point from ``points`` (any set; the front is taken here)."""
    if prefer not in PREFER_CHOICES:
        raise ConfigError(f"prefer={prefer!r}: use one of {', '.join(PREFER_CHOICES)}")
    front = pareto_front(points, objectives)
    if prefer == "balanced":
        rule = ("balanced: largest product of relative gains over the baseline among Pareto "
                "points at least as good as the baseline on every objective")
        ok = [p for p in front
              if all(o.at_least_as_good(p.value(o), baseline.value(o)) for o in objectives)]

        def score(p: Point) -> float:
            return math.prod(o.gain(p.value(o), baseline.value(o)) for o in objectives)
    else:
        target = (_find(objectives, "throughput", -1) if prefer == "throughput"
                  else _find(objectives, "interactivity", 0))
        guarded = [o for o in objectives if o is not target]
        rule = (f"{prefer}: highest {target.key} among Pareto points whose "
                + (", ".join(o.key for o in guarded) or "objectives")
                + " is not worse than the baseline's")
        ok = [p for p in front
              if all(o.at_least_as_good(p.value(o), baseline.value(o)) for o in guarded)]
        sign = 1.0 if target.direction == "maximize" else -1.0

        def score(p: Point) -> float:
            return sign * p.value(target)

    if not ok:
        return Selection(baseline, rule, "no Pareto point satisfies the rule; recommending "
                                         "vLLM's defaults (the baseline)")
    best = max(ok, key=lambda p: (score(p), -p.number))
    improves = any(not o.at_least_as_good(baseline.value(o), best.value(o)) for o in objectives)
    if best.is_baseline or not improves:
        return Selection(baseline, rule, "nothing on the front beats the baseline under this "
                                         "rule; recommending vLLM's defaults (the baseline)")
    return Selection(best, rule, f"trial {best.number} is the best point under the rule")
