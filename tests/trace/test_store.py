"""Write/read round trips, atomic writes, directories of files, fingerprints, schema."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tuner.errors import TraceSchemaError
from tuner.trace import Trace, TraceMetadata, TraceRequest, TraceWriter, read_trace, write_trace
from tuner.trace.request import TRACE_COLUMNS
from tuner.trace.schema import SCHEMA

META = TraceMetadata(hash_block_size=16, source_format="test", salt_fingerprint="abc")


def _reqs() -> list[TraceRequest]:
    return [
        TraceRequest("b", 2.5, 40, 7, (1, 2, 2**64 - 1), (9,), "s1", "a", 2, 1, "salt", "m",
                     "aborted"),
        TraceRequest("a", 0.5, 20, 3, (1, 5)),
        TraceRequest("c", 2.5, 16, 0, (1,), session_id="s1"),
    ]


def test_schema_matches_dataclass() -> None:
    assert tuple(SCHEMA.names) == TRACE_COLUMNS
    assert TRACE_COLUMNS == tuple(f.name for f in dataclasses.fields(TraceRequest))


def test_round_trip_sorted_by_arrival(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.parquet", _reqs(), META)
    trace = read_trace(path)
    got = trace.requests()
    assert [r.request_id for r in got] == ["a", "b", "c"]  # stable for the 2.5 tie
    assert got[1] == _reqs()[0]
    assert got[0] == _reqs()[1]
    assert len(trace) == 3 and trace.metadata.num_rows == 3
    assert trace.metadata.hash_block_size == 16 and trace.metadata.salt_fingerprint == "abc"
    assert trace.time_range() == (0.5, 2.5)
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == "ZSTD"


def test_writer_error_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "t.parquet"
    with pytest.raises(RuntimeError):
        with TraceWriter(out, META) as w:
            w.write(_reqs())
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_a_span_the_readers_refuse(tmp_path: Path) -> None:
    """Rows over more than 366 days (across batches too) are refused before the file is
    placed: `trace synth --rate 1e-190` wrote a trace that read_trace then refused."""
    out = tmp_path / "t.parquet"
    far = dataclasses.replace(_reqs()[1], request_id="z", arrival_s=367 * 86400.0 + 0.5)
    with pytest.raises(TraceSchemaError, match="at most 366 days"):
        with TraceWriter(out, META) as w:
            w.write(_reqs())
            w.write([far])
    assert list(tmp_path.iterdir()) == []
    near = dataclasses.replace(far, arrival_s=365 * 86400.0)
    assert len(read_trace(write_trace(out, [*_reqs(), near], META))) == 4


@pytest.mark.parametrize("arrival", [float("inf"), float("nan")])
def test_writer_refuses_arrivals_that_are_not_finite(tmp_path: Path, arrival: float) -> None:
    """Two infinite arrivals span NaN, which the span check cannot see: `trace slice
    --speedup 1e-320` divided every arrival to inf and wrote a trace the readers refuse."""
    out = tmp_path / "t.parquet"
    bad = [dataclasses.replace(r, arrival_s=arrival) for r in _reqs()]
    with pytest.raises(TraceSchemaError, match="column arrival_s: .* not a finite time"):
        with TraceWriter(out, META) as w:
            w.write(bad)
    assert list(tmp_path.iterdir()) == []


def test_fingerprint_stable_and_content_sensitive(tmp_path: Path) -> None:
    a = Trace.from_requests(_reqs(), META)
    b = read_trace(write_trace(tmp_path / "t.parquet", list(reversed(_reqs())), META))
    assert a.fingerprint() == b.fingerprint()
    changed = _reqs()
    changed[1] = dataclasses.replace(changed[1], block_hashes=(1, 6))
    assert Trace.from_requests(changed, META).fingerprint() != a.fingerprint()
    assert Trace.from_requests(_reqs(), META.replace(hash_block_size=32)).fingerprint() \
        != a.fingerprint()


def test_directory_of_files_with_origins(tmp_path: Path) -> None:
    d = tmp_path / "trace"
    write_trace(d / "date=2026-11-28" / "part-0.parquet", [TraceRequest("x", 10.0, 20, 1, (1, 2))],
                META.replace(origin_utc="2026-11-28T00:00:00+00:00"))
    write_trace(d / "date=2026-11-29" / "part-0.parquet", [TraceRequest("y", 5.0, 20, 1, (1, 3))],
                META.replace(origin_utc="2026-11-29T00:00:00+00:00"))
    trace = read_trace(d)
    assert [(r.request_id, r.arrival_s) for r in trace.iter_requests()] == [
        ("x", 10.0), ("y", 86405.0)]
    assert trace.metadata.origin_utc == "2026-11-28T00:00:00+00:00"
    assert len(trace) == 2 and "arrival_s" in trace.lazy().collect_schema().names()


def test_directory_rejects_mixed_block_sizes(tmp_path: Path) -> None:
    write_trace(tmp_path / "a.parquet", [TraceRequest("x", 0, 20, 1, (1, 2))], META)
    write_trace(tmp_path / "b.parquet", [TraceRequest("y", 0, 20, 1, (1,))],
                META.replace(hash_block_size=32))
    with pytest.raises(TraceSchemaError, match="hash_block_size 32 differs"):
        read_trace(tmp_path)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(TraceSchemaError, match="no such trace"):
        read_trace(tmp_path / "missing.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceSchemaError, match="no .parquet"):
        read_trace(tmp_path / "empty")
    pq.write_table(pa.table({"request_id": ["a"]}), tmp_path / "x.parquet")
    with pytest.raises(TraceSchemaError, match="missing column"):
        read_trace(tmp_path / "x.parquet")
    pl.DataFrame({"request_id": ["a"], "arrival_s": [0.0], "input_len": [1], "output_len": [1],
                  "block_hashes": [[1]]}).write_parquet(tmp_path / "y.parquet")
    with pytest.raises(TraceSchemaError, match="no tuner.trace metadata"):
        read_trace(tmp_path / "y.parquet")
    (tmp_path / "z.parquet").write_text("not parquet")
    with pytest.raises(TraceSchemaError, match="not a Parquet trace"):
        read_trace(tmp_path / "z.parquet")


def test_reblocked_counts_are_floor() -> None:
    reqs = [TraceRequest("a", 0, 100, 40, (1, 2, 3, 4, 5, 6, 7), (8, 9)),
            TraceRequest("b", 1, 33, 0, (1, 2, 3))]
    t = Trace.from_requests(reqs, META)
    same = t.reblocked(16).requests()
    assert [len(r.block_hashes) for r in same] == [6, 2]
    big = t.reblocked(32).requests()
    assert [len(r.block_hashes) for r in big] == [3, 1]
    assert len(big[0].output_block_hashes) == 140 // 32 - 100 // 32
    assert t.reblocked(32).metadata.hash_block_size == 32
    small = t.reblocked(8).requests()
    assert [len(r.block_hashes) for r in small] == [12, 4]


def test_iter_requests_reblocks_on_the_fly() -> None:
    reqs = [TraceRequest("a", 0, 100, 40, (1, 2, 3, 4, 5, 6, 7), (8, 9)),
            TraceRequest("b", 1, 33, 0, (1, 2, 3))]
    t = Trace.from_requests(reqs, META)
    assert list(t.iter_requests(block_size=32, batch_size=1)) == t.reblocked(32).requests()
    assert [len(r.block_hashes) for r in t.iter_requests(block_size=16)] == [6, 2]
    assert [b.num_rows for b in t.iter_batches(block_size=8, batch_size=1)] == [1, 1]


def test_fingerprint_ignores_chunking_and_row_order() -> None:
    """Equal rows give equal fingerprints however the Arrow data is chunked or ordered."""
    import pyarrow as pa

    from tuner.trace import Trace, synthesize

    trace = synthesize("chat", duration_s=300, rate=3, seed=5)
    table = trace.lazy().collect().to_arrow()
    n = table.num_rows
    shuffled = table.take(pa.array(list(range(n))[::-1]))
    pieces = [shuffled.slice(i, 7) for i in range(0, n, 7)]  # many small chunks
    rechunked = pa.concat_tables(pieces)
    assert rechunked.column(0).num_chunks > 1
    other = Trace.from_arrow(rechunked, trace.metadata)
    assert other.fingerprint() == trace.fingerprint()
    assert Trace.from_arrow(table.slice(1), trace.metadata).fingerprint() != trace.fingerprint()


def test_column_digest_does_not_depend_on_chunk_boundaries() -> None:
    """Regression: polars' parallel sort chunks a frame differently from run to run."""
    import hashlib

    import pyarrow as pa

    from tuner.trace.store import _update_column

    values = [[1, 2, 3], [4], [], [5, 6], [7, 8, 9, 10]]
    whole = pa.chunked_array([pa.array(values, pa.list_(pa.uint64()))])
    split = pa.chunked_array([pa.array(values[:2], pa.list_(pa.uint64())),
                              pa.array(values[2:], pa.list_(pa.uint64()))])
    digests = []
    for col in (whole, split):
        h = hashlib.blake2b(digest_size=16)
        _update_column(h, col, "block_hashes")
        digests.append(h.hexdigest())
    assert digests[0] == digests[1]
