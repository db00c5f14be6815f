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

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tuner.trace.schema import SCHEMA

__all__ = ["FrameRows", "RowReader", "StoredFile", "file_batches", "null_mask", "numbers"]


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


class RowReader:
    """``columns`` of a trace's files by storage-row range, read forward through pyarrow.

    Why: the replay's stream reads the hash columns a range of storage rows at a time
    (``tuner.replay._stream.CHUNK_ROWS``), in increasing order for every trace measured
    (a range is read when its first request is issued). Through polars that was a sliced
    scan a range and ``import polars`` (0.15-0.2 CPU s) in every replay process; here one
    record batch reader (:func:`file_batches`, ``batch_rows`` rows a batch) stays open
    across ranges, so each page is decoded once. Measured (docs/performance.md, load32
    round): 15-19 % less replay CPU on the Mooncake sample; neutral on the agentic hour,
    whose 13.3 M hashes pyarrow decodes with more system time (fresh pages) than polars,
    about what the import saves. A range that starts before the reader's
    position reopens the files from the one holding its first row and skips the rows
    before it (decoded and dropped): correct in any order, slower only there.

    Rows past a range's end that the last batch holds are kept for the next range (a
    directory's files need not be multiples of ``batch_rows``); with one file and ranges
    of ``batch_rows`` rows none are.
    """

    def __init__(self, files: Sequence[StoredFile], columns: Sequence[str],
                 batch_rows: int) -> None:
        self._files = list(files)
        self._columns = list(columns)
        self._batch_rows = batch_rows
        starts = [0]
        for stored in self._files:
            starts.append(starts[-1] + pq.ParquetFile(stored.path).metadata.num_rows)
        self._starts = starts  # storage row of each file's first row (and the end)
        self._batches: Iterator[pa.RecordBatch] | None = None
        self._held: pa.RecordBatch | None = None  # read, not yet served: rows from _at
        self._at = 0  # storage row of the next row served (``_held``'s first)

    def read(self, start: int, stop: int) -> pa.Table:
        """Storage rows ``start .. stop - 1`` (fewer at the end of the trace)."""
        if self._batches is None or start < self._at:
            first = max(bisect.bisect_right(self._starts, start) - 1, 0)
            first = min(first, len(self._files))
            self._batches = file_batches(self._files[first:], self._columns, self._batch_rows)
            self._held, self._at = None, self._starts[first]
        parts: list[pa.RecordBatch] = []
        while self._at < stop:
            batch = self._held if self._held is not None else next(self._batches, None)
            self._held = None
            if batch is None:
                break
            end = self._at + batch.num_rows
            if end <= start:  # before the range: dropped
                self._at = end
                continue
            lo = max(start - self._at, 0)
            hi = min(stop, end) - self._at
            parts.append(batch.slice(lo, hi - lo))
            if end > stop:
                self._held = batch.slice(hi)
                self._at = stop
                break
            self._at = end
        if not parts:
            return _empty_table(self._columns)
        return pa.Table.from_batches(parts)


class FrameRows:
    """:class:`RowReader`'s interface over a polars frame (a trace not read from files:
    in memory, sliced, re-blocked); ``frame`` is a ``polars.LazyFrame``."""

    def __init__(self, frame: Any, columns: Sequence[str]) -> None:
        self._frame = frame
        self._columns = list(columns)

    def read(self, start: int, stop: int) -> pa.Table:
        return self._frame.slice(start, stop - start).select(self._columns).collect().to_arrow()


def _empty_table(columns: Sequence[str]) -> pa.Table:
    return pa.table({name: pa.array([], SCHEMA.field(name).type) for name in columns})


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
