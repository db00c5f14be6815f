"""Re-blocking with numpy: the same rules as :mod:`tuner.trace.reblock`, bit for bit.

The replay re-blocks every request of a trace once (for the bundled agentic hour at
16-token blocks: 50k requests, about 150 M target hashes). The per-request Python
reference costs about a microsecond per hash; this module computes the same values
with a handful of array passes, through one set of hash primitives (:func:`_mix64`,
:func:`_combine`) and two entry points:

* :func:`reblock_table`: a whole Arrow table of requests (``Trace.reblocked``,
  ``Trace.iter_batches``);
* :func:`reblock_arrays`: one request's hashes as ``uint64`` arrays (the replay's
  memory-light path, :mod:`tuner.replay._kv_requests`).

``tests/trace/test_reblock.py`` and ``tests/replay/test_kv_requests.py`` check both
against the reference on random and synthesized traces. pyarrow loads on first use of
:func:`reblock_table` only, so :func:`reblock_arrays` needs numpy alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.errors import ConfigError
from tuner.trace.reblock import _GROUP_SEED, _SPLIT_SEED, reblock_request_hashes
from tuner.trace.splitmix import GOLDEN as _GOLDEN_INT
from tuner.trace.splitmix import mix64_array as _mix64
from tuner.trace.splitmix import mix64_tail_inplace as _mix64_tail

if TYPE_CHECKING:
    import pyarrow as pa

_GOLDEN = np.uint64(_GOLDEN_INT)
_EMPTY = np.zeros(0, dtype=np.uint64)


def _combine(parent: np.ndarray | int, value: np.ndarray) -> np.ndarray:
    """Vectorised :func:`tuner.trace.reblock.combine`."""
    with np.errstate(over="ignore"):
        inner = _mix64(np.asarray(value, dtype=np.uint64) + _GOLDEN)
        return _mix64(np.asarray(parent, dtype=np.uint64) * _GOLDEN + inner)


def _ragged_arange(lengths: np.ndarray) -> np.ndarray:
    """``concat(arange(n) for n in lengths)``."""
    total = int(lengths.sum())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(total, dtype=np.int64) - starts


def _list_parts(col: "pa.ChunkedArray | pa.Array") -> tuple[np.ndarray, np.ndarray]:
    import pyarrow as pa

    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    arr = arr.cast(pa.large_list(pa.uint64()))
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = np.asarray(arr.values, dtype=np.uint64)
    # Null lists have equal offsets, so they read as empty.
    return values, offsets


def reblock_table(table: "pa.Table", from_block_size: int, to_block_size: int) -> "pa.Table":
    """``table`` with ``block_hashes`` / ``output_block_hashes`` at ``to_block_size``.

    Raises:
        ConfigError: incompatible sizes, or a source list too short for its request.
    """
    import pyarrow as pa

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


# --------------------------------------------------------------------------- one request

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


def _kv_chain(src: np.ndarray, out: np.ndarray, input_len: int, output_len: int, f: int,
              t: int) -> tuple[np.ndarray, int, bool]:
    """The source chain a request's KV blocks split from: ``(chain, number of KV blocks,
    whether it runs on into the output)``, by ``reblock_request_hashes``'s rules."""
    chain, covered, with_output = src, input_len, False
    if out.size:
        joined = np.concatenate([src[: input_len // f], out])
        joined_covered = min(input_len + output_len, joined.size * f)
        if input_len <= joined_covered:  # else the reference falls back to the prompt alone
            chain, covered, with_output = joined, joined_covered, True
    n_target = covered // t
    if chain.size < -(-n_target // (f // t)):  # too few hashes: let the reference raise
        reblock_request_hashes([int(v) for v in src], [int(v) for v in out], input_len,
                               output_len, f, t)
        raise AssertionError("reblock_request_hashes accepted what reblock_arrays refuses")
    return chain, n_target, with_output


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
    if f <= 0 or t <= 0 or f % t:  # grouping (KV blocks > hash blocks) and errors: the reference
        prompt, output = reblock_request_hashes(
            [int(v) for v in src], [int(v) for v in out], input_len, output_len, f, t)
        return np.asarray(prompt, dtype=np.uint64), np.asarray(output, dtype=np.uint64)
    k = f // t
    chain, n_target, with_output = _kv_chain(src, out, input_len, output_len, f, t)
    whole = chain[:n_target].copy() if k == 1 else _split(chain, n_target, k)
    n_prompt = input_len // t
    return whole[:n_prompt], (whole[n_prompt:] if with_output else _EMPTY)


def reblock_ids(block_ids: np.ndarray, output_block_ids: np.ndarray, input_len: int,
                output_len: int, from_block_size: int,
                to_block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``reblock_arrays`` on dense hash *ids* (``int64``) instead of hashes.

    A split KV block's hash is a function of its source hash and its position ``j`` in
    it, so ``source id * k + j`` is a dense id of the KV hash: equal hashes, equal ids
    (up to 64-bit collisions of the split, which ids do not have). Only for
    ``from_block_size % to_block_size == 0``.
    """
    f, t = from_block_size, to_block_size
    assert f > 0 and t > 0 and f % t == 0, "reblock_ids splits; grouping needs hashes"
    return _split_id_ranges(block_ids, output_block_ids, input_len, output_len, f, t,
                            first_of=f // t)


def reblock_id_ranges(block_firsts: np.ndarray, output_block_firsts: np.ndarray,
                      input_len: int, output_len: int, from_block_size: int,
                      to_block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``reblock_ids`` where each source block owns a range of ``k`` consecutive ids
    starting anywhere: the inputs are each source block's first id, sub-block ``j`` gets
    ``first + j``. (``reblock_ids`` is the case ``first = source id * k``.) A replay that
    interns as it reads allocates such ranges and renumbers them later
    (``tuner.replay._stream``)."""
    f, t = from_block_size, to_block_size
    assert f > 0 and t > 0 and f % t == 0, "reblock_id_ranges splits; grouping needs hashes"
    return _split_id_ranges(block_firsts, output_block_firsts, input_len, output_len, f, t,
                            first_of=1)


def _split_id_ranges(sources: np.ndarray, output_sources: np.ndarray, input_len: int,
                     output_len: int, f: int, t: int, *,
                     first_of: int) -> tuple[np.ndarray, np.ndarray]:
    """The split shared by ``reblock_ids`` and ``reblock_id_ranges``: sub-block ``j`` of a
    source block gets ``source * first_of + j``.

    ``first_of`` is ``k`` when ``sources`` are dense source ids (``reblock_ids``) and 1 when
    they already are each range's first id (``reblock_id_ranges``); the two differ in
    nothing else. Callers check ``f % t == 0`` (``k = f // t``).
    """
    out = output_sources if len(output_sources) else _NO_IDS
    chain, n_target, with_output = _kv_chain(sources, out, input_len, output_len, f, t)
    return _split_chain(chain, n_target, with_output, input_len, f // t, t, first_of)


def reblock_joined_id_ranges(firsts: np.ndarray, num_prompt_sources: int, input_len: int,
                             output_len: int, from_block_size: int,
                             to_block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``reblock_id_ranges(firsts[:n], firsts[n:], ...)`` (``n = num_prompt_sources``) for
    a request whose prompt and output first ids are already one array, prompt first.

    Why: when the prompt's hashes are exactly its full hash blocks (``n == input_len //
    from_block_size``, the usual case), the chain its KV
    blocks split from (full prompt blocks, then the output) *is* ``firsts``; the
    two-array form concatenates them again, once per request as a trace is read
    (``tuner.replay._stream``). Other requests take the two-array form. The results may
    be views of ``firsts`` (block sizes that do not split).
    """
    f, t = from_block_size, to_block_size
    assert f > 0 and t > 0 and f % t == 0, "reblock_joined_id_ranges splits"
    n = num_prompt_sources
    if n == len(firsts) or n != input_len // f:
        return reblock_id_ranges(firsts[:n], firsts[n:], input_len, output_len, f, t)
    # _kv_chain's rule with joined = firsts: its chain unless it covers less than the
    # prompt, which cannot happen here (n whole prompt blocks plus at least one output
    # hash cover (n + 1) * f > input_len tokens), and it has enough hashes (n_target <=
    # len(firsts) * k).
    n_target = min(input_len + output_len, len(firsts) * f) // t
    return _split_chain(firsts, n_target, True, input_len, f // t, t, 1)


def _split_chain(chain: np.ndarray, n_target: int, with_output: bool, input_len: int,
                 k: int, t: int, first_of: int) -> tuple[np.ndarray, np.ndarray]:
    """KV block ``j`` of the source ``chain`` is ``chain[j // k] * first_of + j % k``
    (``n_target`` of them), cut into prompt and output (``_kv_chain``'s results)."""
    if k == 1:
        whole = chain[:n_target]
    else:
        n_src = -(-n_target // k)
        firsts = chain[:n_src] * first_of if first_of != 1 else chain[:n_src]
        # Each first repeated k times, plus 0..k-1 repeated (a cached pattern) in place:
        # two contiguous passes. The broadcast add (firsts as a column + 0..k-1) this
        # replaced runs numpy's inner loop over k = 4 elements at a time: 24 us against
        # 11 us on a ~3,000-block agentic prompt (760 sources, timeit at load average ~8;
        # 1.6 against 4.9 us at 100 sources); the tile this pattern replaces was a fresh
        # array every call.
        whole = firsts.repeat(k)
        np.add(whole, _sub_block_offsets(k, len(whole), whole.dtype), out=whole)
        whole = whole[:n_target]
    n_prompt = input_len // t
    return whole[:n_prompt], (whole[n_prompt:] if with_output else _NO_IDS)


_NO_IDS = np.zeros(0, dtype=np.int64)
_SUB_BLOCK_OFFSETS: dict[tuple[int, np.dtype], np.ndarray] = {}


def _sub_block_offsets(k: int, n: int, dtype: np.dtype) -> np.ndarray:
    """``0, 1, .., k-1`` repeated over ``n`` entries in the ids' own ``dtype`` (a view of a
    cached array, grown by doubling, never written). The dtype matters: ids read from a
    trace's Parquet column are uint64, and uint64 + int64 is float64 in numpy, which the
    in-place add refuses (and an out-of-place one would turn the ids into floats)."""
    offsets = _SUB_BLOCK_OFFSETS.get((k, dtype))
    if offsets is None or len(offsets) < n:
        reps = max(-(-n // k), 2 * (len(offsets) // k if offsets is not None else 1024))
        offsets = _SUB_BLOCK_OFFSETS[k, dtype] = np.tile(np.arange(k, dtype=dtype), reps)
        offsets.flags.writeable = False
    return offsets[:n]


# --------------------------------------------------------------------------- many requests

@dataclass(frozen=True)
class SourceChains:
    """Where many requests' KV blocks come from, by ``reblock_request_hashes``'s rules:
    each request's *source chain* is its prompt hashes, or its full prompt blocks and
    then its output hashes (when those cover the prompt), and its KV block ``j`` is
    sub-block ``j % k`` of chain element ``j // k``."""

    prompt_starts: np.ndarray  # where each row's prompt hashes start in the values
    output_starts: np.ndarray  # where each row's output hashes start in the values
    chain_prompt: np.ndarray  # chain elements taken from the prompt (the rest: output)
    n_target: np.ndarray  # KV blocks (prompt and output) of each row
    n_sources: np.ndarray  # chain elements they use: ceil(n_target / k)

    def positions(self, rows: np.ndarray, starts: np.ndarray,
                  counts: np.ndarray) -> np.ndarray:
        """Indices into the values of chain elements ``starts[i] .. + counts[i]`` of row
        ``rows[i]``, row after row."""
        pos = _ragged_arange(counts) + np.repeat(starts, counts)
        owner = np.repeat(rows, counts)
        cp = self.chain_prompt[owner]
        return np.where(pos < cp, self.prompt_starts[owner] + pos,
                        self.output_starts[owner] + (pos - cp))


def source_chains(values: np.ndarray, prompt_starts: np.ndarray, prompt_counts: np.ndarray,
                  output_starts: np.ndarray, output_counts: np.ndarray,
                  input_lens: np.ndarray, output_lens: np.ndarray, from_block_size: int,
                  to_block_size: int) -> SourceChains:
    """The :class:`SourceChains` of rows whose hashes lie in ``values`` (row ``i``'s prompt
    ``values[prompt_starts[i]:][:prompt_counts[i]]``, its output likewise), for a split
    (``from_block_size % to_block_size == 0``).

    Raises:
        ConfigError: as the reference, for the first row with too few source hashes.
    """
    f, t = from_block_size, to_block_size
    assert f > 0 and t > 0 and f % t == 0, "source chains split; grouping needs hashes"
    k = f // t
    p_count = np.asarray(prompt_counts, dtype=np.int64)
    o_count = np.asarray(output_counts, dtype=np.int64)
    L = np.asarray(input_lens, dtype=np.int64)
    full_prompt = np.minimum(L // f, p_count)
    joined_size = full_prompt + o_count
    joined_covered = np.minimum(L + np.asarray(output_lens, dtype=np.int64), joined_size * f)
    joined = (o_count > 0) & (L <= joined_covered)  # else: the prompt alone (reference)
    n_target = np.where(joined, joined_covered, L) // t
    n_sources = -(-n_target // k)
    short = np.where(joined, joined_size, p_count) < n_sources
    if short.any():
        i = int(np.argmax(short))
        p0, o0 = int(prompt_starts[i]), int(output_starts[i])
        _kv_chain(values[p0:p0 + p_count[i]], values[o0:o0 + o_count[i]], int(L[i]),
                  int(output_lens[i]), f, t)  # raises the reference's error
        raise AssertionError("source_chains refused what the reference accepts")
    return SourceChains(np.asarray(prompt_starts, dtype=np.int64),
                        np.asarray(output_starts, dtype=np.int64),
                        np.where(joined, full_prompt, p_count), n_target, n_sources)
