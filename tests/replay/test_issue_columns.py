"""The stream's per-request columns (``tuner.replay._issue_columns``), read a batch at a
time without polars and packed narrow, are the trace's rows in ``Trace.lazy``'s order
(arrival, ties in storage order), nulls read as the stream always read them (no
session: None; no priority: 0)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tuner.errors import ConfigError
from tuner.replay._issue_columns import read_issue_columns
from tuner.trace import Trace, TraceMetadata, TraceRequest, read_trace, write_trace

META = TraceMetadata(hash_block_size=16, source_format="test")


def _requests(n: int) -> list[TraceRequest]:
    """Stored grouped by session, arrivals interleaved with many ties (as a synthetic day
    is stored), some sessions and priorities null."""
    rng = np.random.default_rng(7)
    return [TraceRequest(f"r{i}-é", float(rng.integers(0, 40)) / 4, int(rng.integers(1, 5000)),
                         int(rng.integers(0, 900)), (i,),
                         session_id=None if i % 5 == 0 else f"sess-{i // 7}",
                         priority=None if i % 6 == 0 else int(rng.integers(-3, 3)))
            for i in range(n)]


def _expected(trace: Trace) -> list[tuple]:  # type: ignore[type-arg]
    rows = trace.lazy().collect()
    return list(zip(rows.get_column("request_id").to_list(),
                    rows.get_column("arrival_s").to_list(),
                    rows.get_column("input_len").to_list(),
                    rows.get_column("output_len").to_list(),
                    rows.get_column("session_id").to_list(),
                    rows.get_column("priority").fill_null(0).to_list()))


@pytest.mark.parametrize("stored", ["file", "memory"])
def test_columns_are_the_trace_in_arrival_order(tmp_path: Path, stored: str) -> None:
    requests = _requests(70_000 if stored == "file" else 3_000)  # file: 2 row groups
    trace = (read_trace(write_trace(tmp_path / "t.parquet", requests, META))
             if stored == "file" else Trace.from_requests(requests, META))
    columns = read_issue_columns(trace)
    got = list(zip(columns.request_ids, columns.arrivals, columns.input_lens,
                   columns.output_lens, columns.session_ids, columns.priorities))
    assert got == _expected(trace)
    storage_ids = trace.stored().select("request_id").collect().get_column("request_id")
    assert [storage_ids[int(r)] for r in columns.rows[:50]] == [g[0] for g in got[:50]]
    assert columns.input_lens.itemsize == 4 and columns.rows.dtype == np.int32


def test_an_empty_trace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no requests"):
        read_issue_columns(read_trace(write_trace(tmp_path / "e.parquet", [], META)))
