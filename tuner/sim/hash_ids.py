"""Hash ids: a trace's 64-bit block hashes interned to dense ints.

Why: the prefix cache looks up every block of a prompt at admission (an agentic prompt is
~3,000 blocks of 16 tokens). A Python dict keyed by 64-bit ints costs ~300 ns a probe
(a cache miss on the entry, another on the key object); an array indexed by a dense id
is one vectorised gather for the whole prompt. Only equality of hashes matters to the
twin (vLLM's prefix cache compares hashes, nothing else), so renaming each distinct
hash to ``0 .. num_ids - 1`` changes no decision.

The replay path interns once per trace at the *source* block size
(``tuner.replay.intern_requests``: a split hash is a function of its source
hash and its position, so ids need not be computed per KV block); this module is the
general path for requests that arrive with raw hashes (tests, notebooks).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

__all__ = ["as_hash_array", "intern_hashes"]

_MASK64 = (1 << 64) - 1


def as_hash_array(values: Any) -> np.ndarray:
    """Raw hashes (ints, negative ones wrapped to uint64, or an array) as ``uint64``."""
    if values is None:
        return np.zeros(0, dtype=np.uint64)
    if isinstance(values, np.ndarray):
        return values.astype(np.uint64, copy=False)
    return np.fromiter((int(v) & _MASK64 for v in values), dtype=np.uint64)


def intern_hashes(sources: Iterable[Any]) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """Dense ids for every request's ``block_hashes`` and ``output_block_hashes``.

    Returns one ``(prompt ids, output ids)`` pair of ``int64`` arrays per source, in
    order, and the number of distinct hashes (ids are ``0 .. num_ids - 1``).
    """
    parts: list[np.ndarray] = []
    for src in sources:
        parts.append(as_hash_array(src.block_hashes))
        parts.append(as_hash_array(getattr(src, "output_block_hashes", None)))
    if not parts:
        return [], 0
    flat = np.concatenate(parts)
    if not len(flat):
        empty = np.zeros(0, dtype=np.int64)
        return [(empty, empty)] * (len(parts) // 2), 0
    uniq, inverse = np.unique(flat, return_inverse=True)
    ids = inverse.astype(np.int64).reshape(-1)
    bounds = np.cumsum([0] + [len(p) for p in parts])
    pairs = [(ids[bounds[i]:bounds[i + 1]], ids[bounds[i + 1]:bounds[i + 2]])
             for i in range(0, len(parts), 2)]
    return pairs, len(uniq)
