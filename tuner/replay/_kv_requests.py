"""Trace requests with KV-block hashes as numpy arrays: the memory-light path to the twin.

Why: an agentic hour at 14 requests/s holds 50,164 prompts of 49k tokens on average.
Re-blocked from 64- to 16-token blocks that is 155 million hashes; as Python ints in tuples (36-byte
int objects plus 8-byte pointers) about 6.8 GB, and the plain-Python re-blocking loop
spends minutes of CPU on it. Here the hashes stay ``uint64`` arrays (8 bytes each,
1.2 GB for that hour) computed with vectorised numpy, and the twin turns one request's
array into a list only when the request arrives (``SimRequest`` accepts anything with
``tolist()``) and drops it when the request finishes.

The arithmetic is :func:`tuner.trace.reblock.reblock_request_hashes`'s, bit for bit, done
by :func:`tuner.trace.reblock_vec.reblock_arrays` (the numpy re-blocking ``Trace.reblocked``
uses too; tests/replay/test_kv_requests.py checks it against the reference on random inputs).

Only backends that declare ``Backend.accepts_array_hashes`` get these arrays; the others
get the tuple form from :func:`tuner.replay.reblock_request`.

Public through :mod:`tuner.replay`: :class:`InternedRequests` (what
:func:`tuner.replay.intern_requests` returns) and :func:`dense_hash_ids` (the numbering,
for a caller that derives its own ids from it).
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import numpy as np

import tuner
from tuner.replay._shared_prompts import shared_prompt_ids
from tuner.trace.reblock_vec import reblock_arrays
from tuner.trace.request import TraceRequest


class InternedRequests(list):
    """Requests whose hashes are dense hash ids (``tuner.sim.hash_ids``) below
    ``num_hash_ids``, at ``block_size`` tokens per block: what the twin indexes its prefix
    cache with. Slice with :meth:`window` to keep both (a plain slice is a plain list).

    Loaded already: ``tuner.replay.intern_requests`` returns such a list at its own block
    size as it is, so ``run``/``prepare`` replay it without a second load or interning and
    a caller interns a trace once and replays windows of it."""

    num_hash_ids: int = 0
    block_size: int = 0

    def window(self, start: int | None = None, stop: int | None = None) -> "InternedRequests":
        out = InternedRequests(self[start:stop])
        out.num_hash_ids, out.block_size = self.num_hash_ids, self.block_size
        return out


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


def kv_request_ids(requests: list[Any], from_block_size: int | None,
                   to_block_size: int) -> InternedRequests:
    """``kv_requests`` with every hash replaced by a dense id, interned once per trace.

    Why here and at the trace's block size: interning is a sort of the hashes (polars'
    dense rank, ~1 s per 13 M hashes on one core); splitting multiplies the hashes by
    ``from / to`` (4x for 64-token trace blocks and 16-token KV blocks), and a split
    block's id follows from its source id (``reblock_ids``). A split interns each
    session's longest prompt once and shares its ids with the session's prompts that are
    its prefix (``tuner.replay._shared_prompts``: the agentic hour's 13 M prompt hashes
    intern as ~1 M). Grouping (KV blocks larger than the trace's) re-blocks the hashes
    first and interns the result.
    """
    f = to_block_size if from_block_size is None else from_block_size
    t = to_block_size
    split = f > 0 and t > 0 and f % t == 0
    sources = requests if split else kv_requests(requests, f, t)
    prompts = [np.asarray(r.block_hashes, dtype=np.uint64) for r in sources]
    outputs = [np.asarray(r.output_block_hashes if r.output_block_hashes is not None else (),
                          dtype=np.uint64) for r in sources]
    p_count = np.fromiter(map(len, prompts), dtype=np.int64, count=len(prompts))
    o_count = np.fromiter(map(len, outputs), dtype=np.int64, count=len(outputs))
    values = np.concatenate(prompts + outputs) if sources else np.zeros(0, np.uint64)
    del prompts, outputs
    p_start = np.cumsum(p_count) - p_count
    o_start = int(p_count.sum()) + np.cumsum(o_count) - o_count
    if split:  # a session's prompts share their longest prompt's ids (_shared_prompts)
        input_lens = np.fromiter((int(r.input_len) for r in sources), np.int64, len(sources))
        output_lens = np.fromiter((int(r.output_len) for r in sources), np.int64, len(sources))
        prompt_ids, output_ids, num_ids = shared_prompt_ids(
            values, p_start, p_count, o_start, o_count, input_lens, output_lens,
            _session_codes(sources), f, t, dense_hash_ids)
    else:
        ids, num_ids = dense_hash_ids(values)
        prompt_ids = [ids[a:a + n] for a, n in zip(p_start.tolist(), p_count.tolist())]
        output_ids = [ids[a:a + n] for a, n in zip(o_start.tolist(), o_count.tolist())]
    del values
    out = InternedRequests(map(_with_hashes, sources, prompt_ids, output_ids))
    out.num_hash_ids = num_ids
    out.block_size = t
    return out


_FIELDS = tuple(f.name for f in dataclasses.fields(TraceRequest))
_HASH_FIELDS = (_FIELDS.index("block_hashes"), _FIELDS.index("output_block_hashes"))
_TRACE_FIELDS = operator.attrgetter(*_FIELDS)


def _with_hashes(request: Any, prompt: np.ndarray, output: np.ndarray) -> Any:
    """``dataclasses.replace(request, block_hashes=prompt, output_block_hashes=output)``;
    a ``TraceRequest`` built from its fields directly (``replace`` reads the class's
    fields on every call: 0.7 s of the agentic hour's 17,594 requests)."""
    if type(request) is not TraceRequest:
        return dataclasses.replace(request, block_hashes=prompt, output_block_hashes=output)
    values = list(_TRACE_FIELDS(request))
    values[_HASH_FIELDS[0]], values[_HASH_FIELDS[1]] = prompt, output
    return TraceRequest(*values)


def _session_codes(requests: list[Any]) -> np.ndarray:
    """An integer a session (``-1``: none), in the requests' order."""
    codes: dict[Any, int] = {}
    keys = (getattr(r, "session_id", None) for r in requests)
    return np.fromiter((-1 if key is None else codes.setdefault(key, len(codes)) for key in keys),
                       np.int64, len(requests))


#: Below this many values :func:`dense_hash_ids` ranks in numpy (see there).
NUMPY_RANK_MAX = 1 << 22


def dense_hash_ids(values: np.ndarray) -> tuple[np.ndarray, int]:
    """``values`` renamed to ``0 .. distinct - 1`` in sorted order (equal value, equal id)
    as ``int64``.

    Two ways to the same ids. numpy (an argsort, the sorted run's new-value flags summed,
    scattered back) below :data:`NUMPY_RANK_MAX` values: a replay window's ~60k-780k
    hashes and a tuning load's ~1.9 M (the agentic hour's, shared prompts interned once)
    rank as fast there as in polars on one core (80 against 84 ms for the 1.9 M), and a
    replay or a tune that ranks nothing larger never imports polars (0.15-0.2 CPU s a
    process; docs/performance.md, load32 round). polars' dense rank above it (13 M
    hashes: 1.0 against 1.7-2.0 CPU s), except in a forked child: polars must not run
    there (its thread pool does not survive ``fork``; the child hangs), and tuning
    workers are forked.
    """
    if not len(values):
        return np.zeros(0, dtype=np.int64), 0
    if len(values) < NUMPY_RANK_MAX or tuner.IN_FORKED_CHILD:
        order = np.argsort(values)
        ordered = values[order]
        new = np.empty(len(values), dtype=bool)
        new[0] = True
        np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
        del ordered
        ranks = np.cumsum(new, dtype=np.int64)
        del new
        ranks -= 1
        ids = np.empty(len(values), dtype=np.int64)
        ids[order] = ranks
        return ids, int(ranks[-1]) + 1
    import polars as pl

    ids = pl.Series(values).rank("dense").to_numpy().astype(np.int64)  # 1-based
    ids -= 1  # in place: a whole trace's ids are ~100 MB
    return ids, int(ids.max()) + 1


def flat_hash_column(df: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A list-of-hash column of ``df`` (a polars DataFrame or a pyarrow Table) as
    ``(values, offsets)``: one flat ``uint64`` array and the ``int64`` row offsets into it,
    row ``i`` being ``values[offsets[i]:offsets[i + 1]]`` (:func:`flat_hash_array`)."""
    import pyarrow as pa

    return flat_hash_array(df.column(name) if isinstance(df, pa.Table)
                           else df.get_column(name).to_arrow())


def flat_hash_array(arr: Any) -> tuple[np.ndarray, np.ndarray]:
    """A list-of-hash Arrow array as ``(values, offsets)`` (see :func:`flat_hash_column`).

    Why: slicing one flat array per request costs no Python ints; nulls read as empty
    lists, and a sliced array's offsets are rebased to start at 0. Shared by the
    whole-trace load here and the chunked reader of ``tuner.replay._stream``. The arrays
    are views of the Arrow buffers (``np.frombuffer``): pyarrow's own conversions
    (``np.asarray`` of an array, ``pa.scalar`` of a list) import pandas, 0.4-0.6 CPU s
    of every trace load that nothing else needs. The canonical type (a list of
    ``uint64``) is read from its buffers as it is; only another type is cast (a checked
    cast: a negative hash is refused as before).
    """
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if not ((pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type))
            and arr.type.value_type == pa.uint64()):
        arr = arr.cast(pa.large_list(pa.uint64()))
    n = len(arr)
    offset_type = np.int64 if pa.types.is_large_list(arr.type) else np.int32
    offsets = np.frombuffer(arr.buffers()[1], dtype=offset_type)[arr.offset:arr.offset + n + 1]
    offsets = offsets.astype(np.int64)  # a copy: rebased below, and the int32 form widened
    child = arr.values
    value_buf = arr.buffers()[3]
    if value_buf is None or not len(child) or offsets[-1] == offsets[0]:
        return np.zeros(0, dtype=np.uint64), np.zeros(n + 1, dtype=np.int64)
    values = np.frombuffer(value_buf, dtype=np.uint64)[child.offset:child.offset + len(child)]
    values = values[offsets[0]:offsets[-1]]
    offsets -= offsets[0]
    if arr.null_count:
        from tuner.trace.batches import null_mask

        null = null_mask(arr)
        lengths = np.diff(offsets)
        if lengths[null].any():  # a null row spanning values (Arrow allows it): dropped
            values = values[np.repeat(~null, lengths)]
            lengths[null] = 0
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return values, offsets


def load_trace_arrays(trace: Any) -> list[Any]:
    """A ``Trace``'s requests in arrival order with hashes as views into flat arrays.

    Avoids ``Trace.requests()``'s Python int tuples: one flat ``uint64`` array per list
    column, sliced per request without copying. The frame is read in storage order and
    put in arrival order here (a stable sort: ties keep storage order, as
    ``Trace.lazy``), so the hash columns are never reordered (a session-grouped trace's
    sorted read copies all of them).

    Through polars, not pyarrow's reader: a whole trace's hashes decoded by pyarrow
    (one flat array, the agentic hour's 107 MB) cost 0.5-1.1 CPU s against polars'
    0.34 with its import, most of it system time in fresh pages (docs/performance.md,
    load32 round).
    """
    df = trace.stored().collect()
    pv, po = flat_hash_column(df, "block_hashes")
    ov, oo = flat_hash_column(df, "output_block_hashes")
    order = np.argsort(df.get_column("arrival_s").to_numpy(), kind="stable").tolist()
    cols = {name: df.get_column(name).to_list() for name in (
        "request_id", "arrival_s", "input_len", "output_len", "session_id", "parent_id", "turn",
        "priority", "cache_salt", "model", "status")}
    del df
    po_l, oo_l = po.tolist(), oo.tolist()
    ids, arrivals, inputs, outputs = (cols["request_id"], cols["arrival_s"], cols["input_len"],
                                      cols["output_len"])
    sessions, parents, turns, priorities = (cols["session_id"], cols["parent_id"], cols["turn"],
                                            cols["priority"])
    salts, models, statuses = cols["cache_salt"], cols["model"], cols["status"]
    return [TraceRequest(ids[i], arrivals[i], inputs[i], outputs[i],
                         pv[po_l[i]:po_l[i + 1]], ov[oo_l[i]:oo_l[i + 1]],  # type: ignore[arg-type]
                         sessions[i], parents[i], turns[i], priorities[i] or 0, salts[i],
                         models[i], statuses[i])
            for i in order]

