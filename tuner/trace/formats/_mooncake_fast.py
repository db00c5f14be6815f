"""A vectorised parser for Mooncake's canonical line layout, the ingest hot path.

Mooncake traces are written by one ``json.dumps`` call per record, so every line is
exactly::

    {"timestamp": T, "input_length": I, "output_length": O, "hash_ids": [A, B, ...]}

with non-negative integers. The parser (1) deletes all digits (``bytes.translate``, C
speed) and checks with a few ``count``/``replace`` passes that what is left, the
*skeleton*, is exactly the template on every line; (2) turns every non-digit into a space and lets ``np.fromstring(sep=" ")``
read all integers in one C loop; (3) checks the integer count against the skeleton (so
an empty slot such as ``[1, , 3]`` is caught) and slices the flat array per line. It
beats polars' NDJSON reader on one core (bench/ingest.py prints both figures). Anything
else (floats, other key orders, extra keys, ``\\r\\n``, ids >= 2**64 - 1) returns ``None``
and the caller falls back to polars, then to per-line ``json``; tests check that the
three agree.
"""

from __future__ import annotations

import numpy as np

_HEAD = b'{"timestamp": , "input_length": , "output_length": , "hash_ids": ['
_DIGITS = b"0123456789"
_TO_SPACE = bytes(c if c in _DIGITS else 32 for c in range(256))
_SATURATED = np.uint64(2**64 - 1)


def parse_chunk(chunk: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """``(timestamp, input_length, output_length, id_offsets, ids)`` or ``None``.

    ``chunk`` holds whole lines, each ending in ``\\n``; ``id_offsets`` (one more than
    lines) index ``ids`` per line.
    """
    if not chunk.endswith(b"\n"):
        return None
    stripped = chunk.translate(None, _DIGITS)
    n = stripped.count(b"\n")
    # Every line of the skeleton must be HEAD + ", " * (k - 1) + "]}" (k ids; "]}" alone
    # for 0 or 1 id). Checked with C-speed bytes operations: each line starts with the
    # only HEAD in it and ends with "]}", and what lies between is nothing but ", " pairs
    # (removing ", " from a string of commas and spaces leaves nothing only then).
    if not (stripped.startswith(_HEAD) and stripped.count(_HEAD) == n
            and stripped.count(b"\n" + _HEAD) == n - 1 and stripped.count(b"]}\n") == n):
        return None
    core = stripped.replace(_HEAD, b"").replace(b"]}\n", b"\n").replace(b", ", b"")
    if core != b"\n" * n:
        return None
    newlines = np.flatnonzero(np.frombuffer(stripped, dtype=np.uint8) == 10)
    lengths = np.diff(np.concatenate([[-1], newlines])) - 1
    n_ids = (lengths - len(_HEAD) - 2) // 2 + 1  # "[]" and "[5]" look alike: see below
    values = np.fromstring(chunk.translate(_TO_SPACE), dtype=np.uint64, sep=" ")  # noqa: NPY
    if (values == _SATURATED).any():  # fromstring saturates numbers >= 2**64 - 1
        return None
    per_line = 3 + n_ids
    if len(values) != int(per_line.sum()):
        # Fewer integers than the skeleton allows: empty lists ("[]" and "[5]" share a
        # skeleton), or an empty slot such as "[1, , 3]", which the recount rejects.
        n_ids = np.where(_empty_lists(chunk, n), 0, n_ids)
        per_line = 3 + n_ids
        if len(values) != int(per_line.sum()):
            return None
    first = np.concatenate([[0], np.cumsum(per_line)[:-1]])
    keep = np.ones(len(values), dtype=bool)
    keep[first] = keep[first + 1] = keep[first + 2] = False
    offsets = np.concatenate([[0], np.cumsum(n_ids)]).astype(np.int64)
    return (values[first].astype(np.float64), values[first + 1].astype(np.int64),
            values[first + 2].astype(np.int64), offsets, values[keep])


def _empty_lists(chunk: bytes, n: int) -> np.ndarray:
    """Per line, whether ``hash_ids`` is ``[]`` (vectorised: find ``[]`` per line)."""
    if b"[]" not in chunk:
        return np.zeros(n, dtype=bool)
    a = np.frombuffer(chunk, dtype=np.uint8)
    nl = np.flatnonzero(a == 10)
    at = np.flatnonzero((a[:-1] == 91) & (a[1:] == 93))
    out = np.zeros(n, dtype=bool)
    out[np.searchsorted(nl, at)] = True
    return out
