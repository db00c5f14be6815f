"""Objectives and constraints: which ``Summary`` keys a study optimises or bounds.

Objectives are ``Summary.to_dict()`` keys with a direction: ``p90_interactivity`` (tok/s
the slowest 10% of users get, higher is better), ``output_throughput_per_gpu`` (output
tok/s per GPU, higher is better), or any other key written ``key`` (direction inferred from
the name) or ``key:max`` / ``key:min``. Constraints are ``key<=bound`` or ``key>=bound``
and reach Optuna through ``trial.set_constraint`` as ``value - bound`` (``<=``) or
``bound - value`` (``>=``), so ``<= 0`` means feasible, Optuna's convention.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Literal, Sequence

from tuner.errors import ConfigError
from tuner.units import FRONT, cell

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

Direction = Literal["maximize", "minimize"]

#: The default objectives: the two numbers operators compare deployments by.
DEFAULT_OBJECTIVES = ("p90_interactivity", "output_throughput_per_gpu")

#: Name fragments that say "higher is better"; anything timed (``_s``) or counted as
#: harm (preemptions) is "lower is better". Unknown names need an explicit ``:max``/``:min``.
_MAXIMIZE_HINTS = ("interactivity", "throughput", "hit_rate", "goodput")
_MINIMIZE_HINTS = ("_s", "_ms", "preemption", "rejected", "aborted")

#: Constraint value Optuna gets when the metric itself is NaN (e.g. no request finished):
#: clearly infeasible but finite, because ``set_constraint`` refuses NaN.
_NAN_VIOLATION = 1e9


@dataclass(frozen=True, slots=True)
class Objective:
    key: str  # a Summary.to_dict() key
    direction: Direction

    def __str__(self) -> str:
        return f"{self.key}:{'max' if self.direction == 'maximize' else 'min'}"

    def gain(self, value: float, baseline: float) -> float:
        """Relative improvement over ``baseline`` (> 1 is better, whatever the direction)."""
        if not (math.isfinite(value) and math.isfinite(baseline)) or value <= 0 or baseline <= 0:
            return float("nan")
        return value / baseline if self.direction == "maximize" else baseline / value

    def at_least_as_good(self, value: float, baseline: float) -> bool:
        if not (math.isfinite(value) and math.isfinite(baseline)):
            return False
        return value >= baseline if self.direction == "maximize" else value <= baseline


@dataclass(frozen=True, slots=True)
class Constraint:
    key: str  # a Summary.to_dict() key
    op: Literal["<=", ">="]
    bound: float

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.bound:g}"

    def violation(self, metrics: dict[str, Any]) -> float:
        """Optuna's constraint value: ``<= 0`` feasible, ``> 0`` by how much it is violated."""
        value = metrics.get(self.key)
        if value is None or not isinstance(value, (int, float)) or math.isnan(value):
            return _NAN_VIOLATION
        return float(value - self.bound if self.op == "<=" else self.bound - value)


def infer_direction(key: str) -> Direction:
    """``maximize``/``minimize`` from the metric name; ConfigError when it cannot tell."""
    if any(h in key for h in _MAXIMIZE_HINTS):
        return "maximize"
    if key.endswith(_MINIMIZE_HINTS) or any(h in key for h in _MINIMIZE_HINTS[2:]):
        return "minimize"
    raise ConfigError(f"cannot infer whether to maximise or minimise objective {key!r}; "
                      f"write it as {key}:max or {key}:min")


def parse_objectives(specs: "str | Iterable[str | Objective] | None",
                     known: Sequence[str] | None = None) -> tuple[Objective, ...]:
    """Parse ``"a,b:min"`` or a list of such items; ``None`` gives the defaults."""
    if specs is None:
        specs = DEFAULT_OBJECTIVES
    if isinstance(specs, str):
        specs = [s for s in specs.split(",")]
    out: list[Objective] = []
    for spec in specs:
        if isinstance(spec, Objective):
            out.append(spec)
            continue
        for item in str(spec).split(","):
            item = item.strip()
            if not item:
                continue
            key, _, direction = item.partition(":")
            key = key.strip()
            if direction:
                words = {"max": "maximize", "maximize": "maximize",
                         "min": "minimize", "minimize": "minimize"}
                if direction.strip() not in words:
                    raise ConfigError(f"objective {item!r}: direction must be max or min")
                out.append(Objective(key, words[direction.strip()]))  # type: ignore[arg-type]
            else:
                out.append(Objective(key, infer_direction(key)))
    if not out:
        raise ConfigError("at least one objective is needed")
    keys = [o.key for o in out]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"objective named twice: {keys}")
    _check_known(keys, known, "objective")
    return tuple(out)


_CONSTRAINT_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=)\s*([-+0-9.eE]+)\s*$")


def parse_constraints(specs: "Iterable[str | Constraint]",
                      known: Sequence[str] | None = None) -> tuple[Constraint, ...]:
    """Parse ``"ttft_p90_s<=2.0"`` style constraints."""
    out: list[Constraint] = []
    for spec in specs:
        if isinstance(spec, Constraint):
            out.append(spec)
            continue
        match = _CONSTRAINT_RE.match(str(spec))
        if not match:
            raise ConfigError(f"constraint {spec!r}: write it as KEY<=NUMBER or KEY>=NUMBER, "
                              "e.g. ttft_p90_s<=2.0")
        try:
            bound = float(match.group(3))
        except ValueError:
            raise ConfigError(f"constraint {spec!r}: {match.group(3)!r} is not a number") from None
        out.append(Constraint(match.group(1), match.group(2), bound))  # type: ignore[arg-type]
    _check_known([c.key for c in out], known, "constraint")
    return tuple(out)


def _check_known(keys: Sequence[str], known: Sequence[str] | None, what: str) -> None:
    if known is None:
        return
    for key in keys:
        if key not in known:
            raise ConfigError(f"{what} {key!r} is not a replay metric; known: "
                              f"{', '.join(sorted(known))}")


#: Short labels for the progress line (full names are in the table and the JSON).
_SHORT = {"p90_interactivity": "p90 tok/s/user", "output_throughput_per_gpu": "out tok/s/GPU",
          "total_throughput_per_gpu": "tok/s/GPU", "prefix_cache_hit_rate": "hit rate"}


def best_so_far(trials: Sequence["FrozenTrial"], objectives: Sequence[Objective]) -> str:
    """``"best p90_interactivity 12.80 (#4), output_throughput_per_gpu 8339 (#9)"`` over
    finished, feasible trials; empty when none finished yet."""
    from optuna.trial import TrialState

    done = [t for t in trials if t.state == TrialState.COMPLETE and t.values
            and all(v <= 0 for v in t.constraints.values())]
    if not done:
        return ""
    parts = []
    for i, obj in enumerate(objectives):
        pick = max if obj.direction == "maximize" else min
        best = pick(done, key=lambda t: t.values[i])
        value = best.values[i]
        text = cell(value, FRONT)
        parts.append(f"{_SHORT.get(obj.key, obj.key)} {text} (#{best.number})")
    return "best: " + ", ".join(parts)
