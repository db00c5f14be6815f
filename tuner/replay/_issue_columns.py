"""A trace's per-request columns in issue order, packed: what the stream keeps of every
request for the whole replay (``tuner.replay._stream.TraceArrivals``).

Why a module: these columns are the part of a replay's memory that grows with the trace's
length before its first step, so how they are read and how wide they are is the lever
on a long day's peak (docs/performance.md, fourth memory round). They are read a record
batch at a time (``Trace.stored_batches``: through pyarrow for a trace read from files,
without polars, whose allocator kept ~40 MB of a synthetic day's collected metadata
resident for the whole replay), copied into narrow numpy arrays a batch at a time, and
put in issue order (arrival, ties in storage order: ``Trace.lazy``'s stable sort) once.

Widths: lengths and priorities are int32 (the trace schema's type; lengths are bounded
by ``MAX_TOKENS`` = 2**24 and refused beyond it at read), the storage row int32 below
2**31 requests; arrivals stay float64 (the times decisions are made on).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from tuner.errors import ConfigError
from tuner.records import StringColumn
from tuner.trace.batches import null_mask, numbers

__all__ = ["IssueColumns", "read_issue_columns"]

_COLUMNS = ("request_id", "arrival_s", "input_len", "output_len", "session_id", "priority")


@dataclass(frozen=True)
class IssueColumns:
    """Every request's identity and shape, position ``i`` being the ``i``-th issued.

    ``rows[i]`` is its storage row (where its hashes are read); ids and sessions are
    packed UTF-8 (``StringColumn``); ``arrivals`` float64, the rest int32 (``array``:
    indexed one request at a time as Python numbers, no numpy scalar a read)."""

    rows: np.ndarray
    request_ids: StringColumn
    session_ids: StringColumn
    arrivals: array
    input_lens: array
    output_lens: array
    priorities: array

    def __len__(self) -> int:
        return len(self.rows)


def read_issue_columns(trace: Any) -> IssueColumns:
    """The issue-order columns of ``trace`` (a ``tuner.trace.Trace``).

    Raises:
        ConfigError: the trace has no requests.
    """
    # Preallocated (the metadata's row count) and filled a batch at a time: per-batch
    # parts joined at the end left the heap fragmented by the reader's freed buffers.
    size = len(trace)
    numeric = {"arrival_s": np.empty(size, dtype=np.float64),
               "input_len": np.empty(size, dtype=np.int32),
               "output_len": np.empty(size, dtype=np.int32),
               "priority": np.empty(size, dtype=np.int32)}
    strings: dict[str, list[pa.Array]] = {"request_id": [], "session_id": []}
    n = 0
    for batch in trace.stored_batches(_COLUMNS):  # a Parquet row group a batch
        end = n + batch.num_rows
        for name, values in numeric.items():
            if end > len(values):  # more rows than the metadata said: grow
                values = numeric[name] = np.concatenate(
                    [values, np.empty(max(end, 2 * len(values)) - len(values), values.dtype)])
            values[n:end] = numbers(batch.column(name), values.dtype.type)
        for name, pieces in strings.items():
            pieces.append(batch.column(name).cast(pa.large_string()))
        n = end
        del batch
    if not n:
        raise ConfigError("the trace has no requests to replay")
    arrivals = numeric.pop("arrival_s")[:n]
    order = np.argsort(arrivals, kind="stable")
    rows = order.astype(np.int32) if n < 2**31 else order

    def packed(name: str, typecode: str) -> array:
        return array(typecode, numeric.pop(name)[:n][order].tobytes())

    columns = IssueColumns(
        rows=rows,
        request_ids=_gathered(strings.pop("request_id"), order),
        session_ids=_gathered(strings.pop("session_id"), order),
        arrivals=array("d", arrivals[order].tobytes()),
        input_lens=packed("input_len", "i"),
        output_lens=packed("output_len", "i"),
        priorities=packed("priority", "i"))
    # The reader's and the gather's buffers are freed into Arrow's pool (mimalloc), which
    # keeps them: ~60 MB for a synthetic day, handed back here.
    pa.default_memory_pool().release_unused()
    return columns


def _gathered(pieces: list[pa.Array], order: np.ndarray) -> StringColumn:
    """The strings of ``pieces`` (one column's batches, large_string) in ``order``, packed.

    The gather is Arrow's ``take``, its index built from the buffer (``pa.array`` of a
    numpy array imports pandas)."""
    index = pa.Array.from_buffers(pa.int64(), len(order),
                                  [None, pa.py_buffer(order.astype(np.int64, copy=False))])
    arr = pa.chunked_array(pieces, type=pa.large_string()).take(index).combine_chunks()
    pieces.clear()
    _, offsets_buffer, data = arr.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[arr.offset:arr.offset + len(arr) + 1]
    raw = b"" if data is None else data.to_pybytes()[offsets[0]:offsets[-1]]
    null = null_mask(arr).astype(np.uint8).tobytes() if arr.null_count else None
    return StringColumn(raw, (offsets - offsets[0]).tobytes(), null)
