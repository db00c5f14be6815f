"""The CLI's progress displays (the library only reports, through ``tuner.progress``).

``--progress`` (or a terminal on stderr by default) shows a rich bar per stage; a stderr
that is not a terminal gets plain lines instead (one per stage start, then at most one
per 10 % or 30 s), so CI logs and ``2> file`` stay readable. ``tune``, ``tune-log`` and
``retune`` print those lines by default off a terminal (under cron, systemd or CI they
used to print nothing for minutes).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from tuner.progress import Progress


class RichProgress:
    """A rich bar per stage on stderr; finished bars stay on screen."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=20),
                             TextColumn("{task.fields[amount]}"), TimeElapsedColumn(),
                             TextColumn("left"), TimeRemainingColumn(),
                             TextColumn("{task.fields[detail]}"), console=Console(stderr=True))
        self._bar.start()
        self._task: Any = None
        self._unit = ""

    def stage(self, name: str, total: float, completed: float = 0.0, unit: str = "") -> None:
        self._unit = unit
        self._task = self._bar.add_task(name, total=total, completed=completed, detail="",
                                        amount=self._amount(completed, total))

    def update(self, completed: float, detail: str = "") -> None:
        if self._task is not None:
            total = self._bar.tasks[-1].total or 0.0
            self._bar.update(self._task, completed=completed, detail=detail,
                             amount=self._amount(completed, total))

    def close(self) -> None:
        self._bar.stop()

    def _amount(self, completed: float, total: float) -> str:
        if self._unit == "bytes":
            return f"{completed / 2**20:.1f}/{total / 2**20:.1f} MiB"
        if self._unit:
            return f"{completed:.0f}/{total:.0f} {self._unit}"
        return f"{100 * completed / total:.0f}%" if total else ""


class PlainProgress:
    """Plain lines on a stream: ``name: 40% (4/10 trials) best: ...``."""

    def __init__(self, stream: TextIO | None = None, *, every_s: float = 30.0) -> None:
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self._name, self._total, self._unit = "", 0.0, ""
        self._last_tenth, self._last_t = -1, 0.0

    def stage(self, name: str, total: float, completed: float = 0.0, unit: str = "") -> None:
        self._name, self._total, self._unit = name, float(total), unit
        self._last_tenth, self._last_t = -1, 0.0
        self.update(completed)

    def update(self, completed: float, detail: str = "") -> None:
        share = completed / self._total if self._total else 1.0
        tenth, now = int(share * 10), time.monotonic()
        if tenth == self._last_tenth and now - self._last_t < self.every_s:
            return
        self._last_tenth, self._last_t = tenth, now
        amount = ""
        if self._unit == "bytes":
            amount = f" ({completed / 2**20:.1f}/{self._total / 2**20:.1f} MiB)"
        elif self._unit:
            amount = f" ({completed:.0f}/{self._total:.0f} {self._unit})"
        tail = f" {detail}" if detail else ""
        print(f"{self._name}: {100 * share:.0f}%{amount}{tail}", file=self.stream, flush=True)

    def close(self) -> None:
        self.stream.flush()


#: Commands that run for minutes: off a terminal (cron, systemd, CI) they print plain
#: progress lines by default, so a log shows the run is alive and how far it got.
LONG_RUNNING = ("tune", "tune-log", "retune")


def _plain_by_default() -> bool:
    """Whether the running command is a long one without ``--json`` (whose stdout a
    caller parses; progress goes to stderr either way, but a JSON run asked for quiet)."""
    import click

    ctx = click.get_current_context(silent=True)
    if ctx is None or ctx.info_name not in LONG_RUNNING:
        return False
    return not ctx.params.get("as_json")


@contextlib.contextmanager
def progress_display(flag: bool | None, *, stream: TextIO | None = None
                     ) -> Iterator[Progress | None]:
    """The display for ``--progress/--no-progress``, closed on exit. None (the default):
    a bar on a terminal; off a terminal plain lines for the long-running commands
    (:data:`LONG_RUNNING`, at most one per 10 % or 30 s) and nothing for the others.
    ``--progress`` off a terminal prints plain lines for every command."""
    out = stream or sys.stderr
    tty = out.isatty()
    if flag is False or (flag is None and not tty and not _plain_by_default()):
        yield None
        return
    display = RichProgress() if tty else PlainProgress(out)
    try:
        yield display
    finally:
        display.close()
