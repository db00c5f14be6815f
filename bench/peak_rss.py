"""The peak resident set of this process, measured the same way by every bench.

Why a module: ``getrusage(RUSAGE_SELF).ru_maxrss`` is the obvious call and it is wrong for
the benches' children on Linux: the figure survives ``execve`` and starts from the forked
parent's resident set (the child's copy of the parent's pages counts until exec). A bench
that had built a 24-hour trace in memory made every child read at least that: the
2026-12-07 memory table's 777 MiB for a replay and for its 3-KB report were the parent's.
"""

from __future__ import annotations

import resource
import sys

__all__ = ["peak_rss_mib"]


def peak_rss_mib() -> float:
    """This process's peak resident set (MiB) since it started its program.

    Why not ``getrusage(RUSAGE_SELF).ru_maxrss``: on Linux that figure survives ``execve``
    and starts from the forked parent's resident set (the child's copy of the parent's
    pages counts until exec), so every child of a bench that had built a 24-hour trace
    in memory read at least that (the 2026-12-07 table's 777 MiB for both the replay
    and its 3-KB report was the parent's, not the child's). ``VmHWM`` in
    ``/proc/self/status`` is the high-water mark of the current address space, which
    exec replaces. Elsewhere (macOS: no /proc) ``ru_maxrss``, in bytes there.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
