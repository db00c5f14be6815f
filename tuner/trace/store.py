"""Reading and writing canonical traces: the :class:`Trace` handle and :class:`TraceWriter`.

A trace is one Parquet file or a directory of them (any depth, e.g. hive-partitioned by
date and appended by periodic ingest). Files are written to a temporary name in the
target directory and renamed into place on success, so a crash or an error never leaves a
half-written trace behind.

polars is imported where a method needs it, not with this module: a replay reads a trace
read from files through pyarrow only (``Trace.stored_batches``, ``Trace.row_reader``), and
``import polars`` was 0.15-0.2 CPU s of every fresh replay process (docs/performance.md,
load32 round). A file trace's polars scan is built on first use (``Trace._frame``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tuner.errors import TraceSchemaError
from tuner.outputs import AtomicOutput
from tuner.trace.batches import FrameRows, RowReader, StoredFile, file_batches
from tuner.trace.column_checks import check_columns
from tuner.trace.request import TRACE_COLUMNS, TraceRequest
from tuner.trace.schema import (
    MAX_SPAN_S,
    METADATA_KEY,
    REQUIRED_COLUMNS,
    ROW_GROUP_SIZE,
    SCHEMA,
    TraceMetadata,
    requests_to_table,
)

if TYPE_CHECKING:
    import polars as pl


class TraceWriter:
    """Streams record batches into one zstd Parquet trace file, atomically.

    Lifecycle: ``with TraceWriter(path, metadata) as w: w.write(batch) ...``. On a clean
    exit the file gets its final ``num_rows`` and is renamed to ``path``; on an exception
    the temporary file is deleted and ``path`` is untouched. The output is checked and
    written by :class:`tuner.outputs.AtomicOutput`: ``inputs`` (the files the rows come
    from) are refused as the output, so are folders and devices.
    """

    def __init__(self, path: str | os.PathLike[str], metadata: TraceMetadata, *,
                 compression_level: int = 3, inputs: Iterable[str | os.PathLike[str]] = (),
                 announce: bool = True) -> None:
        self.metadata = metadata
        self.num_rows = 0
        self._lo, self._hi = float("inf"), float("-inf")  # arrival_s written so far
        self._out = AtomicOutput(path, inputs=inputs, announce=announce)
        self.path = self._out.path
        self.tmp_path = self._out.tmp_path
        try:
            self._writer: pq.ParquetWriter | None = pq.ParquetWriter(
                self.tmp_path, SCHEMA, compression="zstd",
                # Dictionaries only where values repeat; hashes and ids are (nearly) unique.
                compression_level=compression_level,
                use_dictionary=["session_id", "parent_id", "cache_salt", "model", "status"],
                write_statistics=["arrival_s"])
        except BaseException:  # SIGTERM while the writer opens: no temporary file left
            self._out.abort()
            raise

    def write(self, data: pa.RecordBatch | pa.Table | list[TraceRequest]) -> None:
        """Append rows (Arrow data in :data:`SCHEMA`, or request records)."""
        assert self._writer is not None, "TraceWriter used after close"
        if isinstance(data, list):
            data = requests_to_table(data)
        if isinstance(data, pa.RecordBatch):
            data = pa.Table.from_batches([data])
        data = data.select(list(TRACE_COLUMNS)).cast(SCHEMA)
        self._check_span(data.column("arrival_s"))
        self._writer.write_table(data, row_group_size=ROW_GROUP_SIZE)
        self.num_rows += data.num_rows

    def _check_span(self, arrivals: pa.ChunkedArray) -> None:
        """Refuse rows that stretch the trace past :data:`MAX_SPAN_S`: the readers refuse
        such a file, so writing it would be an exit 0 with an unreadable output (a
        ``trace synth --rate 1e-190`` did that). Every writer of traces goes through here."""
        if len(arrivals) == 0:
            return
        lo, hi = (float(np.min(arrivals)), float(np.max(arrivals)))
        if not (np.isfinite(lo) and np.isfinite(hi)):  # e.g. arrivals divided by 1e-320
            raise TraceSchemaError(
                f"{self.path}: column arrival_s: a time of {lo if not np.isfinite(lo) else hi} "
                f"is not a finite time in seconds (see docs/trace-format.md); nothing was written")
        self._lo, self._hi = min(lo, self._lo), max(hi, self._hi)
        if self._hi - self._lo > MAX_SPAN_S:
            raise TraceSchemaError(
                f"{self.path}: arrivals would span {(self._hi - self._lo) / 86400:.3g} days; "
                f"a trace spans at most {MAX_SPAN_S / 86400:.0f} days (see "
                f"docs/trace-format.md); nothing was written")

    def finish(self) -> Path:
        """Finish the temporary file (final ``num_rows`` and metadata) without placing it."""
        assert self._writer is not None, "TraceWriter closed twice"
        self.metadata = self.metadata.replace(num_rows=self.num_rows)
        self._writer.add_key_value_metadata({METADATA_KEY: self.metadata.to_json().encode()})
        self._writer.close()
        self._writer = None
        return self.tmp_path

    def close(self) -> Path:
        """Finish the file and move it into place; returns the final path."""
        if self._writer is not None:
            self.finish()
        return self._out.commit()

    def abort(self) -> None:
        """Drop the temporary file (idempotent)."""
        if self._writer is not None:
            try:
                self._writer.close()
            finally:
                self._writer = None
        self._out.abort()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_trace(path: str | os.PathLike[str],
                requests_or_batches: Iterable[TraceRequest] | Iterable[pa.RecordBatch] | pa.Table,
                metadata: TraceMetadata) -> Path:
    """Write a whole trace (request records, Arrow batches or a table) atomically."""
    with TraceWriter(path, metadata) as writer:
        if isinstance(requests_or_batches, pa.Table):
            writer.write(requests_or_batches)
        else:
            pending: list[TraceRequest] = []
            for item in requests_or_batches:
                if isinstance(item, TraceRequest):
                    pending.append(item)
                    if len(pending) >= ROW_GROUP_SIZE:
                        writer.write(pending)
                        pending = []
                else:
                    writer.write(item)
            if pending:
                writer.write(pending)
    return Path(path)


class Trace:
    """A canonical trace: metadata plus rows, read lazily through polars.

    Rows are always served sorted by ``arrival_s`` (stable, so same-time requests keep
    file order). Build one with :func:`read_trace` or :meth:`Trace.from_requests`.
    """

    def __init__(self, frame: "pl.LazyFrame | None", metadata: TraceMetadata, *,
                 source: str | None = None,
                 files: "Sequence[StoredFile] | None" = None) -> None:
        """``files``: the Parquet files ``frame`` scans, in its order (``read_trace``), so
        :meth:`stored_batches` and :meth:`row_reader` can read them without polars; None
        for any other frame. ``frame`` None (with ``files``): scanned from ``files`` on
        first use, so a reader that never needs polars never imports it."""
        if frame is None and files is None:
            raise ValueError("Trace needs a frame or the files it scans")
        self._scan = frame
        self.metadata = metadata
        self.source = source
        self._files = None if files is None else list(files)
        self._len: int | None = metadata.num_rows

    @property
    def _frame(self) -> "pl.LazyFrame":
        """The rows as a polars scan in storage order (built from the files on first use)."""
        if self._scan is None:
            assert self._files is not None
            self._scan = _scan_files(self._files)
        return self._scan

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_requests(cls, requests: Iterable[TraceRequest], metadata: TraceMetadata) -> "Trace":
        """An in-memory trace (tests, synth, re-blocked copies)."""
        import polars as pl

        table = requests_to_table(list(requests))
        meta = metadata.replace(num_rows=table.num_rows)
        return cls(pl.from_arrow(table).lazy(), meta)  # type: ignore[union-attr]

    @classmethod
    def from_arrow(cls, table: pa.Table, metadata: TraceMetadata) -> "Trace":
        import polars as pl

        table = table.select(list(TRACE_COLUMNS)).cast(SCHEMA)
        return cls(pl.from_arrow(table).lazy(),  # type: ignore[union-attr]
                   metadata.replace(num_rows=table.num_rows))

    # -- reading ---------------------------------------------------------------------------
    def lazy(self) -> pl.LazyFrame:
        """All rows as a polars LazyFrame, sorted by ``arrival_s``."""
        return self._frame.sort("arrival_s", maintain_order=True)

    def stored(self) -> pl.LazyFrame:
        """All rows in storage order (not sorted): for readers that fetch row ranges
        lazily (``tuner.replay._stream`` reads hashes a row range at a time)."""
        return self._frame

    def stored_batches(self, columns: Sequence[str], batch_rows: int = ROW_GROUP_SIZE
                       ) -> Iterator[pa.RecordBatch]:
        """``columns`` in storage order (as :meth:`stored`), a record batch of at most
        ``batch_rows`` rows at a time.

        Why: for readers that pack a whole trace's small columns into arrays of their own
        (``tuner.replay._issue_columns``). A trace read from files is read through
        pyarrow, one batch at a time and on this thread
        (:func:`tuner.trace.batches.file_batches`): collecting the columns through polars
        left ~40 MB more resident for a synthetic day's 285k requests than for its six
        hours' 71k, held by polars' allocator after the frame was dropped
        (docs/performance.md, fourth memory round). Any other trace goes through polars.
        """
        if self._files is not None:
            yield from file_batches(self._files, columns, batch_rows)
            return
        df = self._frame.select(list(columns)).collect()
        for chunk in df.iter_slices(batch_rows):
            yield from chunk.to_arrow().to_batches()

    def row_reader(self, columns: Sequence[str], batch_rows: int) -> "RowReader | FrameRows":
        """A reader of ``columns`` by storage-row range (``read(start, stop) -> pa.Table``).

        Why: the replay's stream reads the hash columns a range of storage rows at a time
        (``tuner.replay._stream``). A trace read from files is read through pyarrow, one
        record batch reader kept open across ranges (:class:`tuner.trace.batches.RowReader`:
        ranges read in increasing order decode each page once), so a replay never imports
        polars; any other trace slices its polars frame."""
        if self._files is not None:
            return RowReader(self._files, columns, batch_rows)
        return FrameRows(self._frame, columns)

    def to_arrow(self) -> pa.Table:
        return self.lazy().collect().to_arrow().cast(SCHEMA)

    def iter_batches(self, *, block_size: int | None = None,
                     batch_size: int = 4096) -> Iterator[pa.Table]:
        """Arrow tables of ``batch_size`` rows in arrival order (schema :data:`SCHEMA`),
        optionally re-blocked to ``block_size``.

        Re-blocking works batch by batch, so memory stays bounded however many hashes
        the trace has at the KV block size. Consumers that can work on arrays should
        prefer this to :meth:`iter_requests`: turning hashes into Python ints costs about
        1 us each (the agentic hour at 16-token blocks has 155 M of them).
        """
        import polars as pl

        src = self.metadata.hash_block_size
        df = self.lazy().collect()
        for chunk in df.iter_slices(batch_size):
            table = chunk.to_arrow().select(list(TRACE_COLUMNS)).cast(SCHEMA)
            if block_size is not None and block_size != src:
                from tuner.trace.reblock_vec import reblock_table

                table = reblock_table(table, src, block_size)
            elif block_size is not None:
                table = pl.from_arrow(table).with_columns(  # type: ignore[union-attr]
                    pl.col("block_hashes").list.head(pl.col("input_len") // src)
                ).to_arrow().cast(SCHEMA)
            yield table

    def iter_requests(self, *, block_size: int | None = None,
                      batch_size: int = 4096) -> Iterator[TraceRequest]:
        """Requests in arrival order, optionally re-blocked to ``block_size`` on the fly
        (exactly ``floor(input_len / block_size)`` prompt hashes; see :meth:`iter_batches`)."""
        for table in self.iter_batches(block_size=block_size, batch_size=batch_size):
            yield from _rows(table)

    def requests(self) -> list[TraceRequest]:
        return list(self.iter_requests())

    def write(self, path: str | os.PathLike[str], *, compression_level: int = 9,
              inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
        """Write this trace to ``path`` (atomically) in its stored row order.

        ``path`` may not be one of ``inputs`` nor a file this trace was read from.

        Ingested traces are stored in arrival order; synthesized ones grouped by session,
        which lets zstd fold each turn's repeated prefix into a back-reference (level 9:
        the bundled agentic hour is 4.4 MB instead of 5.1 MB at level 3, for 1 s more).
        """
        table = self._frame.collect().to_arrow().select(list(TRACE_COLUMNS)).cast(SCHEMA)
        sources = [*inputs, *self._source_files()]
        with TraceWriter(path, self.metadata, compression_level=compression_level,
                         inputs=sources) as writer:
            writer.write(table)
        return writer.path

    def _source_files(self) -> list[Path]:
        if self.source is None:
            return []
        p = Path(self.source)
        return sorted(p.rglob("*.parquet")) if p.is_dir() else [p]

    def __len__(self) -> int:
        if self._len is None:
            import polars as pl

            self._len = int(self._frame.select(pl.len()).collect().item())
        return self._len

    def __iter__(self) -> Iterator[TraceRequest]:
        return self.iter_requests()

    def time_range(self) -> tuple[float, float]:
        """``(first, last)`` arrival in seconds; ``(0.0, 0.0)`` for an empty trace."""
        import polars as pl

        row = self._frame.select(pl.col("arrival_s").min().alias("a"),
                                 pl.col("arrival_s").max().alias("b")).collect()
        a, b = row.item(0, "a"), row.item(0, "b")
        return (float(a), float(b)) if a is not None else (0.0, 0.0)

    def fingerprint(self) -> str:
        """A stable content hash (hex) of the rows and the hash block size.

        Built from the raw column buffers in (arrival, id) order (not polars' row hash,
        which is not stable across versions), so equal traces give equal fingerprints on
        any machine.
        """
        h = hashlib.blake2b(digest_size=16, person=b"tuner-trace-fp")
        h.update(f"hbs={self.metadata.hash_block_size};".encode())
        # Canonical order: arrival, then id, so file row order does not matter.
        df = self._frame.sort(["arrival_s", "request_id"]).collect()
        for chunk in df.iter_slices(65_536):
            table = chunk.to_arrow().select(list(TRACE_COLUMNS)).cast(SCHEMA)
            for name in TRACE_COLUMNS:
                _update_column(h, table.column(name), name)
        return h.hexdigest()

    def reblocked(self, block_size: int) -> "Trace":
        """This trace with block hashes at ``block_size`` tokens (the KV block size).

        Prompt hashes become exactly ``floor(input_len / block_size)`` full blocks and
        output hashes the full blocks the generated tokens complete (see
        :func:`tuner.trace.reblock.reblock_request_hashes`).
        """
        src = self.metadata.hash_block_size
        if block_size == src:
            return self._with_floor_blocks()
        from tuner.trace.reblock_vec import reblock_table

        df = self.lazy().collect()
        parts = [reblock_table(chunk.to_arrow().select(list(TRACE_COLUMNS)).cast(SCHEMA), src,
                               block_size) for chunk in df.iter_slices(4096)]
        table = pa.concat_tables(parts) if parts else SCHEMA.empty_table()
        return Trace.from_arrow(table, self.metadata.replace(hash_block_size=block_size))

    def _with_floor_blocks(self) -> "Trace":
        import polars as pl

        b = self.metadata.hash_block_size
        frame = self._frame.with_columns(
            pl.col("block_hashes").list.head(pl.col("input_len") // b))
        return Trace(frame, self.metadata, source=self.source)

    def __repr__(self) -> str:
        return (f"Trace({self.source or 'in-memory'!s}, rows={self._len}, "
                f"hash_block_size={self.metadata.hash_block_size})")


def _rows(table: pa.Table) -> Iterator[TraceRequest]:
    cols = {name: table.column(name).to_pylist() for name in TRACE_COLUMNS}
    for i in range(table.num_rows):
        yield TraceRequest(
            request_id=cols["request_id"][i],
            arrival_s=cols["arrival_s"][i],
            input_len=cols["input_len"][i],
            output_len=cols["output_len"][i],
            block_hashes=tuple(cols["block_hashes"][i] or ()),
            output_block_hashes=tuple(cols["output_block_hashes"][i] or ()),
            session_id=cols["session_id"][i],
            parent_id=cols["parent_id"][i],
            turn=cols["turn"][i],
            priority=cols["priority"][i] or 0,
            cache_salt=cols["cache_salt"][i],
            model=cols["model"][i],
            status=cols["status"][i],
        )


def _update_column(h: Any, col: pa.ChunkedArray, name: str) -> None:
    h.update(name.encode() + b"\0")
    # One contiguous array: the chunking of a sorted polars frame varies from run to run
    # (parallel sort), and hashing per chunk would make the fingerprint vary with it.
    for chunk in (col.combine_chunks(),):
        if pa.types.is_list(chunk.type):
            offsets = np.asarray(chunk.offsets, dtype=np.int64)
            h.update((offsets - offsets[0]).tobytes())
            h.update(np.asarray(chunk.flatten().fill_null(0), dtype=np.uint64).tobytes())
            h.update(np.asarray(chunk.is_null(), dtype=np.bool_).tobytes())
        elif pa.types.is_string(chunk.type) or pa.types.is_large_string(chunk.type):
            for v in chunk.to_pylist():
                h.update(b"\1" if v is None else b"\2" + v.encode() + b"\0")
        else:
            h.update(np.asarray(chunk.is_null(), dtype=np.bool_).tobytes())
            h.update(chunk.fill_null(0).to_numpy(zero_copy_only=False).tobytes())


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Open a trace file or a directory of trace files (recursively, hive layout allowed).

    Files of one directory must share ``hash_block_size`` and salt fingerprint; when their
    ``origin_utc`` differ, arrivals are shifted onto the earliest origin so the rows form
    one timeline.

    Raises:
        TraceSchemaError: missing path, no Parquet files, missing columns or metadata, or
            files that disagree on block size or salt.
    """
    p = Path(path)
    if not p.exists():
        raise TraceSchemaError(f"{p}: no such trace file or directory")
    files = sorted(f for f in p.rglob("*.parquet") if not f.name.startswith(".")) if p.is_dir() else [p]
    if not files:
        raise TraceSchemaError(f"{p}: directory holds no .parquet trace files")
    metas = [(_read_metadata(f), f) for f in files]
    for f in files:
        check_columns(f)
    first, _ = metas[0]
    for meta, f in metas[1:]:
        if meta.hash_block_size != first.hash_block_size:
            raise TraceSchemaError(
                f"{f}: hash_block_size {meta.hash_block_size} differs from {files[0]}'s "
                f"{first.hash_block_size}; re-block one of them first")
        if meta.salt_fingerprint != first.salt_fingerprint:
            raise TraceSchemaError(
                f"{f}: salt fingerprint {meta.salt_fingerprint} differs from {files[0]}'s "
                f"{first.salt_fingerprint}: hashes from different salts never match")
    origins = [_parse_utc(m.origin_utc) for m, _ in metas]
    base = min((o for o in origins if o is not None), default=None)
    stored = []
    for (meta, f), origin in zip(metas, origins):
        shift_s = 0.0
        if base is not None and origin is not None and origin != base:
            shift_s = (origin - base).total_seconds()
        stored.append(StoredFile(f, shift_s))
    num_rows = sum((m.num_rows or 0) for m, _ in metas) if all(
        m.num_rows is not None for m, _ in metas) else None
    meta = first.replace(num_rows=num_rows,
                         origin_utc=base.isoformat() if base is not None else first.origin_utc)
    return Trace(None, meta, source=str(p), files=stored)


def _scan_files(files: Sequence[StoredFile]) -> "pl.LazyFrame":
    """``read_trace``'s files as one polars scan: canonical columns (a missing one as
    nulls), each file's arrivals shifted onto the earliest origin, files in order."""
    import polars as pl

    frames = []
    for stored in files:
        frame = _scan_file(stored.path)
        if stored.shift_s:
            frame = frame.with_columns(pl.col("arrival_s") + stored.shift_s)
        frames.append(frame)
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")


def _parse_utc(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _read_metadata(path: Path) -> TraceMetadata:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise TraceSchemaError(f"{path}: not a Parquet trace ({exc})") from None
    names = pf.schema_arrow.names
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise TraceSchemaError(f"{path}: missing column(s) {missing}; see docs/trace-format.md")
    # The file-level key-value metadata, not the embedded Arrow schema: the writer adds the
    # final metadata (row count, origin) when it closes.
    raw = (pf.metadata.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise TraceSchemaError(f"{path}: no tuner.trace metadata (hash_block_size unknown); "
                               "write traces with tuner ingest or write_trace")
    meta = TraceMetadata.from_json(raw, where=str(path))
    if meta.num_rows is None:
        meta = meta.replace(num_rows=pf.metadata.num_rows)
    return meta


def _scan_file(path: Path) -> "pl.LazyFrame":
    import polars as pl

    names = pq.read_schema(path).names
    frame = pl.scan_parquet(path, hive_partitioning=False)
    fill = [pl.lit(None, dtype=_polars_type(c)).alias(c) for c in TRACE_COLUMNS if c not in names]
    if fill:
        frame = frame.with_columns(fill)
    return frame.select(list(TRACE_COLUMNS))


def _polars_type(name: str) -> "pl.DataType":
    import polars as pl

    return pl.from_arrow(pa.table({name: pa.array([], SCHEMA.field(name).type)})).schema[name]  # type: ignore[union-attr]
