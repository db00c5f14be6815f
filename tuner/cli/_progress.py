"""The CLI's progress display (the library only reports, through ``tuner.progress``).

One drawer, :class:`ProgressDrawer`: it keeps the stage (name, total, unit) and writes
how far it got, as a rich bar per stage on a terminal, or as plain lines on a stream that
is not one (one per stage start, then at most one per 10 % or 30 s), so CI logs and
``2> file`` stay readable. ``--progress`` (or a terminal on stderr by default) turns it
on; ``tune``, ``tune-log`` and ``retune`` print the lines by default off a terminal
(under cron, systemd or CI they used to print nothing for minutes).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from tuner.progress import Progress


def amount(completed: float, total: float, unit: str) -> str:
    """``4.0/10.0 MiB`` (bytes), ``4/10 trials``, or ``""`` for a bare fraction."""
    if unit == "bytes":
        return f"{completed / 2**20:.1f}/{total / 2**20:.1f} MiB"
    if unit:
        return f"{completed:.0f}/{total:.0f} {unit}"
    return ""


class ProgressDrawer:
    """A :class:`tuner.progress.Progress` sink that draws on ``stream`` (stderr): a rich bar
    per stage when ``rich`` (default: the stream is a terminal; finished bars stay on
    screen), else a plain line ``name: 40% (4/10 trials) best: ...`` per stage start and
    then at most one per 10 % or ``every_s`` seconds."""

    def __init__(self, stream: TextIO | None = None, *, rich: bool | None = None,
                 every_s: float = 30.0) -> None:
        self.stream = stream or sys.stderr
        self.rich = self.stream.isatty() if rich is None else rich
        self.every_s = every_s
        self._name, self._total, self._unit = "", 0.0, ""
        self._last_tenth, self._last_t = -1, 0.0
        self._bar: Any = self._start_bar() if self.rich else None
        self._task: Any = None

    def _start_bar(self) -> Any:
        from rich.console import Console
        from rich.progress import (BarColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=20),
                       TextColumn("{task.fields[amount]}"), TimeElapsedColumn(),
                       TextColumn("left"), TimeRemainingColumn(),
                       TextColumn("{task.fields[detail]}"), console=Console(stderr=True))
        bar.start()
        return bar

    def stage(self, name: str, total: float, completed: float = 0.0, unit: str = "") -> None:
        self._name, self._total, self._unit = name, float(total), unit
        self._last_tenth, self._last_t = -1, 0.0
        if self._bar is not None:
            self._task = self._bar.add_task(name, total=total, completed=completed, detail="",
                                            amount=self._bar_amount(completed))
        else:
            self.update(completed)

    def update(self, completed: float, detail: str = "") -> None:
        if self._bar is not None:
            if self._task is not None:
                self._bar.update(self._task, completed=completed, detail=detail,
                                 amount=self._bar_amount(completed))
            return
        share = completed / self._total if self._total else 1.0
        tenth, now = int(share * 10), time.monotonic()
        if tenth == self._last_tenth and now - self._last_t < self.every_s:
            return
        self._last_tenth, self._last_t = tenth, now
        done = amount(completed, self._total, self._unit)
        text = f" ({done})" if done else ""
        tail = f" {detail}" if detail else ""
        print(f"{self._name}: {100 * share:.0f}%{text}{tail}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        else:
            self.stream.flush()

    def _bar_amount(self, completed: float) -> str:
        total = self._total
        return amount(completed, total, self._unit) or (
            f"{100 * completed / total:.0f}%" if total else "")


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
    display = ProgressDrawer(out, rich=tty)
    try:
        yield display
    finally:
        display.close()
