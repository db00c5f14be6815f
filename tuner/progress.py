"""How long-running library calls report progress: one protocol, no display.

``ingest``, ``replay.run``, ``tune``/``join`` and ``retune`` take ``progress=`` a
:class:`Progress` (or None for silence) and tell it which stage runs and how far it got.
How that looks -- a rich bar on a terminal, one plain line per step in a log -- is decided
by the caller: the CLI's display is ``tuner/cli/_progress.py``; a notebook can pass its
own object with these two methods. :class:`Reporter` lets library code report without
checking for a sink. So the library never imports rich and never guesses
whether stderr is a terminal.

Standard library only (the replay backends call it from inside vLLM environments too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

#: ``callback(fraction)``: the share of one replay done, in [0, 1] (the replay backends'
#: form; :func:`fraction_callback` adapts a :class:`Progress` to it).
ProgressCallback = Callable[[float], None]


@runtime_checkable
class Progress(Protocol):
    """A progress sink. Calls arrive in order: ``stage`` starts a unit of work of ``total``
    ``unit``s (``"bytes"``, ``"trials"``, or ``""`` with total 1.0 for a fraction),
    ``update`` moves it to ``completed`` with an optional one-line ``detail`` (e.g. the best
    trial so far). A stage's ``completed`` never decreases. The library never ends a sink:
    whoever made it closes it (one sink may follow several calls)."""

    def stage(self, name: str, total: float, completed: float = 0.0, unit: str = "") -> None:
        ...

    def update(self, completed: float, detail: str = "") -> None: ...


class Reporter:
    """A :class:`Progress` sink or nothing: calls forward to the sink, or do nothing
    without one, so library code reports unconditionally. ``unit`` is every stage's
    unit (``"trials"`` for a study)."""

    def __init__(self, sink: Progress | None, *, unit: str = "") -> None:
        self.sink = sink
        self.unit = unit

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        """Ends nothing: the sink is its caller's (see :class:`Progress`)."""

    def stage(self, name: str, total: float, completed: float = 0.0) -> None:
        """Start a new stage (a display keeps the previous one, finished)."""
        if self.sink is not None:
            self.sink.stage(name, total, completed, unit=self.unit)

    def update(self, completed: float, detail: str = "") -> None:
        if self.sink is not None:
            self.sink.update(completed, detail)


def fraction_callback(progress: Progress | None, name: str) -> ProgressCallback | None:
    """Start stage ``name`` (total 1.0) on ``progress`` and return a fraction callback for
    it, or None when there is no sink."""
    if progress is None:
        return None
    progress.stage(name, 1.0)

    def update(fraction: float) -> None:
        progress.update(min(max(float(fraction), 0.0), 1.0))

    return update


def check_progress(progress: object) -> Progress | None:
    """``progress`` as a sink: None/False mean silence; anything else must implement
    :class:`Progress` (``True`` is refused: the library does not pick a display).

    Raises:
        TypeError: not a :class:`Progress`.
    """
    if progress is None or progress is False:
        return None
    if progress is True or not isinstance(progress, Progress):
        raise TypeError("progress= takes a tuner.progress.Progress (an object with stage() "
                        "and update(); the CLI's is in tuner/cli/_progress.py), or None")
    return progress


__all__ = ["Progress", "ProgressCallback", "Reporter", "check_progress", "fraction_callback"]
