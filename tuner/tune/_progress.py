"""Terminal progress for a tuning run: trials done, best so far, time left (rich, stderr).

``StudyProgress`` is a no-op when disabled, so the study code calls it unconditionally.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

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
    """A rich progress bar per stage with a "best so far" line; disabled = does nothing."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> "StudyProgress":
        if self.enabled:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(bar_width=20), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                TextColumn("{task.fields[best]}"), console=Console(stderr=True))
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
            self._progress = None

    def stage(self, description: str, total: int, completed: int = 0) -> None:
        """Start a new bar (the previous one stays on screen, finished)."""
        if self._progress is not None:
            self._task = self._progress.add_task(description, total=total, completed=completed,
                                                 best="")

    def update(self, completed: int, best: str = "") -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=completed, best=best)
