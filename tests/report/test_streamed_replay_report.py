"""The replay report reads its records file a batch of rows at a time and renders the
page the whole-file code rendered (loaded_report_reference.py, its verbatim copy)."""

from __future__ import annotations

import importlib
import pathlib

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.metrics.record_tables import random_result
from tests.report.loaded_report_reference import loaded_replay_report
from tuner.metrics import write_requests_parquet
from tuner.report.charts import ecdf

module = importlib.import_module("tuner.report.replay_report")


@pytest.mark.parametrize("engines", [1, 3, 11])
def test_streamed_page_equals_the_loaded_one(tmp_path: pathlib.Path, engines: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    result = random_result(engines, n=4000, engines=engines)
    path = write_requests_parquet(result, tmp_path / "r.parquet", rows=1000)
    monkeypatch.setattr(module, "SCAN_ROWS", 700)  # batches that straddle row groups
    assert module.replay_report(path).render() == loaded_replay_report(path).render()


def test_the_page_never_reads_the_whole_file(tmp_path: pathlib.Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails on the whole-file code: it read the table with pq.read_table."""
    result = random_result(2, n=3000, engines=3)
    path = write_requests_parquet(result, tmp_path / "r.parquet", rows=1000)
    want = loaded_replay_report(path).render()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the report read the whole file")

    monkeypatch.setattr(pq, "read_table", refuse)
    assert module.replay_report(path).render() == want


def test_array_ecdf_equals_the_list_one() -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.exponential(1.0, 500), rng.choice([0.5, 0.0, -0.0], 300),
                             [np.nan, np.inf]])
    assert repr(ecdf(values)) == repr(ecdf(values.tolist()))
    assert ecdf(np.zeros(0)) == ([], [])


def test_array_thinning_picks_the_list_indices() -> None:
    from tuner.report.charts import _ecdf_array, _thin_arrays, thin

    rng = np.random.default_rng(2)
    for n in (10, 499, 500, 501, 1003, 77_777):
        xs, ys = _ecdf_array(rng.exponential(1.0, n))
        assert repr(_thin_arrays(xs, ys)) == repr(thin(xs.tolist(), ys.tolist()))
