"""splitmix64's finaliser, the one 64-bit mixer both hashing paths use.

Ingest (:mod:`tuner.trace.hashing`, salted re-keying of given hash ids) and re-blocking
(:mod:`tuner.trace.reblock` and its vectorised twin :mod:`tuner.trace.reblock_vec`) must
agree bit for bit with their plain-Python references, across releases: a stored trace's
hashes were made with these constants. tests/trace/test_splitmix.py pins known values
(Vigna's reference ``splitmix64`` stream for seed 0) and the agreement of the scalar and
array forms.

Arithmetic wraps at 64 bits; the numpy forms run under ``np.errstate(over="ignore")`` in
the caller when inputs may overflow on multiplication (numpy uint64 wraps silently anyway).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

MASK = (1 << 64) - 1
#: 2^64 / golden ratio: splitmix64's increment, also the chaining multiplier.
GOLDEN = 0x9E3779B97F4A7C15
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB
#: numpy forms of the constants, made on first use: the scalar form must import without
#: numpy (tuner.trace.reblock runs inside vLLM environments, tests/trace/test_public_api.py).
_U: tuple = ()


def _consts() -> tuple:
    global _U
    if not _U:
        import numpy as np

        _U = (np.uint64(_C1), np.uint64(_C2), np.uint64(30), np.uint64(27), np.uint64(31),
              np.right_shift, np.empty_like)
    return _U


def mix64(x: int) -> int:
    """splitmix64's finaliser on one integer: a fast 64-bit bijection with full avalanche."""
    x &= MASK
    x ^= x >> 30
    x = (x * _C1) & MASK
    x ^= x >> 27
    x = (x * _C2) & MASK
    return x ^ (x >> 31)


def mix64_array(x: "np.ndarray") -> "np.ndarray":
    """:func:`mix64` on a uint64 array, as a new array (``x`` is left alone)."""
    c = _U or _consts()
    x = x ^ (x >> c[2])
    _tail(x, c[6](x), c)
    return x


def mix64_inplace(x: "np.ndarray") -> None:
    """:func:`mix64` on a uint64 array, in place (one temporary of ``x``'s size)."""
    c = _U or _consts()
    t = x >> c[2]
    x ^= t
    _tail(x, t, c)


def mix64_tail_inplace(x: "np.ndarray") -> "np.ndarray":
    """The rest of :func:`mix64` after ``x ^= x >> 30``, in place on ``x`` (returned), for
    callers that fold that first step into an earlier pass."""
    c = _U or _consts()
    _tail(x, c[6](x), c)
    return x


def _tail(x: "np.ndarray", t: "np.ndarray", c: tuple) -> None:
    c1, c2, _, s27, s31, right_shift, _ = c
    x *= c1
    right_shift(x, s27, out=t)
    x ^= t
    x *= c2
    right_shift(x, s31, out=t)
    x ^= t


__all__ = ["GOLDEN", "MASK", "mix64", "mix64_array", "mix64_inplace", "mix64_tail_inplace"]
