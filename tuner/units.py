"""Numbers for people: durations with their unit, counts without exponents, table cells.

Why: tables printed ``17,357.53 ms`` for a 17-second TTFT and ``1.302e+04`` for thirteen
thousand tokens per second; an operator reading a log should not have to convert. And
six tables each had their own few lines deciding how a None, a bool or a float looks;
:func:`cell` is now the one place, and each table names its :class:`CellStyle` (the
look its readers know: the HTML report's en dash, the Pareto front's on/off, the replay
summary's fixed decimals, a chart's compact ticks). Standard library only (every stage
may format a value).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

#: How a cell writes a number (see :func:`cell`).
Notation = Literal["significant", "fixed", "people", "compact", "metric"]


def _sig(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits, fixed-point (never an exponent)."""
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(value)))))
    return f"{value:,.{decimals}f}"


def duration(seconds: float | None) -> str:
    """``0.5023`` -> ``502 ms``; ``17.3575`` -> ``17.4 s``; ``3821.2`` -> ``3,821 s``.

    Below one second in milliseconds, above it in seconds, three significant digits (whole
    seconds from 1,000 s on); ``-`` for a missing or non-finite value.
    """
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if abs(seconds) < 1.0:
        return f"{_sig(seconds * 1e3)} ms"
    if abs(seconds) >= 1000.0:
        return f"{seconds:,.0f} s"
    return f"{_sig(seconds)} s"


def number(value: float | None, unit: str = "") -> str:
    """``13020.5`` -> ``13,020``; ``4.944`` -> ``4.94``; ``0.9248`` -> ``0.925`` (+ unit)."""
    if value is None or not math.isfinite(value):
        return "-"
    text = f"{value:,.0f}" if abs(value) >= 1000 else _sig(value)
    return f"{text} {unit}".strip()


@dataclass(frozen=True, slots=True)
class CellStyle:
    """How one table writes its cells (:func:`cell`)."""

    missing: str = "-"  # None, NaN and infinities
    true: str = "yes"  # a bool True
    false: str = "no"  # a bool False
    group_ints: bool = True  # 8,192 rather than 8192 (ints in "significant"/"people")
    notation: Notation = "significant"  # how a real number is written (see cell)
    digits: int = 4  # significant digits ("significant"), decimals ("fixed")
    unit: str = ""  # appended to a number: "x" (no space), "tok/s" ("metric": one space)

    def with_(self, **changes: Any) -> CellStyle:
        return dataclasses.replace(self, **changes)


#: The HTML reports: an en dash for a missing value, four significant digits.
REPORT = CellStyle(missing="\u2013")
#: The Pareto-front table ``tuner tune`` prints: switches read on/off, ints as typed.
FRONT = CellStyle(true="on", false="off", group_ints=False)
#: The replay summary ``tuner replay`` prints: fixed decimals (``with_(digits=1)``).
FIXED = CellStyle(notation="fixed", digits=3)
#: The profile diff ``tuner cluster diff`` prints: values as the profiles hold them,
#: floats for people.
DIFF = CellStyle(true="True", false="False", group_ints=False, notation="people")
#: Chart tick and tooltip labels: 0.25, 12, 1.5k, 2M, 1e-05.
TICK = CellStyle(notation="compact")
#: A metric with its unit, for people (``21.3 tok/s/user``, ``1.46 s``, ``980 ms``).
METRIC = CellStyle(notation="metric")


def cell(value: Any, style: CellStyle = REPORT) -> str:
    """``value`` as ``style``'s table writes it.

    A missing value (None, NaN, an infinity) is ``style.missing``; a bool is
    ``style.true``/``style.false``; text and other objects are ``str(value)``. A number
    follows ``style.notation``:

    * ``significant``: ``digits`` significant digits (``0.9248`` -> ``0.9248``), whole and
      grouped from ``10 ** digits`` (or 10,000 if lower) on and for a whole float from
      1,000 (``12345.6`` -> ``12,346``, never ``1.235e+04``); an int exactly;
    * ``fixed``: ``digits`` decimals, grouped (``1234.5`` -> ``1,234.500``), ints too;
    * ``people``: :func:`number` (three significant digits, fixed-point); an int exactly;
    * ``compact``: tick labels (``1500`` -> ``1.5k``, ``2e6`` -> ``2M``, ``1e-5`` -> ``1e-05``);
    * ``metric``: a value with its unit; seconds (``unit="s"``) as ``1,234 s``, ``12.35 s``
      or ``980 ms``, anything else to three significant digits below 100 and one decimal
      from 100 on (``21.3 tok/s/user``, ``207.1 tok/s/GPU``).
    """
    if value is None:
        return style.missing
    if isinstance(value, bool):
        return style.true if value else style.false
    if not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return style.missing
    if isinstance(value, int) and style.notation in ("significant", "people"):
        return f"{value:,}" if style.group_ints else str(value)
    return _NOTATIONS[style.notation](value, style)


def _significant(value: float, style: CellStyle) -> str:
    whole_from = min(1e4, 10.0 ** style.digits)
    if abs(value) >= whole_from or (value == int(value) and abs(value) >= 1000):
        return f"{value:,.0f}{style.unit}"
    return f"{value:.{style.digits}g}{style.unit}"


def _fixed(value: float, style: CellStyle) -> str:
    return f"{value:,.{style.digits}f}{style.unit}"


def _people(value: float, style: CellStyle) -> str:
    return number(value, style.unit)


def _compact(value: float, style: CellStyle) -> str:
    if value == 0:
        return "0"
    a = abs(value)
    if a >= 1e6:
        return f"{value / 1e6:g}M"
    if a >= 1e4:
        return f"{value / 1e3:g}k"
    if a >= 0.01:
        return f"{value:.4g}"
    return f"{value:.0e}"


def _metric(value: float, style: CellStyle) -> str:
    if style.unit == "s":
        if abs(value) >= 100:
            return f"{value:,.0f} s"
        return f"{value:,.2f} s" if abs(value) >= 1 else f"{value * 1e3:,.0f} ms"
    text = f"{value:,.3g}" if abs(value) < 100 else f"{value:,.1f}"
    return f"{text} {style.unit}".strip()


_NOTATIONS = {"significant": _significant, "fixed": _fixed, "people": _people,
              "compact": _compact, "metric": _metric}
