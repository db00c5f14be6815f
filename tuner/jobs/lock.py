"""One retune at a time: an ``fcntl.flock`` on ``<state_dir>/retune.lock``.

flock locks die with the process (a killed job never leaves a stale lock), and the lock
file records the holder's pid and start time for the message the second job prints.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import time
from types import TracebackType

from tuner.errors import TunerError


class JobLocked(TunerError, RuntimeError):
    """Raised when another retune holds the state directory's lock."""


class JobLock:
    """Non-blocking exclusive lock; use as a context manager."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(state_dir) / "retune.lock"
        self._fd: int | None = None

    def __enter__(self) -> "JobLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise JobLocked(f"{self.path}: another retune is running ({holder}); "
                            "this run exits without doing anything") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n"
                  .encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
