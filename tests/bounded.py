"""Run ``tuner`` in a child process under a memory and time limit.

The safety tests (issue: nothing a user types may hang the tuner or take the machine's
memory) must *fail* when a bad input hangs or allocates without bound, not take the test
run down with it. So the command runs in a subprocess whose address space is capped with
``resource.setrlimit(RLIMIT_AS)`` (what ``ulimit -v`` sets) and whose wall time is capped by
``subprocess.run(timeout=...)``: a blow-up ends as a MemoryError or a kill, which the test
reports, instead of swapping the machine.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Address space a child may map. Importing numpy, pyarrow and polars maps about 600 MB;
#: the bad inputs these tests feed used to need 7-211 GB.
DEFAULT_MEMORY_MB = 1500

#: Wall time a child may take (the old code ran 7 minutes on one record).
DEFAULT_TIMEOUT_S = 60.0


@dataclass
class Bounded:
    """What one bounded run did."""

    returncode: int  # the child's exit status; -9 when killed at the time limit
    output: str  # stdout and stderr together
    timed_out: bool  # the time limit ended it

    @property
    def traceback(self) -> bool:
        return "Traceback" in self.output or "MemoryError" in self.output


def _limit(memory_mb: int) -> None:
    cap = memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def run_tuner(*args: str, cwd: str | os.PathLike[str] | None = None,
              memory_mb: int = DEFAULT_MEMORY_MB, timeout_s: float = DEFAULT_TIMEOUT_S,
              env: dict[str, str] | None = None, stdin: bytes | None = None) -> Bounded:
    """``tuner ARGS...`` in a child under ``memory_mb`` of address space and ``timeout_s``."""
    child_env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNER_SALT": "test-salt",
                 "NO_COLOR": "1", **(env or {})}
    cmd = [sys.executable, "-c", "from tuner.cli import main; main()", *args]
    try:
        done = subprocess.run(cmd, cwd=cwd, env=child_env, input=stdin,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout_s, preexec_fn=lambda: _limit(memory_mb))
    except subprocess.TimeoutExpired as exc:
        out = exc.output.decode("utf-8", "replace") if exc.output else ""
        return Bounded(returncode=-9, output=out, timed_out=True)
    return Bounded(returncode=done.returncode, output=done.stdout.decode("utf-8", "replace"),
                   timed_out=False)
