"""Crash-safe file writes: a temp file in the same folder, fsync, ``os.replace``.

``os.replace`` is atomic on POSIX within one file system, so a reader (or a restarted job)
sees either the old content or the new one, never a torn file.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import tempfile
from typing import Any


def write_atomic(path: str | os.PathLike[str], text: str) -> pathlib.Path:
    """Replace ``path`` with ``text`` atomically (and durably: file and folder fsynced)."""
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(out.parent)
    return out


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> pathlib.Path:
    return write_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def fsync_dir(folder: pathlib.Path) -> None:
    """Make a rename in ``folder`` durable (no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def crash_point(phase: str) -> None:
    """Test hook: ``TUNER_RETUNE_CRASH_AT=<phase>`` makes the job die here (``os._exit(70)``).

    Used by tests/jobs to kill the job between the steps of its commit order; documented
    in docs/retune.md. Costs one environment lookup when unset.
    """
    if os.environ.get("TUNER_RETUNE_CRASH_AT") == phase:
        os._exit(70)
