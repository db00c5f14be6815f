"""Outputs of a long replay in bounded memory: the summary, the --out writer and the
report keep a few numbers a request, not a Python object a row.

Python-side allocations (tracemalloc) over 200,000 finished requests: the streamed code
keeps ~40 bytes a request (summary) and 16 (report); the per-object code built a
``RequestResult`` (~150 bytes) and lists of them (65 MB and 100 MB here: these tests fail
on it).
"""

from __future__ import annotations

import pathlib
import tracemalloc
from array import array
from collections.abc import Callable

import numpy as np
import pytest

from tuner.metrics import summarize, write_requests_parquet
from tuner.records import GapSamples, ReplayResult, RequestTable, StringColumn
from tuner.report.replay_report import replay_report

N = 200_000
MIB = 1 << 20


def _long_result() -> ReplayResult:
    """N finished requests (filled column by column: a day of records in a second)."""
    rng = np.random.default_rng(0)
    ids = StringColumn.of(f"r{i}" for i in range(N))
    table = RequestTable(ids, rng.integers(100, 4000, N).tolist())
    arrival = np.sort(rng.uniform(0, 86_400, N))
    first = arrival + rng.exponential(0.5, N)
    columns = {"arrival_s": arrival, "first_scheduled_s": arrival + 0.01,
               "first_token_s": first, "finish_s": first + rng.uniform(1, 20, N)}
    for name, values in columns.items():
        setattr(table, name, array("d", values.astype(np.float64).tobytes()))
    table.output_len = array("q", rng.integers(1, 500, N).astype(np.int64).tobytes())
    table.status = bytearray(N)  # all finished
    table.engine = array("i", rng.integers(0, 4, N).astype(np.int32).tobytes())
    return ReplayResult(backend="sim", requests=table, itl_samples=GapSamples(),
                        timeseries={}, counters={}, simulated_s=86_400.0, wall_s=1.0)


def _fields(result: ReplayResult) -> dict[str, object]:
    return {name: getattr(result, name) for name in ReplayResult.__slots__}


def _peak_mib(call: Callable[[], object]) -> float:
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1] / MIB
    finally:
        tracemalloc.stop()


@pytest.mark.slow  # 200,000 requests through three outputs: ~10 s
def test_summary_writer_and_report_stay_small(tmp_path: pathlib.Path) -> None:
    result = _long_result()
    small = tmp_path / "warm.parquet"  # once first: the imports are not the code's memory
    write_requests_parquet(ReplayResult(**{**_fields(result), "requests": result.requests[:10]}),
                           small)
    replay_report(small).render()
    assert _peak_mib(lambda: summarize(result)) < 16  # 40 bytes x 200k = 8 MB
    path = tmp_path / "records.parquet"
    assert _peak_mib(lambda: write_requests_parquet(result, path)) < 16  # a row group
    assert _peak_mib(lambda: replay_report(path).render()) < 16  # 16 bytes x 200k = 3 MB
