"""Numbers for people: durations with their unit, counts without exponents.

Why: tables printed ``17,357.53 ms`` for a 17-second TTFT and ``1.302e+04`` for thirteen
thousand tokens per second; an operator reading a log should not have to convert. Standard
library only (every stage may format a value).
"""

from __future__ import annotations

import math


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
