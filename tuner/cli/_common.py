"""Shared CLI plumbing: error translation and JSON output."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import sys
import threading
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


#: Parameters that name what a command writes: never counted as its inputs.
OUTPUT_PARAMS = frozenset({"output", "output_dir", "out", "server_log"})


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwinds like Ctrl-C, so every ``AtomicOutput`` removes
    its temporary file (they used to stay behind as ``.OUT.parquet.XXXX.tmp``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


#: The process that installed the handlers; forked workers (tune's pools) inherit them.
_handler_pid: int | None = None


def _raise_terminated(signum: int, frame: Any) -> None:
    if os.getpid() != _handler_pid:
        # A forked worker (multiprocessing terminates its pool with SIGTERM): die as the
        # default action would, without a traceback from inside the pool's queue.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise Terminated(signum)


def install_signal_cleanup() -> Callable[[], None]:
    """SIGTERM and SIGHUP end the command through :class:`Terminated` (main thread only).

    Returns the function that puts the previous handlers back: the CLI calls it when the
    command's context closes, so a process that runs commands in-process (a notebook, a
    test worker through Click's runner) keeps its own handlers afterwards.
    """
    global _handler_pid
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    _handler_pid = os.getpid()
    previous: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            previous[sig] = signal.signal(sig, _raise_terminated)

    def restore() -> None:
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    return restore


def note_file_params(params: dict[str, Any]) -> None:
    """Count every existing file among a command's arguments and options as its input, so
    no ``-o`` replaces one (:func:`tuner.outputs.note_input`): the trace, a --baseline or
    --warm-start profile, a --calibration file, a --storage journal, ..."""
    from tuner.outputs import forget_inputs, note_input

    forget_inputs()
    for name, value in params.items():
        if name in OUTPUT_PARAMS:
            continue
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, str) and item and "\n" not in item and os.path.isfile(item):
                note_input(item)


#: The widest integer any option takes (int64): a bigger one overflowed inside numpy.
_INT_LIMIT = 2**63 - 1

_finite_classes: dict[type, type] = {}


def _finite_type(param_type: click.ParamType) -> click.ParamType:
    """A copy of ``param_type`` whose ``convert`` also refuses NaN, infinities and
    integers past int64, in Click's own ``Invalid value for '--x'`` words. The copy keeps
    the original's class as its base, so help text and metavars stay as they were."""
    base = type(param_type)
    cls = _finite_classes.get(base)
    if cls is None:
        def convert(self: Any, value: Any, param: Any, ctx: Any) -> Any:
            out = base.convert(self, value, param, ctx)
            if isinstance(out, float) and not math.isfinite(out):
                self.fail(f"{value!r} is not a finite number", param, ctx)
            if isinstance(out, int) and not isinstance(out, bool) and abs(out) > _INT_LIMIT:
                self.fail(f"{value!r} is out of range (at most {_INT_LIMIT:,})", param, ctx)
            return out

        cls = _finite_classes[base] = type(f"Finite{base.__name__}", (base,),
                                           {"convert": convert})
    copy = object.__new__(cls)
    copy.__dict__.update(param_type.__dict__)
    return copy


def harden_numeric_options(command: click.Command) -> None:
    """Every FLOAT/INT option and argument of ``command`` and its subcommands refuses
    NaN, infinities and integers past int64 (``--speedup nan`` wrote NaN arrivals,
    ``--rate nan`` ended in a traceback). Applied once, to the whole CLI, so a new option
    is covered without anyone remembering to."""
    for param in command.params:
        if isinstance(param.type, (click.types.FloatParamType, click.types.IntParamType)):
            param.type = _finite_type(param.type)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            harden_numeric_options(sub)


def handle_errors(func: F) -> F:
    """Turn library errors into ``Error: <message>`` and exit code 2, no traceback.

    Also: a file-system error the library did not anticipate (permission denied, disk
    full) prints one line with exit 2, and Ctrl-C exits 130 (not Click's 1, which cron and
    systemd read as a failure of the job's own) with the command's resume hint; SIGTERM
    and SIGHUP exit 128 + the signal after the same cleanup. Before the command runs,
    every file among its parameters is noted as an input (:func:`note_file_params`).
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            ctx = click.get_current_context(silent=True)
            note_file_params(ctx.params if ctx is not None else kwargs)
            return func(*args, **kwargs)
        except Terminated as exc:
            name = signal.Signals(exc.signum).name
            click.echo(f"\nTerminated ({name}); nothing was left half-written.", err=True)
            sys.exit(128 + exc.signum)
        except TunerError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(2)
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            click.echo(f"Error: {where}{exc.strerror or exc}", err=True)
            sys.exit(2)
        except MemoryError:
            # Bounds on every input should keep this from happening; if one is missed,
            # a line instead of a traceback (and nothing half-written: outputs unwind).
            click.echo("Error: ran out of memory; give a smaller trace, deployment "
                       "(--num-gpu-blocks, --replicas) or search", err=True)
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
