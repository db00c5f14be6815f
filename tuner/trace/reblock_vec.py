"""Whole-trace re-blocking with numpy: the same rules as :mod:`tuner.trace.reblock`.

The replay re-blocks every request of a trace once (for the bundled agentic hour at
16-token blocks: 50k requests, about 150 M target hashes). The per-request Python
reference costs about a microsecond per hash; this module computes the same values
with a handful of array passes. ``tests/trace/test_reblock.py`` checks both agree on
random and synthesized traces.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tuner.errors import ConfigError
from tuner.trace.reblock import _GOLDEN, _GROUP_SEED, _SPLIT_SEED


def _mix(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _combine(parent: np.ndarray | int, value: np.ndarray) -> np.ndarray:
    """Vectorised :func:`tuner.trace.reblock.combine`."""
    with np.errstate(over="ignore"):
        inner = _mix(value.astype(np.uint64) + np.uint64(_GOLDEN))
        p = np.asarray(parent, dtype=np.uint64) * np.uint64(_GOLDEN)
        return _mix(p + inner)


def _ragged_arange(lengths: np.ndarray) -> np.ndarray:
    """``concat(arange(n) for n in lengths)``."""
    total = int(lengths.sum())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(total, dtype=np.int64) - starts


def _list_parts(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    arr = arr.cast(pa.large_list(pa.uint64()))
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = np.asarray(arr.values, dtype=np.uint64)
    # Null lists have equal offsets, so they read as empty.
    return values, offsets


def reblock_table(table: pa.Table, from_block_size: int, to_block_size: int) -> pa.Table:
    """``table`` with ``block_hashes`` / ``output_block_hashes`` at ``to_block_size``.

    Raises:
        ConfigError: incompatible sizes, or a source list too short for its request.
    """
    f, t = from_block_size, to_block_size
    if t % f and f % t:
        raise ConfigError(
            f"cannot re-block from {f}-token to {t}-token blocks: one must be a multiple of "
            "the other")
    pv, po = _list_parts(table.column("block_hashes"))
    ov, oo = _list_parts(table.column("output_block_hashes"))
    L = table.column("input_len").to_numpy().astype(np.int64)
    O = table.column("output_len").to_numpy().astype(np.int64)
    n_prompt_src = np.diff(po)
    n_out_src = np.diff(oo)
    has_out = n_out_src > 0
    full_prompt = np.minimum(L // f, n_prompt_src)
    # The source chain per request: the whole prompt list, or its full blocks + outputs.
    chain_prompt = np.where(has_out, full_prompt, n_prompt_src)
    chain_len = chain_prompt + np.where(has_out, n_out_src, 0)
    covered = np.where(has_out, np.minimum(L + O, chain_len * f), L)
    fallback = has_out & (L > covered)  # inconsistent source: prompt alone
    chain_prompt = np.where(fallback, n_prompt_src, chain_prompt)
    chain_len = np.where(fallback, n_prompt_src, chain_len)
    covered = np.where(fallback, L, covered)
    n_prompt_t = L // t
    n_total_t = covered // t
    n = _ragged_arange(n_total_t)
    owner = np.repeat(np.arange(len(L), dtype=np.int64), n_total_t)
    if t == f:
        src = n
    elif t % f == 0:
        k = t // f
        src = (n + 1) * k - 1
    else:
        k = f // t
        src = n // k
    if (src >= chain_len[owner]).any():
        bad = int(owner[np.argmax(src >= chain_len[owner])])
        raise ConfigError(
            f"request {table.column('request_id')[bad].as_py()!r}: {int(chain_len[bad])} block "
            f"hashes at {f} tokens cannot cover its full {t}-token blocks")
    in_prompt = src < chain_prompt[owner]
    values = np.concatenate([pv, ov])
    idx = np.where(in_prompt, po[:-1][owner] + src,
                   len(pv) + oo[:-1][owner] + (src - chain_prompt[owner]))
    s = values[idx]
    if t == f:
        h = s
    elif t % f == 0:
        h = _combine(_GROUP_SEED ^ (t // f), s)
    else:
        k = f // t
        h = _combine(_combine(_SPLIT_SEED, s), (n % k).astype(np.uint64))
    is_prompt = n < n_prompt_t[owner]
    p_off = np.concatenate([[0], np.cumsum(n_prompt_t)])
    o_cnt = n_total_t - n_prompt_t
    o_off = np.concatenate([[0], np.cumsum(o_cnt)])
    prompt = pa.ListArray.from_arrays(pa.array(p_off, pa.int32()) if p_off[-1] < 2**31 else
                                      pa.array(p_off, pa.int64()), pa.array(h[is_prompt]))
    output = pa.ListArray.from_arrays(pa.array(o_off, pa.int32()) if o_off[-1] < 2**31 else
                                      pa.array(o_off, pa.int64()), pa.array(h[~is_prompt]))
    table = table.set_column(table.schema.get_field_index("block_hashes"), "block_hashes", prompt)
    return table.set_column(table.schema.get_field_index("output_block_hashes"),
                            "output_block_hashes", output)
