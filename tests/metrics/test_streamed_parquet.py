"""``--out`` records are written a row group at a time and equal the per-object writer's."""

from __future__ import annotations

import pathlib

import pyarrow.parquet as pq
import pytest

from tests.metrics.loaded_metrics_reference import loaded_write_requests_parquet
from tests.metrics.record_tables import random_result
from tuner.metrics import write_requests_parquet
from tuner.records import RequestTable, StringColumn


def _same_file(a: pathlib.Path, b: pathlib.Path) -> None:
    ta, tb = pq.read_table(a), pq.read_table(b)
    assert ta.schema.equals(tb.schema, check_metadata=True)
    assert ta.num_rows == tb.num_rows
    for name in ta.column_names:  # repr: nan equals nan (Table.equals says it does not)
        assert repr(ta.column(name).to_pylist()) == repr(tb.column(name).to_pylist()), name


@pytest.mark.parametrize("engines", [1, 3])
def test_row_groups_equal_the_per_object_file(tmp_path: pathlib.Path, engines: int) -> None:
    result = random_result(engines, n=2500, engines=engines)
    new = write_requests_parquet(result, tmp_path / "new.parquet", rows=1000)
    old = loaded_write_requests_parquet(result, tmp_path / "old.parquet")
    _same_file(new, old)
    assert pq.ParquetFile(new).metadata.num_row_groups == 3


def test_string_columns_and_plain_lists(tmp_path: pathlib.Path) -> None:
    result = random_result(7, n=700, engines=1)
    table = result.requests
    packed = RequestTable(StringColumn.of(table.request_id), table.input_len,
                          StringColumn.of(table.session_id))
    for name in RequestTable.__slots__[3:]:
        setattr(packed, name, getattr(table, name))
    for requests in (packed, list(table)):
        result.requests = requests
        new = write_requests_parquet(result, tmp_path / "new.parquet", rows=256)
        old = loaded_write_requests_parquet(result, tmp_path / "old.parquet")
        _same_file(new, old)


def test_writer_builds_no_request_objects(tmp_path: pathlib.Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails on the per-object writer: it read every row as a RequestResult."""
    result = random_result(8, n=500)
    old = loaded_write_requests_parquet(result, tmp_path / "old.parquet")

    def refuse(self: RequestTable, i: int) -> None:
        raise AssertionError("the writer built a RequestResult")

    monkeypatch.setattr(RequestTable, "_row", refuse)
    _same_file(write_requests_parquet(result, tmp_path / "new.parquet"), old)
