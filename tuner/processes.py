"""Whether a process (or a process group) still exists, by sending it signal 0.

Why a module: the live-server wrapper (``tuner.serve.server``) waits for a stopped server's
process group to be gone, and the study (``tuner.tune.study``) tells a RUNNING trial whose
worker died from one still being worked on. Both ask the kernel the same question and read
its answer the same way, so the reading lives here once. Standard library only (any stage
may ask).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.pool
import os
from collections.abc import Iterator
from typing import Callable


def _answers_signal_zero(send: Callable[[int, int], None], target: int) -> bool:
    """Whether ``send(target, 0)`` finds a process: no error, or ``EPERM`` (it exists but
    belongs to another user, which still means alive); ``ESRCH`` means gone."""
    try:
        send(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (``kill(pid, 0)``)."""
    return _answers_signal_zero(os.kill, pid)


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still exists (``kill(-pgid, 0)``)."""
    return _answers_signal_zero(os.killpg, pgid)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cap_workers(requested: int, n_trials: int) -> tuple[int, str | None]:
    """Worker processes worth forking for ``n_trials`` trials, and why fewer, if fewer.

    More workers than trials only race for the last ones (``--workers 500 --trials 2`` ran
    about 27 trials); more than CPUs only time-share them (500 processes on 2 CPUs).
    """
    cap = max(1, min(requested, n_trials, usable_cpus()))
    if cap == requested:
        return requested, None
    why = []
    if n_trials < requested:
        why.append(f"{n_trials} stage-1 trials")
    if usable_cpus() < requested:
        why.append(f"{usable_cpus()} CPUs")
    return cap, f"--workers {requested} capped to {cap} ({' and '.join(why)})"


@contextlib.contextmanager
def forked_pool(workers: int) -> Iterator[multiprocessing.pool.Pool]:
    """A ``fork`` pool that, once its work is done, is closed and joined, not terminated.

    Why: ``with Pool() as pool`` ends in ``terminate()``, which SIGTERMs the workers while
    one may wait on the task queue's lock; a report's pool under pytest-xdist was left
    with a worker asleep on that lock and the parent joining it forever (12 minutes, in a
    CI run). ``close()`` hands every worker the stop sentinel and they exit on their own;
    only an error (or Ctrl-C) in the parent terminates them. Forked, so the workers
    inherit what the parent prepared (interned traces, an evaluator) without pickling.
    """
    pool = multiprocessing.get_context("fork").Pool(workers)
    try:
        yield pool
    except BaseException:
        pool.terminate()
        pool.join()
        raise
    pool.close()
    pool.join()
