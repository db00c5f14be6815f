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


#: What to tell a user who pressed Ctrl-C, per command (how to pick up where it stopped).
RESUME_HINTS = {
    "tune": "finished trials are kept in the study; run the same command again to resume",
    "tune-log": "finished trials are kept in the study; run the same command again to resume",
    "retune": "an interrupted run is recovered (rolled back or forward) by the next one",
}

#: Exit status after Ctrl-C: 128 + SIGINT, as a shell reports an interrupted program.
EXIT_INTERRUPTED = 130


def handle_errors(func: F) -> F:
    """Turn library errors into ``Error: <message>`` and exit code 2, no traceback.

    Also: a file-system error the library did not anticipate (permission denied, disk
    full) prints one line with exit 2, and Ctrl-C exits 130 (not Click's 1, which cron and
    systemd read as a failure of the job's own) with the command's resume hint.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TunerError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(2)
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            click.echo(f"Error: {where}{exc.strerror or exc}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            ctx = click.get_current_context(silent=True)
            hint = RESUME_HINTS.get(ctx.info_name or "") if ctx is not None else None
            click.echo(f"\nInterrupted{'; ' + hint if hint else ''}.", err=True)
            sys.exit(EXIT_INTERRUPTED)

    return wrapper  # type: ignore[return-value]


#: Columns for rich output when stdout is not a terminal (a pipe, a file, cron's mail):
#: rich would assume 80 and cut table cells ("tri…"); this wide, tables take the width
#: their content needs.
PIPE_WIDTH = 400


def make_console() -> Any:
    """A rich Console for stdout: the terminal's width, or content-sized in a pipe."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)


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
