"""Shared CLI plumbing: error translation and JSON output."""

from __future__ import annotations

import functools
import json
import math
import sys
from typing import Any, Callable, TypeVar

import click

from tuner.errors import TunerError

F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(func: F) -> F:
    """Turn library errors into ``Error: <message>`` and exit code 2, no traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TunerError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _clean(obj: Any) -> Any:
    """NaN/inf are not JSON: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def echo_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout."""
    click.echo(json.dumps(_clean(data), indent=2, default=_json_default, sort_keys=False))
