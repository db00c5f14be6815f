"""Progress of a tuning run: trials done per stage and the best point so far.

``StudyProgress`` forwards to a :class:`tuner.progress.Progress` sink and is a no-op
without one, so the study code calls it unconditionally. How it looks is the CLI's
(``tuner/cli/_progress.py``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from tuner.progress import Progress

    from tuner.tune.objectives import Objective


#: Short labels for the progress line (full names are in the table and the JSON).
_SHORT = {"p90_interactivity": "p90 tok/s/user", "output_throughput_per_gpu": "out tok/s/GPU",
          "total_throughput_per_gpu": "tok/s/GPU", "prefix_cache_hit_rate": "hit rate"}


def best_so_far(trials: Sequence["FrozenTrial"], objectives: Sequence["Objective"]) -> str:
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
        text = f"{value:.4g}" if math.isfinite(value) else str(value)
        parts.append(f"{_SHORT.get(obj.key, obj.key)} {text} (#{best.number})")
    return "best: " + ", ".join(parts)


class StudyProgress:
    """The study's stages on a :class:`tuner.progress.Progress` sink (None: does nothing),
    with the best-so-far line as each update's detail. Display is the caller's."""

    def __init__(self, sink: "Progress | None") -> None:
        self.sink = sink

    def __enter__(self) -> "StudyProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def stage(self, description: str, total: int, completed: int = 0) -> None:
        """Start a new stage (a display keeps the previous one, finished)."""
        if self.sink is not None:
            self.sink.stage(description, total, completed, unit="trials")

    def update(self, completed: int, best: str = "") -> None:
        if self.sink is not None:
            self.sink.update(completed, best)
