"""Trace requests with KV-block hashes as numpy arrays: the memory-light path to the twin.

Why: an agentic hour at 14 requests/s holds 50,164 prompts of 49k tokens on average.
Re-blocked from 64- to 16-token blocks that is 155 million hashes; as Python ints in tuples (36-byte
int objects plus 8-byte pointers) about 6.8 GB, and the plain-Python re-blocking loop
spends minutes of CPU on it. Here the hashes stay ``uint64`` arrays (8 bytes each,
1.2 GB for that hour) computed with vectorised numpy, and the twin turns one request's
array into a list only when the request arrives (``SimRequest`` accepts anything with
``tolist()``) and drops it when the request finishes.

The arithmetic is :func:`tuner.trace.reblock.reblock_request_hashes`'s, bit for bit
(tests/replay/test_kv_requests.py checks it against that reference on random inputs):

* equal sizes: the first ``floor(input_len / B)`` hashes;
* splitting (``from = k * B``): sub-block ``n`` is ``combine(combine(SPLIT, src[n // k]), n % k)``
  where ``combine(p, v) = mix64(p * GOLDEN + mix64(v + GOLDEN))`` on wrapping uint64;
* grouping (``B = k * from``) chains across the whole prompt, so it is sequential per
  request: it falls back to the reference and converts the result.

Only backends that declare ``Backend.accepts_array_hashes`` get these arrays; the others
get the tuple form from :func:`tuner.replay.reblock_request`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tuner.trace.reblock import reblock_request_hashes

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SPLIT_SEED = 0x7370_6C69_7462_6C6B  # tuner.trace.reblock._SPLIT_SEED ("splitblk")
_EMPTY = np.zeros(0, dtype=np.uint64)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (a new array; wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    return _mix64_tail(x)


def _mix64_tail(x: np.ndarray) -> np.ndarray:
    """The rest of :func:`_mix64` after ``x ^= x >> 30``, in place on ``x``."""
    t = np.empty_like(x)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    np.right_shift(x, np.uint64(27), out=t)
    x ^= t
    x *= np.uint64(0x94D049BB133111EB)
    np.right_shift(x, np.uint64(31), out=t)
    x ^= t
    return x


def _combine(parent: np.ndarray, value: np.ndarray) -> np.ndarray:
    """``tuner.trace.reblock.combine`` on arrays."""
    return _mix64(parent * _GOLDEN + _mix64(value + _GOLDEN))


#: combine(SPLIT_SEED, s) needs SPLIT_SEED * GOLDEN once.
_SPLIT_TIMES_GOLDEN = np.uint64((_SPLIT_SEED * int(_GOLDEN)) & ((1 << 64) - 1))

#: Sub-block tags mix64(j + GOLDEN) for j = 0..k-1, cached per k.
_TAGS: dict[int, np.ndarray] = {}


def _split(src: np.ndarray, n_target: int, k: int) -> np.ndarray:
    """Sub-block hashes ``0 .. n_target-1`` of source blocks ``src`` split ``k`` ways.

    ``combine(SPLIT, s)`` depends on the source block only, so it runs on ``n/k`` values;
    only the last ``combine(., j)`` runs per sub-block (in place, one temporary).
    """
    tags = _TAGS.get(k)
    if tags is None:
        tags = _TAGS[k] = _mix64(np.arange(k, dtype=np.uint64) + _GOLDEN)
    n_src = -(-n_target // k)
    parent = _mix64(_SPLIT_TIMES_GOLDEN + _mix64(src[:n_src] + _GOLDEN))
    parent *= _GOLDEN
    x = np.repeat(parent, k)[:n_target]
    x += np.tile(tags, n_src)[:n_target]
    x ^= x >> np.uint64(30)
    return _mix64_tail(x)


def reblock_arrays(block_hashes: Any, output_block_hashes: Any, input_len: int,
                   output_len: int, from_block_size: int,
                   to_block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``reblock_request_hashes`` returning ``uint64`` arrays, vectorised where possible.

    Raises:
        ConfigError: as the reference (sizes that do not divide, too few hashes).
    """
    f, t = from_block_size, to_block_size
    src = np.asarray(block_hashes, dtype=np.uint64)
    out = np.asarray(output_block_hashes, dtype=np.uint64) if len(output_block_hashes) else _EMPTY
    if f <= 0 or t <= 0 or f % t:  # grouping (sequential chain) and errors: the reference
        prompt, output = reblock_request_hashes(
            [int(v) for v in src], [int(v) for v in out], input_len, output_len, f, t)
        return np.asarray(prompt, dtype=np.uint64), np.asarray(output, dtype=np.uint64)
    k = f // t
    chain, covered, with_output = src, input_len, False
    if out.size:
        joined = np.concatenate([src[: input_len // f], out])
        joined_covered = min(input_len + output_len, joined.size * f)
        if input_len <= joined_covered:  # else the reference falls back to the prompt alone
            chain, covered, with_output = joined, joined_covered, True
    n_target = covered // t
    if chain.size < -(-n_target // k):  # too few hashes: let the reference raise
        reblock_request_hashes([int(v) for v in src], [int(v) for v in out], input_len,
                               output_len, f, t)
        raise AssertionError("reblock_request_hashes accepted what reblock_arrays refuses")
    whole = chain[:n_target].copy() if k == 1 else _split(chain, n_target, k)
    n_prompt = input_len // t
    return whole[:n_prompt], (whole[n_prompt:] if with_output else _EMPTY)


def kv_requests(requests: list[Any], from_block_size: int | None,
                to_block_size: int) -> list[Any]:
    """``requests`` with ``uint64``-array hashes at the KV block size (see module doc)."""
    if from_block_size is None:
        from_block_size = to_block_size
    kv = []
    for r in requests:
        prompt, output = reblock_arrays(r.block_hashes, r.output_block_hashes, int(r.input_len),
                                        int(r.output_len), from_block_size, to_block_size)
        kv.append(dataclasses.replace(r, block_hashes=prompt, output_block_hashes=output))
    return kv


def load_trace_arrays(trace: Any) -> list[Any]:
    """A ``Trace``'s requests in arrival order with hashes as views into flat arrays.

    Avoids ``Trace.requests()``'s Python int tuples: one flat ``uint64`` array per list
    column, sliced per request without copying.
    """
    import pyarrow as pa

    from tuner.trace import TraceRequest

    df = trace.lazy().collect()

    def flat(name: str) -> tuple[np.ndarray, np.ndarray]:
        arr = df.get_column(name).to_arrow()
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        arr = arr.cast(pa.large_list(pa.uint64())).fill_null(
            pa.scalar([], pa.large_list(pa.uint64())))
        offsets = np.asarray(arr.offsets, dtype=np.int64)
        values = np.asarray(arr.values, dtype=np.uint64)[offsets[0]:offsets[-1]]
        return values, offsets - offsets[0]

    pv, po = flat("block_hashes")
    ov, oo = flat("output_block_hashes")
    cols = {name: df.get_column(name).to_list() for name in (
        "request_id", "arrival_s", "input_len", "output_len", "session_id", "parent_id", "turn",
        "priority", "cache_salt", "model", "status")}
    out = []
    for i in range(df.height):
        out.append(TraceRequest(
            request_id=cols["request_id"][i], arrival_s=cols["arrival_s"][i],
            input_len=cols["input_len"][i], output_len=cols["output_len"][i],
            block_hashes=pv[po[i]:po[i + 1]],  # type: ignore[arg-type]
            output_block_hashes=ov[oo[i]:oo[i + 1]],  # type: ignore[arg-type]
            session_id=cols["session_id"][i], parent_id=cols["parent_id"][i],
            turn=cols["turn"][i], priority=cols["priority"][i] or 0,
            cache_salt=cols["cache_salt"][i], model=cols["model"][i], status=cols["status"][i]))
    return out
