"""Picks that survive a wrong clock: the recommendation re-checked under clock variants.

Why: the twin's clock is a fit that is off by its error bands on deployments it never saw
(``tuner.perf.fit.bands``), and a setting that beats vLLM's defaults by a few per cent on
the nominal clock may lose on a clock that is just as likely (a prefill 40 % slower than
priced makes a small token budget cost TTFT; a faster decode makes a cap on running
requests cost throughput). So before recommending, the study replays the plain pick and
the baseline on the training window under ``variants`` clocks drawn from the bands, and
the recommendation is the first candidate (the plain pick, then its runner-ups) whose
advantage over the baseline *holds* in at least ``share`` of them: under that clock it
passes every constraint and the TTFT guard against the baseline under the same clock, and
its gains are worth its costs under the pick rule (a positive score, as
``TuneResult.confirms`` judges the nominal clock).

The variants: each of the four parts of a step (``tuner.perf.clock_variant``: prefill,
decode, CPU overhead, transfer) is low or high -- the ends of the band of the metric whose
published rows constrain it (:data:`PART_BANDS`) -- drawn jointly and seeded, balanced per
part (each part is low in half the variants and high in the other half, in a seeded
random combination with the others; no corner twice before all 16 are used). The
replays reuse the trial replays' evaluator and forked workers
(:func:`tuner.tune.survivors.evaluate_many`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from tuner.errors import ConfigError
from tuner.perf.clock_variant import PARTS, ClockVariant
from tuner.perf.deployment import Deployment
from tuner.sim.settings import SchedulerSettings
from tuner.tune.objectives import Constraint, Objective
from tuner.tune.select import (PickRule, Point, Selection, check, metric_name, score,
                               ttft_guard_applies)

#: Clock variants replayed by default (``tune --clock-variants``): each part low in two
#: and high in two; 4 x (pick + baseline) training-window replays (docs/tuning.md gives
#: the added time of the README's main job).
DEFAULT_VARIANTS = 4
#: Share of the variants in which the pick's advantage must hold (``--robust-share``).
DEFAULT_SHARE = 0.75
#: Candidates checked at most (the plain pick and its runner-ups), lazily: the next one is
#: replayed only when the one before does not hold.
MAX_CANDIDATES = 3
#: The band (metric) that spans each part's factor, and why (docs/tuning.md). Prefill
#: takes the TTFT band only where that band rests on enough rows of its own (a
#: calibration's probes, or ``MIN_ROWS`` published rows); the published TTFT cell holds 4
#: queue-bound rows, so prefill borrows the throughput band, whose rows include the
#: prefill-heavy 8k/1k runs.
PART_BANDS = {"prefill": "ttft", "decode": "tpot", "cpu": "tpot", "transfer": "throughput"}
PREFILL_FALLBACK = "throughput"


@dataclass(frozen=True, slots=True)
class RobustOptions:
    """How the robust check runs (``tune --robust on|off --clock-variants N``)."""

    enabled: bool = True  # off: recommend the plain pick without the check
    variants: int = DEFAULT_VARIANTS  # clock variants replayed
    share: float = DEFAULT_SHARE  # the pick's advantage must hold in this share of them
    seed: int = 0  # seeds the draw of the variants

    def __post_init__(self) -> None:
        if isinstance(self.variants, bool) or not isinstance(self.variants, int) \
                or not 1 <= self.variants <= 64:
            raise ConfigError(f"clock variants {self.variants!r}: must be an integer 1..64")
        if not 0.0 < self.share <= 1.0:
            raise ConfigError(f"robust share {self.share!r}: must be in (0, 1]")

    @property
    def required(self) -> int:
        """Variants in which the advantage must hold."""
        return max(1, math.ceil(self.share * self.variants - 1e-9))


@dataclass(frozen=True, slots=True)
class PartRange:
    """One part's low and high factor and the band they come from."""

    part: str
    low: float
    high: float
    cell: str  # the band's cell ("tpot/amd/*") and source

    def to_dict(self) -> dict[str, Any]:
        return {"low": round(self.low, 4), "high": round(self.high, 4), "band": self.cell}


@dataclass(slots=True)
class Outcome:
    """One candidate under one clock variant, against the baseline under the same clock."""

    variant: ClockVariant
    holds: bool
    delta_pct: dict[str, float]  # objective key -> % change against the baseline
    failed: list[str] = field(default_factory=list)  # why it does not hold

    def to_dict(self) -> dict[str, Any]:
        return {"clock": self.variant.to_dict(), "holds": self.holds,
                "delta_pct": {k: round(v, 2) for k, v in self.delta_pct.items()},
                "failed": list(self.failed)}


@dataclass(slots=True)
class CandidateCheck:
    """A candidate's outcomes under every variant."""

    point: Point
    outcomes: list[Outcome]

    @property
    def held(self) -> int:
        return sum(o.holds for o in self.outcomes)

    def spread(self, key: str) -> tuple[float, float] | None:
        values = [o.delta_pct[key] for o in self.outcomes if key in o.delta_pct]
        return (min(values), max(values)) if values else None


@dataclass(slots=True)
class RobustReport:
    """What the check did and what it recommends (``TuneResult.robust``)."""

    options: RobustOptions
    baseline_name: str  # "vLLM's defaults" or "the baseline"
    ranges: tuple[PartRange, ...] = ()
    variants: tuple[ClockVariant, ...] = ()
    checked: list[CandidateCheck] = field(default_factory=list)
    plain: Point | None = None  # the pick of the rule on the nominal clock
    pick: Point | None = None  # the recommendation after the check
    reason: str = ""
    skipped: str | None = None  # why the check did not run (None: it ran)
    #: the rule's selection the robust pick came from (after re-selecting without the
    #: candidates that failed; None before the check ran)
    selection: Selection | None = None

    @property
    def changed(self) -> bool:
        return self.pick is not None and self.plain is not None and self.pick is not self.plain

    def check_of(self, point: Point) -> CandidateCheck | None:
        return next((c for c in self.checked if c.point is point), None)

    def verdict(self, point: Point, objectives: Sequence[Objective]) -> str:
        """``trial 4 beats vLLM's defaults in 4 of 4 clock variants; by +71 % to +95 %
        p90 interactivity, -0.4 % to +0.2 % output throughput``."""
        c = self.check_of(point)
        if c is None:
            return f"{point.label}: not checked under the clock variants"
        n = len(c.outcomes)
        head = f"{point.label} beats {self.baseline_name} in {c.held} of {n} clock variants"
        if c.held < self.options.required:
            head += f" (fewer than the {self.options.required} needed)"
        parts = []
        for o in objectives:
            s = c.spread(o.key)
            if s is not None:
                lo, hi = _pct(s[0]), _pct(s[1])
                parts.append(f"{lo if lo == hi else lo + ' to ' + hi} {metric_name(o.key)}")
        return head + ("; by " + ", ".join(parts) if parts else "")

    def lines(self, objectives: Sequence[Objective]) -> list[str]:
        """What ``tune`` prints about the check."""
        if self.skipped is not None:
            return [f"robust check: skipped -- {self.skipped}"]
        spans = ", ".join(f"{r.part} x{r.low:.2f}-x{r.high:.2f} ({r.cell})" for r in self.ranges)
        out = [f"robust check ({len(self.variants)} clock variants on the training window, "
               f"advantage must hold in {self.options.required}; {spans}):"]
        for c in self.checked:
            out.append("  " + self.verdict(c.point, objectives))
            for i, o in enumerate(c.outcomes, 1):
                deltas = ", ".join(f"{_pct(o.delta_pct[k.key])} {metric_name(k.key)}"
                                   for k in objectives if k.key in o.delta_pct)
                state = "holds" if o.holds else "fails: " + "; ".join(o.failed)
                out.append(f"    variant {i} ({o.variant.describe()}): {deltas} -- {state}")
        out.append(f"  robust pick: {self.pick.label if self.pick else '-'} -- {self.reason}")
        if self.changed and self.plain is not None:
            out.append(f"  plain pick (nominal clock): {self.plain.label} -- "
                       + self.verdict(self.plain, objectives))
        return out

    def to_dict(self, objectives: Sequence[Objective]) -> dict[str, Any]:
        """The JSON and profile record."""
        out: dict[str, Any] = {"enabled": self.options.enabled,
                               "variants": self.options.variants,
                               "share": self.options.share, "required": self.options.required,
                               "seed": self.options.seed, "skipped": self.skipped}
        if self.skipped is not None:
            return out
        out.update({
            "ranges": {r.part: r.to_dict() for r in self.ranges},
            "clocks": [v.to_dict() for v in self.variants],
            "plain_pick": None if self.plain is None else self.plain.number,
            "plain_is_baseline": None if self.plain is None else self.plain.is_baseline,
            "robust_pick": None if self.pick is None else self.pick.number,
            "robust_is_baseline": None if self.pick is None else self.pick.is_baseline,
            "changed": self.changed, "reason": self.reason,
            "candidates": [{"trial": c.point.number, "held": c.held, "of": len(c.outcomes),
                            "verdict": self.verdict(c.point, objectives),
                            "outcomes": [o.to_dict() for o in c.outcomes]}
                           for c in self.checked]})
        return out


def _pct(value: float) -> str:
    """``+12.3 %`` (``+0.0 %``, never ``-0.0 %``)."""
    text = f"{value:+.1f}"
    return ("+0.0" if text == "-0.0" else text) + " %"


# --------------------------------------------------------------------------- the variants
def part_ranges(bands: Any) -> tuple[PartRange, ...]:
    """Each part's (low, high) factor from a ``PredictionBands`` (the baseline's)."""
    from tuner.perf.fit.bands import MIN_ROWS

    out = []
    for part in PARTS:
        metric = PART_BANDS[part]
        band = bands.bands[metric]
        if part == "prefill" and not bands.calibrated and band.rows < MIN_ROWS:
            band = bands.bands[PREFILL_FALLBACK]
        out.append(PartRange(part, float(band.low), float(band.high),
                             f"{band.metric} band {band.cell}"
                             + ("" if band.source == "published LOSO" else f", {band.source}")))
    return tuple(out)


def draw_variants(ranges: Sequence[PartRange], n: int, seed: int) -> tuple[ClockVariant, ...]:
    """``n`` clocks, each part at its low or high factor, drawn with ``seed``: distinct
    corners of the 16 while they last, the draw as balanced per part as it can be (each
    part low in about half the variants), so no part is judged only slow or only fast."""
    rng = random.Random(f"tuner-clock-variants:{seed}")
    all_corners = [tuple((i >> b) & 1 for b in range(len(ranges)))
                   for i in range(2 ** len(ranges))]
    rows: list[tuple[int, ...]] = []
    while len(rows) < n:
        size = min(n - len(rows), len(all_corners))
        best, best_cost = None, math.inf
        floor = (size % 2) * len(ranges) / 2  # an odd draw cannot split evenly
        for _ in range(200):
            pool = list(all_corners)
            rng.shuffle(pool)
            draw = pool[:size]
            cost = sum(abs(sum(r[j] for r in draw) - size / 2) for j in range(len(ranges)))
            if cost < best_cost:
                best, best_cost = draw, cost
            if cost <= floor:
                break
        rows += best or []
    return tuple(ClockVariant(*[r.high if bit else r.low for r, bit in zip(ranges, row)])
                 for row in rows[:n])


# --------------------------------------------------------------------------- the check
def supports_variants(evaluator: Any) -> str | None:
    """None when ``evaluator`` can replay under a clock variant, else why not."""
    if not getattr(evaluator, "supports_clock_variants", False):
        return "the evaluator cannot replay under another clock (a custom evaluator)"
    if getattr(evaluator, "backend", "sim") == "vllm-serve":
        return "a real server has its own clock (--backend vllm-serve)"
    return None


def _evaluate_clock(evaluator: Any, settings: SchedulerSettings, deployment: Deployment | None,
                    window: str, clock: ClockVariant) -> dict[str, Any]:
    """One replay under ``clock`` (the pool's job function)."""
    if deployment is None:
        return evaluator.evaluate(settings, window, clock=clock)
    return evaluator.evaluate(settings, window, deployment=deployment, clock=clock)


def judge(cand: dict[str, Any], base: dict[str, Any], objectives: Sequence[Objective],
          constraints: Sequence[Constraint], rule: PickRule, guard: bool,
          variant: ClockVariant) -> Outcome:
    """Whether the candidate's advantage holds under one clock (module docstring)."""
    failed = check(cand, base, constraints, rule, guard)
    mine, ref = Point(0, {}, {}, cand), Point(-1, {}, {}, base)
    if not score(mine, ref, objectives, rule) > 0:
        failed.append("does not beat the baseline under the rule")
    delta = {}
    for o in objectives:
        a, b = cand.get(o.key), base.get(o.key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
            delta[o.key] = (float(a) - float(b)) / abs(float(b)) * 100.0
    return Outcome(variant, not failed, delta, failed)


def robust_check(evaluator: Any, selection: Selection, baseline: Point,
                 objectives: Sequence[Objective], constraints: Sequence[Constraint],
                 rule: PickRule, options: RobustOptions, *, workers: int = 1,
                 baseline_name: str = "the baseline", calibration: str | None = None,
                 run_jobs: Callable[..., None] | None = None,
                 reselect: Callable[[list[Point]], Selection] | None = None) -> RobustReport:
    """Replay the plain pick (then its runner-ups) and the baseline under clock variants
    and return the recommendation whose advantage holds (module docstring).

    ``run_jobs`` is :func:`tuner.tune.survivors.evaluate_many`'s signature (tests pass
    their own); the default fans the replays out over ``workers`` forked processes.
    ``reselect(failed)`` re-runs the pick rule without the candidates that failed (so a
    point the failed pick beat on the held-out window is considered again); without it
    the selection's runner-ups are tried in order.
    """
    from tuner.metrics.bands import bands_from_keys
    from tuner.tune.deployment_space import split_settings
    from tuner.tune.survivors import evaluate_many

    report = RobustReport(options, baseline_name, plain=selection.point, pick=selection.point)
    if not options.enabled:
        report.skipped, report.reason = "--robust off", "the plain pick"
        return report
    if selection.point.is_baseline:
        report.skipped = (f"the plain pick is {baseline_name} itself: there is no advantage "
                          "to check")
        return report
    why = supports_variants(evaluator)
    bands = bands_from_keys(baseline.metrics, calibration)
    if why is None and bands is None:
        why = "the baseline's replay carries no error bands to draw clocks from"
    if why is not None:
        report.skipped = why
        return report
    report.ranges = part_ranges(bands)
    report.variants = draw_variants(report.ranges, options.variants, options.seed)
    run = run_jobs or evaluate_many
    guard = ttft_guard_applies(rule, objectives, constraints)
    runner = iter([p for p in selection.runner_ups if not p.is_baseline])
    base_runs: list[dict[str, Any] | None] = [None] * len(report.variants)
    cand: Point | None = selection.point
    report.selection = selection
    failed: list[Point] = []
    for n in range(MAX_CANDIDATES):
        if cand is None or cand.is_baseline:
            break
        points = ([baseline] if n == 0 else []) + [cand]
        jobs = [(*split_settings(p.settings), "train", v)
                for p in points for v in report.variants]
        got: list[dict[str, Any] | None] = [None] * len(jobs)

        def store(i: int, metrics: dict[str, Any]) -> None:
            got[i] = metrics

        run(evaluator, jobs, workers, store, _evaluate_clock)
        k = len(report.variants)
        if n == 0:
            base_runs = got[:k]
        mine = got[-k:]
        outcomes = [judge(m or {}, b or {}, objectives, constraints, rule, guard, v)
                    for m, b, v in zip(mine, base_runs, report.variants)]
        report.checked.append(CandidateCheck(cand, outcomes))
        if report.checked[-1].held >= options.required:
            report.pick = cand
            report.reason = (f"its advantage over {baseline_name} holds in "
                             f"{report.checked[-1].held} of {k} clock variants "
                             f"(at least {options.required} needed)")
            if n:
                first = report.checked[0]
                report.reason += (f"; the plain pick, {selection.point.label}, holds in only "
                                  f"{first.held}")
            return report
        failed.append(cand)
        if reselect is not None:  # the rule's next point with the failed ones left out
            report.selection = reselect(failed)
            cand = report.selection.point
        else:
            cand = next(runner, None)
    report.pick = baseline
    tried = ", ".join(f"{c.point.label} in {c.held}" for c in report.checked)
    report.reason = (f"no candidate's advantage over {baseline_name} holds in "
                     f"{options.required} of {len(report.variants)} clock variants ({tried}); "
                     f"recommending {baseline_name}")
    return report


def robust_selection(selection: Selection, report: RobustReport) -> Selection:
    """``selection`` with the robust pick as its point (unchanged when the pick is the
    plain one); the plain pick joins the runner-ups and the reason says why."""
    if not report.changed or report.pick is None:
        return selection
    pick = report.pick
    base = report.selection or selection
    seen: list[Point] = []
    for p in (selection.point, *base.runner_ups, *selection.runner_ups):
        if p is not pick and not p.is_baseline and all(p is not q for q in seen):
            seen.append(p)
    runner = tuple(seen[:3])
    reason = (f"{pick.label}: the robust pick -- {report.reason}" if not pick.is_baseline
              else report.reason)
    return Selection(pick, selection.rule + "; the advantage re-checked under clock variants",
                     reason, runner, base.skipped, base.excluded)


__all__ = ["DEFAULT_SHARE", "DEFAULT_VARIANTS", "Outcome", "RobustOptions", "RobustReport",
           "draw_variants", "judge", "part_ranges", "robust_check", "robust_selection",
           "supports_variants"]
