"""One duration grammar for the CLI and config files.

``90`` (seconds), ``90s``, ``250ms``, ``30m``, ``1.5h``, ``2d``, ``1w`` and sums of parts such
as ``1h30m`` or ``1d 12h``: a number followed by a unit, repeated; a bare number only as the
whole text. Units are case-insensitive. ``tuner trace slice --last 1h30m`` and
``window: 1h30m`` in a retune config therefore mean the same (they used to be two parsers,
and the config's rejected sums). Standard library only.
"""

from __future__ import annotations

import math
import re
from typing import Any

from tuner.errors import ConfigError

#: Seconds per unit.
UNIT_S: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0,
                            "w": 604800.0}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d|w)", re.IGNORECASE)
_NUMBER = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*")
EXAMPLES = "90, 90s, 30m, 1h30m, 2d"


def parse_duration(text: Any, where: str = "duration", *, allow_zero: bool = False) -> float:
    """``text`` (a string or a number of seconds) -> seconds.

    ``where`` starts the error message (a flag, or ``PATH:LINE: key`` from
    :meth:`tuner.loaders.LoadedFile.where`).

    Raises:
        ConfigError: not a duration of this grammar, or not positive (zero allowed with
            ``allow_zero``).
    """
    if isinstance(text, bool):
        raise ConfigError(f"{where}: {text!r} is not a duration like {EXAMPLES}")
    if isinstance(text, (int, float)):
        total = float(text)
    else:
        s = str(text)
        whole = _NUMBER.fullmatch(s)
        if whole is not None:
            total = float(whole.group(1))
        else:
            total, pos = 0.0, 0
            while pos < len(s):
                m = _PART.match(s, pos)
                if m is None:
                    if not s[pos:].strip():
                        break
                    total = math.nan
                    break
                total += float(m.group(1)) * UNIT_S[m.group(2).lower()]
                pos = m.end()
            if pos == 0:
                total = math.nan
    if not math.isfinite(total) or total < 0 or (total == 0 and not allow_zero):
        raise ConfigError(f"{where}: {text!r} is not a {'' if allow_zero else 'positive '}"
                          f"duration like {EXAMPLES}")
    return total


__all__ = ["EXAMPLES", "UNIT_S", "parse_duration"]
