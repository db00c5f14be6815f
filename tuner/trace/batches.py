"""A trace's files read a record batch at a time through pyarrow, without polars.

Why: a replay packs a whole trace's small columns (ids, arrivals, lengths) into arrays of
its own before its first step. Collected through polars (and ``check_columns``' read
converted through it), a synthetic day's 285k requests left the process ~60 MiB larger
than its six hours' 71k, most of it freed buffers that polars' allocator keeps, not
live data (docs/performance.md, fourth memory round). Read here, a batch at a time and
on the calling thread (no reader threads, whose allocator arenas would stay too), a
batch's buffers are released as soon as its values are copied out.

Nothing here passes a Python scalar or a numpy array to pyarrow's compute functions:
that imports pandas (0.4-0.6 CPU s of every trace load that nothing else needs), so
shifts and null fills are done by the caller in numpy, on the buffers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tuner.trace.schema import SCHEMA

__all__ = ["StoredFile", "file_batches", "null_mask", "numbers"]


@dataclass(frozen=True)
class StoredFile:
    """One Parquet file of a trace, and what ``read_trace`` adds to its ``arrival_s``
    (a directory's files are shifted onto the earliest file's origin)."""

    path: Path
    shift_s: float = 0.0


def file_batches(files: Sequence[StoredFile], columns: Sequence[str],
                 batch_rows: int) -> Iterator[pa.RecordBatch]:
    """``columns`` of ``files``, in file and row order, as record batches of at most
    ``batch_rows`` rows: a column a file lacks reads as nulls of the canonical type (as
    ``read_trace``'s scan fills it), ``arrival_s`` comes shifted by the file's
    ``shift_s``."""
    for stored in files:
        pf = pq.ParquetFile(stored.path, pre_buffer=False)
        present = set(pf.schema_arrow.names)
        read = [c for c in columns if c in present]
        for batch in pf.iter_batches(batch_size=batch_rows, columns=read, use_threads=False):
            arrays = []
            for name in columns:
                if name not in present:
                    arrays.append(pa.nulls(batch.num_rows, SCHEMA.field(name).type))
                elif name == "arrival_s" and stored.shift_s:
                    arrays.append(_shifted(batch.column(name), stored.shift_s))
                else:
                    arrays.append(batch.column(name))
            yield pa.RecordBatch.from_arrays(arrays, names=list(columns))


def _shifted(column: pa.Array, shift_s: float) -> pa.Array:
    """``column + shift_s`` as float64 (nulls kept), the addition ``read_trace``'s polars
    scan does."""
    values = numbers(column, np.float64) + shift_s
    valid = (pa.py_buffer(np.packbits(~null_mask(column), bitorder="little"))
             if column.null_count else None)
    return pa.Array.from_buffers(pa.float64(), len(values), [valid, pa.py_buffer(values)],
                                 column.null_count)


def numbers(column: pa.Array | pa.ChunkedArray, dtype: type[np.generic]) -> np.ndarray:
    """A numeric column's values as a new numpy array of ``dtype`` (nulls read as 0).

    The cast is pyarrow's checked one: a value ``dtype`` cannot hold raises
    ``pyarrow.ArrowInvalid`` instead of wrapping."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    arrow_type = pa.from_numpy_dtype(np.dtype(dtype))
    if column.type != arrow_type:
        column = column.cast(arrow_type)
    n = len(column)
    if not n:
        return np.zeros(0, dtype=dtype)
    values = np.frombuffer(column.buffers()[1], dtype=dtype)[column.offset:column.offset + n]
    values = values.copy()
    if column.null_count:
        values[null_mask(column)] = 0
    return values


def null_mask(column: pa.Array) -> np.ndarray:
    """True where ``column`` is null, as a numpy bool array (from its validity bitmap)."""
    n = len(column)
    if not column.null_count:
        return np.zeros(n, dtype=bool)
    if column.buffers()[0] is None:  # a null-typed column
        return np.ones(n, dtype=bool)
    bits = np.unpackbits(np.frombuffer(column.buffers()[0], dtype=np.uint8),
                         bitorder="little")
    return bits[column.offset:column.offset + n] == 0
