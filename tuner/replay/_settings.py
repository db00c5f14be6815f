"""``--set key=value`` parsing into ``SchedulerSettings``.

The CLI of every stage (replay, tune, validate) accepts scheduler overrides as strings;
this turns them into a validated ``SchedulerSettings`` with the right Python types, so a
typo fails before any replay starts and the message names the field and what it accepts.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from tuner.errors import ConfigError
from tuner.sim.settings import SchedulerSettings

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(SchedulerSettings)


def _convert(name: str, raw: str, typ: Any) -> Any:
    """``raw`` as the type of field ``name``; ConfigError naming the field otherwise."""
    text = raw.strip()
    if typing.get_origin(typ) is typing.Literal:
        choices = typing.get_args(typ)
        if text not in choices:
            raise ConfigError(f"--set {name}={raw!r}: must be one of "
                              f"{', '.join(map(str, choices))}")
        return text
    if typ is bool:
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ConfigError(f"--set {name}={raw!r}: expected a boolean (true/false, 1/0, on/off)")
    if typ is int:
        try:
            value = float(text.replace("_", ""))
        except ValueError:
            value = float("nan")
        if not value.is_integer():
            raise ConfigError(f"--set {name}={raw!r}: expected an integer")
        return int(value)
    if typ is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"--set {name}={raw!r}: expected a number") from None
    raise AssertionError(f"SchedulerSettings.{name} has a type parse_settings does not know: {typ}")


def parse_settings(assignments: Iterable[str],
                   base: SchedulerSettings | None = None) -> SchedulerSettings:
    """Apply ``["field=value", ...]`` to ``base`` and validate the result.

    Field names are ``SchedulerConfig``'s (``max_num_seqs``); the ``vllm serve`` flag
    spelling (``max-num-seqs``) and ``scheduling_policy`` for ``policy`` are accepted too.
    A later assignment to the same field wins, as repeated CLI flags do.

    Raises:
        ConfigError: unknown field (the message lists the known ones), a value of the wrong
            type, or a value or combination vLLM rejects (the message gives the valid range).
    """
    types = _field_types()
    known = [f.name for f in fields(SchedulerSettings)]
    changes: dict[str, Any] = {}
    for item in assignments:
        key, sep, raw = item.partition("=")
        name = key.strip().replace("-", "_")
        if name == "scheduling_policy":
            name = "policy"
        if not sep or not name:
            raise ConfigError(f"--set {item!r}: expected FIELD=VALUE, e.g. "
                              "cache_aware_admission_window=16")
        if name not in types:
            raise ConfigError(f"--set {item!r}: unknown scheduler setting {name!r}; "
                              f"known: {', '.join(known)}")
        changes[name] = _convert(name, raw, types[name])
    return (base or SchedulerSettings()).replace(**changes)
