"""Per-request records as chunks of numpy columns: what the metrics read at scale.

Why: a replay of a production day holds hundreds of thousands of requests. Its table
(``tuner.records.RequestTable``) is already columnar (~53 bytes a row), but reading it row
by row builds a ``RequestResult`` per request (~200 bytes each, plus the lists of them
every consumer built): the summary, the ``--out`` Parquet writer and the report each held
the whole replay as Python objects at once. :func:`record_chunks` hands the same records
over as :class:`RecordChunk`\\ s of at most ``CHUNK_ROWS`` consecutive rows (trace order),
numpy views of the table's own buffers where it has them (no copy; its int32 counts
widened a chunk at a time), so a consumer keeps
only what it needs (a float an element for percentiles, running sums for the rest). The
``--out`` writer (``tuner.metrics.parquet``) writes a row group a chunk; the report reads
the file back a row group at a time (``tuner.report.replay_report``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.records import RequestResult, RequestTable

__all__ = ["CHUNK_ROWS", "STATUS_NAMES", "RecordChunk", "record_chunks"]

#: Rows a chunk (and a row group of the records file): 512 KiB a float column.
CHUNK_ROWS = 65_536
#: Status codes of ``RecordChunk.status`` (the order ``RequestTable`` stores them in).
STATUS_NAMES: tuple[str, ...] = ("finished", "rejected", "aborted", "unfinished", "error")
FINISHED, REJECTED = 0, 1
_CODE = {name: i for i, name in enumerate(STATUS_NAMES)}


@dataclass(frozen=True, slots=True)
class RecordChunk:
    """Consecutive request records (trace positions ``start .. start + len - 1``) as
    columns; times in seconds on the replay clock, nan where a record has none."""

    start: int  # trace position of the first row
    arrival_s: np.ndarray  # float64
    first_scheduled_s: np.ndarray  # float64, nan if never admitted
    first_token_s: np.ndarray  # float64, nan if no token
    finish_s: np.ndarray  # float64, nan if not finished
    input_len: np.ndarray  # int64, prompt tokens
    output_len: np.ndarray  # int64, tokens generated
    num_cached_tokens: np.ndarray  # int64, prefix-cache hit at first admission (tokens)
    num_preemptions: np.ndarray  # int64
    status: np.ndarray  # uint8 codes into STATUS_NAMES
    engine: np.ndarray  # int64, replica * dp + rank (-1: refused before routing)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def ttft_s(self) -> np.ndarray:
        """``first_token_s - arrival_s`` (``RequestResult.ttft_s``)."""
        return self.first_token_s - self.arrival_s

    @property
    def mean_itl_s(self) -> np.ndarray:
        """``RequestResult.mean_itl_s``: (finish - first token) / (output tokens - 1),
        nan with fewer than 2 tokens (the same IEEE division, element by element)."""
        out = np.full(len(self), np.nan)
        many = self.output_len >= 2
        out[many] = ((self.finish_s[many] - self.first_token_s[many])
                     / (self.output_len[many] - 1))
        return out


def _view(column: Any, start: int, stop: int, dtype: Any) -> np.ndarray:
    """Rows ``start .. stop`` of an ``array.array`` (or a sequence) as numpy ``dtype``: a
    view of the buffer where its items are ``dtype`` already, else one chunk widened (the
    table's int32 counts: ``RequestTable``), so every consumer reads int64 as before."""
    if hasattr(column, "typecode"):
        view = np.frombuffer(memoryview(column)[start:stop],
                             dtype=np.dtype(column.typecode))
        return view if view.dtype == dtype else view.astype(dtype)
    return np.asarray(column[start:stop], dtype=dtype)


def _table_chunk(table: RequestTable, start: int, stop: int, engine: Any) -> RecordChunk:
    return RecordChunk(
        start=start, arrival_s=_view(table.arrival_s, start, stop, np.float64),
        first_scheduled_s=_view(table.first_scheduled_s, start, stop, np.float64),
        first_token_s=_view(table.first_token_s, start, stop, np.float64),
        finish_s=_view(table.finish_s, start, stop, np.float64),
        input_len=_view(table.input_len, start, stop, np.int64),
        output_len=_view(table.output_len, start, stop, np.int64),
        num_cached_tokens=_view(table.num_cached_tokens, start, stop, np.int64),
        num_preemptions=_view(table.num_preemptions, start, stop, np.int64),
        status=np.frombuffer(memoryview(table.status)[start:stop], dtype=np.uint8),
        engine=(_view(engine, start, stop, np.int32).astype(np.int64) if engine is not None
                else np.zeros(stop - start, dtype=np.int64)))


def _rows_chunk(rows: Sequence[RequestResult], start: int, engine: Any) -> RecordChunk:
    def col(name: str, dtype: Any) -> np.ndarray:
        return np.array([getattr(r, name) for r in rows], dtype=dtype)

    n = len(rows)
    return RecordChunk(
        start=start, arrival_s=col("arrival_s", np.float64),
        first_scheduled_s=col("first_scheduled_s", np.float64),
        first_token_s=col("first_token_s", np.float64), finish_s=col("finish_s", np.float64),
        input_len=col("input_len", np.int64), output_len=col("output_len", np.int64),
        num_cached_tokens=col("num_cached_tokens", np.int64),
        num_preemptions=col("num_preemptions", np.int64),
        status=np.array([_CODE[r.status] for r in rows], dtype=np.uint8),
        engine=(np.asarray(engine[start:start + n], dtype=np.int64) if engine is not None
                else np.zeros(n, dtype=np.int64)))


def record_chunks(requests: Sequence[RequestResult], *,
                  rows: int = CHUNK_ROWS) -> Iterator[RecordChunk]:
    """``requests`` (a ``ReplayResult.requests``) as chunks of at most ``rows`` records in
    order: views of a ``RequestTable``'s columns, or columns built from ``rows`` records
    of a plain sequence at a time. An ``engine`` column is read where the sequence has one
    (a fleet's table), else 0."""
    engine = getattr(requests, "engine", None)
    n = len(requests)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        if isinstance(requests, RequestTable):
            yield _table_chunk(requests, start, stop, engine)
        else:
            yield _rows_chunk(requests[start:stop], start, engine)
