"""``Trace.stored_batches``: a trace's columns read a batch at a time through pyarrow
(``tuner.trace.batches``) must be what ``read_trace``'s polars scan serves (the replay's
stream packs its per-request columns from them; docs/performance.md, fourth memory
round), for directories of files shifted onto one origin and files that lack optional
columns."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tuner.trace import TraceMetadata, TraceRequest, read_trace, write_trace
from tuner.trace.request import TRACE_COLUMNS

META = TraceMetadata(hash_block_size=16, source_format="test")


def _requests(prefix: str, n: int, t0: float) -> list[TraceRequest]:
    return [TraceRequest(f"{prefix}{i}", t0 + (i % 4) * 0.5, 16 + i, i % 3, (i, i + 1),
                         session_id=None if i % 3 == 0 else f"s{i % 2}",
                         priority=i % 5 - 2) for i in range(n)]


def _directory(tmp_path: Path) -> Path:
    """Three files a day apart in origin, the last without the optional columns."""
    d = tmp_path / "trace"
    write_trace(d / "a.parquet", _requests("a", 7, 10.0),
                META.replace(origin_utc="2026-11-28T00:00:00+00:00"))
    write_trace(d / "b.parquet", _requests("b", 5, 3.25),
                META.replace(origin_utc="2026-11-29T00:00:00+00:00"))
    full = write_trace(tmp_path / "c-full.parquet", _requests("c", 4, 0.125),
                       META.replace(origin_utc="2026-11-30T06:00:00+00:00"))
    table = pq.read_table(full)
    required = table.select(["request_id", "arrival_s", "input_len", "output_len",
                             "block_hashes"])
    pq.write_table(required.replace_schema_metadata(pq.ParquetFile(full).metadata.metadata),
                   d / "c.parquet")
    return d


def _polars_rows(trace, columns: list[str]) -> list[tuple]:  # type: ignore[no-untyped-def]
    frame = trace.stored().select(columns).collect()
    return list(zip(*(frame.get_column(c).to_list() for c in columns)))


def _batch_rows(batches: list[pa.RecordBatch], columns: list[str]) -> list[tuple]:
    return [tuple(row[c] for c in columns)
            for batch in batches for row in batch.to_pylist()]


def test_file_batches_are_the_polars_scan(tmp_path: Path) -> None:
    trace = read_trace(_directory(tmp_path))
    columns = list(TRACE_COLUMNS)
    batches = list(trace.stored_batches(columns, batch_rows=3))
    assert max(b.num_rows for b in batches) == 3 and len(batches) == 3 + 2 + 2
    got, want = _batch_rows(batches, columns), _polars_rows(trace, columns)
    assert got == want
    # the shifts: b a day after a's origin, c 2 days and 6 hours; c's optional ones null
    arrivals = {r[0]: r[1] for r in got}
    assert arrivals["a1"] == 10.5 and arrivals["b1"] == 86400 + 3.75
    assert arrivals["c2"] == 2 * 86400 + 6 * 3600 + 1.125
    assert [r[columns.index("session_id")] for r in got if r[0].startswith("c")] == [None] * 4


def test_in_memory_trace_batches_are_its_frame() -> None:
    from tuner.trace import Trace

    trace = Trace.from_requests(_requests("m", 9, 1.0), META)
    columns = ["request_id", "arrival_s", "session_id", "priority"]
    batches = list(trace.stored_batches(columns, batch_rows=4))
    assert [b.num_rows for b in batches] == [4, 4, 1]
    assert _batch_rows(batches, columns) == _polars_rows(trace, columns)


def test_row_reader_reads_any_range_as_the_polars_slice(tmp_path: Path) -> None:
    """``Trace.row_reader`` (the stream's hash reads): ranges forward, backward, across
    file boundaries, past the end and empty, each the polars scan's slice; an in-memory
    trace's reader slices its frame."""
    import random

    from tuner.trace import Trace
    from tuner.trace.batches import FrameRows, RowReader

    columns = ["request_id", "arrival_s", "block_hashes", "session_id"]
    trace = read_trace(_directory(tmp_path))  # 7 + 5 + 4 rows
    in_memory = Trace.from_requests(_requests("m", 9, 1.0), META)
    for t, kind in ((trace, RowReader), (in_memory, FrameRows)):
        total = len(t)
        frame = t.stored().select(columns).collect()
        for batch_rows in (1, 3, 5, 64):
            reader = t.row_reader(columns, batch_rows)
            assert isinstance(reader, kind)
            ranges = [(a, a + 3) for a in range(0, total, 3)]  # forward, as the stream
            rng = random.Random(batch_rows)
            ranges += [(a, a + rng.randrange(0, 6))
                       for a in (rng.randrange(total + 2) for _ in range(30))]
            for start, stop in ranges:
                got = reader.read(start, stop)
                assert got.column_names == columns
                want = frame.slice(start, max(stop - start, 0))
                assert got.to_pylist() == want.to_dicts(), (kind, batch_rows, start, stop)


def test_a_replay_of_a_file_trace_does_not_import_polars(tmp_path: Path) -> None:
    """The replay reads a file trace through pyarrow only (``import polars`` is
    0.15-0.2 CPU s of a fresh replay process; docs/performance.md, load32 round)."""
    import subprocess
    import sys

    path = write_trace(tmp_path / "t.parquet",
                       [TraceRequest(f"r{i}", i * 0.5, 64, 8, tuple(range(i, i + 4)),
                                     session_id=f"s{i % 3}") for i in range(40)],
                       META)
    code = ("import sys\n"
            "from tuner import replay\n"
            "from tuner.perf.target import Target\n"
            f"r = replay.run({str(path)!r}, target=Target(hardware='mi355x', "
            "model='llama-3.1-70b', tp=8))\n"
            "assert len(r.requests) == 40, len(r.requests)\n"
            "print('polars' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr[-2000:]
