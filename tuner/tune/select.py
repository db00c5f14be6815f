"""Pareto front and the rule that picks the recommended point from it.

Why a rule this shaped: an operator deploying a profile wants the throughput they pay
for and, inside a small throughput margin, the best user experience; they never want a
point the evidence says is worse on everything, one that breaks their constraint on the
window the search did not see, or one that "wins" interactivity by leaving requests in
the queue. The rule, relative to the baseline on the same window (docs/tuning.md has the
worked examples):

1. **Eligible** points satisfy every constraint on the training window and, unless the
   user named a TTFT metric as an objective or a constraint, the *TTFT guard*: mean and
   p90 TTFT no more than ``ttft_tolerance`` (25 %) above the baseline's (plus 0.1 s, so a
   near-empty queue's noise does not count). No point may be below the baseline on a
   guarded objective (every objective but the preferred one; with ``balanced`` all).
2. **Within the tolerance**: the preferred objective (``prefer=throughput``: output
   throughput per GPU) is within ``tolerance`` (10 %) of the best eligible value.
3. **The knee**: among those, the largest ``weight * log(gain_preferred) + sum of
   log(gain_other)``, gains relative to the baseline. It is the point where giving up a
   further 1 % of the preferred objective would buy less than ``weight`` (4) % of the
   others: trial 17 at -0.6 % throughput and +331 % interactivity beats trial 6, and
   +1,400 % interactivity at -9 % throughput beats vLLM's defaults. ``balanced`` uses
   weight 1 and no tolerance (the largest product of gains).
4. **Held-out**: walking the candidates in that order, the first one that satisfies
   every constraint and the TTFT guard on the held-out window, and that no other
   candidate beats on the held-out window on every objective, is the pick. The ones
   skipped are named with the failing check. When none survives, the baseline is
   recommended and the reason says why.

Ties go to the baseline, then to the lower trial number (deterministic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from tuner.errors import ConfigError
from tuner.tune.objectives import Constraint, Objective
from tuner.units import METRIC, cell

Prefer = Literal["throughput", "interactivity", "balanced"]
PREFER_CHOICES: tuple[str, ...] = ("throughput", "interactivity", "balanced")

#: TTFT keys reported beside the objectives (the typical and the slow user).
TTFT_KEYS = ("ttft_p50_s", "ttft_p90_s")
#: TTFT keys the guard compares: the mean (the total wait, Little's law: the mean queue)
#: and p90 (the tail). Not p50 alone: on the bundled hour a point moves p50 from 0.47 s
#: to 1.16 s while the mean stays (3.8 -> 4.0 s) and p90 falls from 22 s to 12 s, which
#: is no regression an operator would refuse; starving admission raises the mean tenfold.
GUARD_KEYS = ("ttft_mean_s", "ttft_p90_s")


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
        return _num(self.metrics.get(objective.key))

    @property
    def label(self) -> str:
        return "the baseline" if self.is_baseline else f"trial {self.number}"


@dataclass(frozen=True, slots=True)
class PickRule:
    """The parameters of the selection rule (module docstring)."""

    prefer: Prefer = "throughput"
    tolerance: float = 0.10  # fraction of the best preferred value the pick may give up
    weight: float = 4.0  # % of the others one % of the preferred objective is worth
    ttft_tolerance: float | None = 0.25  # None: no TTFT guard
    ttft_slack_s: float = 0.1

    def __post_init__(self) -> None:
        if self.prefer not in PREFER_CHOICES:
            raise ConfigError(f"prefer={self.prefer!r}: use one of {', '.join(PREFER_CHOICES)}")
        if not 0.0 <= self.tolerance < 1.0:
            raise ConfigError(f"throughput tolerance {self.tolerance}: must be in [0, 1)")
        if self.ttft_tolerance is not None and self.ttft_tolerance < 0:
            raise ConfigError(f"TTFT tolerance {self.ttft_tolerance}: must be >= 0")

    def describe(self, objectives: Sequence[Objective], guard: bool) -> str:
        if self.prefer == "balanced":
            text = ("balanced: largest product of gains over the baseline among points at "
                    "least as good as the baseline on every objective")
        else:
            main = preferred_objective(objectives, self.prefer)
            others = ", ".join(o.key for o in objectives if o is not main) or "nothing else"
            text = (f"{self.prefer}: within {self.tolerance:.0%} of the best {main.key}, the "
                    f"knee (1 % of {main.key} is worth {self.weight:g} % of {others}); "
                    f"{others} not below the baseline's")
        if guard:
            text += (f"; mean and p90 TTFT at most {self.ttft_tolerance:.0%} "
                     f"(+{self.ttft_slack_s:g} s) above the baseline's")
        return text + "; every constraint checked on the held-out window"


@dataclass(frozen=True, slots=True)
class Selection:
    point: Point
    rule: str  # the rule in words
    reason: str  # why this point (or why the baseline)
    runner_ups: tuple[Point, ...] = ()  # the next candidates, best first
    skipped: tuple[str, ...] = ()  # "trial 171: ttft_p90_s<=2 fails on held-out (133.9 s)"
    #: Front points the rule did not consider, best first, with why: what an operator
    #: would otherwise wonder about ("+794 % interactivity, why not that?").
    excluded: tuple[tuple[Point, str], ...] = ()


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else float("nan")


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


def beats_everywhere(a: dict[str, Any], b: dict[str, Any],
                     objectives: Sequence[Objective]) -> bool:
    """``a`` is strictly better than ``b`` on every objective (metrics dicts)."""
    for obj in objectives:
        va, vb = _num(a.get(obj.key)), _num(b.get(obj.key))
        if not (math.isfinite(va) and math.isfinite(vb)):
            return False
        if not (va > vb if obj.direction == "maximize" else va < vb):
            return False
    return True


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


def preferred_objective(objectives: Sequence[Objective], prefer: str) -> Objective:
    """The objective ``prefer`` names: the first ``*throughput*`` (else the last) or the
    first ``*interactivity*`` (else the first) objective."""
    if prefer == "interactivity":
        return _find(objectives, "interactivity", 0)
    return _find(objectives, "throughput", -1)


def ttft_guard_applies(rule: PickRule, objectives: Sequence[Objective],
                       constraints: Sequence[Constraint]) -> bool:
    """The guard is on unless disabled or the user stated a TTFT preference themselves."""
    named = [o.key for o in objectives] + [c.key for c in constraints]
    return rule.ttft_tolerance is not None and not any(k.startswith("ttft") for k in named)


def check(metrics: dict[str, Any] | None, base: dict[str, Any] | None,
          constraints: Sequence[Constraint], rule: PickRule, guard: bool) -> list[str]:
    """What ``metrics`` fails: each violated constraint and TTFT-guard key, with the value."""
    if metrics is None:
        return ["not replayed"]
    failed = [f"{c} ({_show(c.key, metrics.get(c.key))})" for c in constraints
              if c.violation(metrics) > 0]
    if guard and base is not None:
        tol = rule.ttft_tolerance or 0.0
        for key in GUARD_KEYS:
            value, ref = _num(metrics.get(key)), _num(base.get(key))
            if math.isfinite(ref) and not (value <= ref * (1 + tol) + rule.ttft_slack_s):
                failed.append(f"TTFT guard {key} {_show(key, value)} vs the baseline's "
                              f"{_show(key, ref)}")
    return failed


def _show(key: str, value: Any) -> str:
    v = _num(value)
    return fmt_metric(key, v) if math.isfinite(v) else "undefined"


def score(p: Point, baseline: Point, objectives: Sequence[Objective], rule: PickRule) -> float:
    """``weight * log gain(preferred) + sum log gain(others)`` (gains over the baseline)."""
    main = None if rule.prefer == "balanced" else preferred_objective(objectives, rule.prefer)
    total = 0.0
    for o in objectives:
        g = o.gain(p.value(o), baseline.value(o))
        if not math.isfinite(g) or g <= 0:
            return -math.inf
        total += (rule.weight if o is main else 1.0) * math.log(g)
    return total


def rank(points: Sequence[Point], baseline: Point, objectives: Sequence[Objective],
         constraints: Sequence[Constraint] = (), rule: PickRule = PickRule()) -> list[Point]:
    """Steps 1-3 of the rule on the training window: the candidates, best first.

    The baseline is always a candidate (it is what the operator runs today), whether or
    not the search found it on the front.
    """
    guard = ttft_guard_applies(rule, objectives, constraints)
    eligible = [p for p in points if p.feasible and not p.is_baseline
                and not check(p.metrics, baseline.metrics, constraints, rule, guard)]
    front = pareto_front(eligible + [baseline], objectives)
    if all(p is not baseline for p in front):
        front.append(baseline)
    main = None if rule.prefer == "balanced" else preferred_objective(objectives, rule.prefer)
    guarded = [o for o in objectives if o is not main]
    ok = [p for p in front if p is baseline
          or all(o.at_least_as_good(p.value(o), baseline.value(o)) for o in guarded)]
    gains = [g for g in (main.gain(p.value(main), baseline.value(main)) for p in ok)
             if math.isfinite(g)] if main is not None else []
    if main is not None and gains:
        floor = max(gains) * (1 - rule.tolerance)
        ok = [p for p in ok if p is baseline
              or main.gain(p.value(main), baseline.value(main)) >= floor]
    return sorted(ok, key=lambda p: (-score(p, baseline, objectives, rule), not p.is_baseline,
                                     p.number))


def select(points: Sequence[Point], baseline: Point, objectives: Sequence[Objective],
           prefer: Prefer | PickRule = "throughput", constraints: Sequence[Constraint] = (),
           *, held_out: bool = False,
           replay_holdout: Callable[[list[Point]], None] | None = None) -> Selection:
    """Pick the recommended point from ``points`` (any set: the front is taken here).

    ``held_out``: run step 4 on the candidates' ``holdout`` metrics; ``replay_holdout``
    fills them for candidates that lack them (a fallback from a lower layer).
    """
    rule = prefer if isinstance(prefer, PickRule) else PickRule(prefer=prefer)
    guard = ttft_guard_applies(rule, objectives, constraints)
    text = rule.describe(objectives, guard)
    pool = list(points)
    skipped: list[str] = []
    while True:  # a candidate failing on held-out leaves the pool; the next layer moves up
        ranked = rank(pool, baseline, objectives, constraints, rule)
        if held_out and replay_holdout is not None:
            missing = [p for p in ranked if p.holdout is None]
            if missing:
                replay_holdout(missing)
        passing, dropped = _held_out_pass(ranked, baseline, objectives, constraints, rule,
                                          guard, held_out, skipped)
        if not dropped or (passing and not passing[0].is_baseline):
            break
        pool = [p for p in pool if all(p is not d for d in dropped)]
    excluded = _excluded(points, ranked, baseline, objectives, constraints, rule, guard)
    if passing and not passing[0].is_baseline:
        pick = passing[0]
        reason = f"{pick.label} is the best point under the rule"
        failed = [s for s in skipped if not s.startswith(baseline.label)]
        if failed:
            reason += f" (after {len(failed)} candidate(s) failed on held-out)"
        return Selection(pick, text, reason, tuple(passing[1:4]), tuple(skipped), excluded)
    base_failed = check(baseline.metrics, None, constraints, rule, False)
    if held_out:
        base_failed += [f"{f} on held-out" for f in
                        check(baseline.holdout, None, constraints, rule, False)]
    why = ("no candidate beats the baseline under the rule" if not skipped
           else "no candidate better than the baseline passed the held-out check")
    reason = f"{why}; recommending the baseline"
    if base_failed:
        reason += (" (which itself fails " + "; ".join(base_failed)
                   + ": no point found meets the constraints)")
    runner = tuple(p for p in passing if p is not baseline)[:3]
    return Selection(baseline, text, reason, runner, tuple(skipped), excluded)


def _excluded(points: Sequence[Point], ranked: Sequence[Point], baseline: Point,
              objectives: Sequence[Objective], constraints: Sequence[Constraint],
              rule: PickRule, guard: bool) -> tuple[tuple[Point, str], ...]:
    """Up to 3 training-window front points outside the candidates, best score first."""
    front = [p for p in pareto_front(list(points), objectives)
             if not p.is_baseline and all(p is not q for q in ranked)]
    out = []
    for p in sorted(front, key=lambda p: (-score(p, baseline, objectives, rule), p.number)):
        why = check(p.metrics, baseline.metrics, constraints, rule, guard)
        if not why:
            main = (None if rule.prefer == "balanced"
                    else preferred_objective(objectives, rule.prefer))
            below = [o.key for o in objectives if o is not main
                     and not o.at_least_as_good(p.value(o), baseline.value(o))]
            why = ([f"{', '.join(below)} below the baseline's"] if below
                   else [f"outside the {rule.tolerance:.0%} tolerance on "
                         f"{main.key if main else 'the objectives'}"])
        out.append((p, "; ".join(why)))
    return tuple(out[:3])


def _held_out_pass(ranked: list[Point], baseline: Point, objectives: Sequence[Objective],
                   constraints: Sequence[Constraint], rule: PickRule, guard: bool,
                   held_out: bool, skipped: list[str]) -> tuple[list[Point], list[Point]]:
    """Step 4 over ``ranked``: the candidates that pass, and the non-baseline ones dropped
    (their reasons appended to ``skipped``)."""
    passing: list[Point] = []
    dropped: list[Point] = []
    for p in ranked:
        failed: list[str] = []
        if held_out:
            if not p.is_baseline:  # the baseline is the fallback: its failures are reported
                failed = check(p.holdout, baseline.holdout, constraints, rule, guard)
            beaters = [q for q in ranked if q is not p and q.holdout is not None
                       and p.holdout is not None
                       and beats_everywhere(q.holdout, p.holdout, objectives)]
            if beaters:
                failed.append(f"{beaters[0].label} beats it on every objective")
        if failed:
            note = f"{p.label}: " + "; ".join(failed) + " on held-out"
            if note not in skipped:
                skipped.append(note)
            if not p.is_baseline:
                dropped.append(p)
            continue
        passing.append(p)
    return passing, dropped


def trade_off(p: Point, pick: Point, objectives: Sequence[Objective],
              window: str = "train") -> str:
    """``p`` against the pick in plain words, with units: what it gains and what it costs."""
    parts: list[tuple[bool, str]] = []
    same: list[str] = []
    a = p.metrics if window == "train" else (p.holdout or {})
    b = pick.metrics if window == "train" else (pick.holdout or {})
    for o in objectives:
        va, vb = _num(a.get(o.key)), _num(b.get(o.key))
        if not (math.isfinite(va) and math.isfinite(vb)) or vb == 0:
            continue
        pct = (va - vb) / abs(vb) * 100
        if abs(pct) < 0.05:
            same.append(f"the same {metric_name(o.key)} ({fmt_metric(o.key, va)})")
            continue
        word = "more" if pct > 0 else "less"
        better = (pct > 0) == (o.direction == "maximize")
        parts.append((better, f"{abs(pct):,.1f} % {word} {metric_name(o.key)} "
                              f"({fmt_metric(o.key, va)} vs {fmt_metric(o.key, vb)})"))
    gains = [t for ok, t in parts if ok]
    costs = [t for ok, t in parts if not ok] + same
    ttft = (f"; TTFT p50 {fmt_metric('ttft_p50_s', a.get('ttft_p50_s'))}, p90 "
            f"{fmt_metric('ttft_p90_s', a.get('ttft_p90_s'))}")
    if gains and costs:
        return f"{p.label}: {', '.join(gains)} for {', '.join(costs)}{ttft}"
    if gains:
        return f"{p.label}: {', '.join(gains)}{ttft}"
    return f"{p.label}: {', '.join(costs) or 'the same objectives'}{ttft}"


#: Plain names and units of the metrics the summaries print.
_NAMES = {"p90_interactivity": ("p90 interactivity", "tok/s/user"),
          "p50_interactivity": ("p50 interactivity", "tok/s/user"),
          "p99_interactivity": ("p99 interactivity", "tok/s/user"),
          "output_throughput_per_gpu": ("output throughput", "tok/s/GPU"),
          "total_throughput_per_gpu": ("total throughput", "tok/s/GPU"),
          "output_throughput": ("output throughput", "tok/s"),
          "request_throughput": ("request throughput", "req/s"),
          "goodput": ("goodput", "req/s"),
          "ttft_p50_s": ("TTFT p50", "s"), "ttft_p90_s": ("TTFT p90", "s"),
          "queue_depth_mean": ("mean queue", "requests"),
          "prefix_cache_hit_rate": ("prefix-cache hit rate", "")}


def metric_name(key: str) -> str:
    return _NAMES.get(key, (key.replace("_", " "), ""))[0]


def fmt_metric(key: str, value: Any) -> str:
    """A metric value with its unit, for people (``21.3 tok/s/user``, ``1.46 s``)."""
    unit = "s" if key.endswith("_s") else _NAMES.get(key, ("", ""))[1]
    return cell(_num(value), METRIC.with_(unit=unit))
