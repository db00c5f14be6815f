"""Hand the C heap's free pages back to the system at a streamed replay's phase ends.

Why: a long replay frees and retakes large buffers all day (a window's hash arrays, a
hash chunk's columns, the hash map's runs at a renumbering). glibc serves most of them
from its heap, and a freed chunk in the middle of the heap stays resident: over a
synthetic day's 24 hours the heap's free part grew to 35-52 MB against 18 at 6 hours,
part of what its peak holds more (docs/performance.md, rounds "mem24b" and "pdmem").
``malloc_trim(0)`` releases every whole free page of the heap (``madvise``), not only
its top. It walks the heap's free lists (about a millisecond), so it is called where a
replay drops a lot at once and rarely: after a hash chunk is dropped and around a
renumbering (a synthetic day drops 17 chunks and renumbers 6 times; the agentic hour
drops one chunk), not every window.

Where there is no glibc (macOS, musl), it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

__all__ = ["release_free_heap"]


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    return trim


def release_free_heap() -> None:
    """Return the C heap's whole free pages to the system (glibc; elsewhere a no-op)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
