"""The request table's int32 columns and the id columns' int32 offsets (round "pdmem",
docs/performance.md): what a long replay keeps a request is narrower, and every reader
still sees the same values at the old widths."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tuner.metrics.record_columns import record_chunks
from tuner.records import RequestTable, StringColumn


def test_table_counts_are_int32_and_read_back_as_int64() -> None:
    table = RequestTable(["a", "b", "c"], [7, 2**24, 1])
    table.record(1, "finished", 0.5, output_len=2**24, num_cached_tokens=2**24 - 16,
                 num_preemptions=3, first_scheduled_s=1.0, first_token_s=1.5, finish_s=9.0)
    for column in (table.input_len, table.output_len, table.num_cached_tokens,
                   table.num_preemptions):
        assert column.itemsize == 4
    (chunk,) = record_chunks(table)
    assert chunk.input_len.dtype == np.int64 and chunk.input_len.tolist() == [7, 2**24, 1]
    assert chunk.output_len.tolist() == [0, 2**24, 0]
    assert chunk.num_cached_tokens.tolist() == [0, 2**24 - 16, 0]
    assert chunk.num_preemptions.dtype == np.int64 and chunk.num_preemptions.tolist() == [0, 3, 0]
    assert table[1].output_len == 2**24 and table[1].num_preemptions == 3


def test_a_count_past_int32_is_refused_not_wrapped() -> None:
    table = RequestTable(["a"], [1])
    with pytest.raises(OverflowError):
        table.record(0, "finished", 0.0, output_len=2**31)
    with pytest.raises(OverflowError):
        RequestTable(["a"], [2**31])


def test_string_column_offsets_are_int32_and_arrow_gets_int64() -> None:
    values = ["req-0", None, "", "sess-\u00e9", "x" * 300] * 40
    column = StringColumn.of(values)
    assert column._offsets.itemsize == 4
    assert list(column) == values
    for start, stop in ((0, len(values)), (3, 17), (5, 5), (len(values) - 1, len(values))):
        data, offsets, null = column.buffers(start, stop)
        assert offsets.typecode == "q" and offsets[0] == 0
        valid = None if null is None else pa.py_buffer(
            np.packbits(np.frombuffer(null, dtype=np.uint8) == 0, bitorder="little").tobytes())
        arrow = pa.LargeStringArray.from_buffers(stop - start, pa.py_buffer(offsets.tobytes()),
                                                 pa.py_buffer(data), valid)
        assert arrow.to_pylist() == values[start:stop]


def test_string_column_from_int64_offset_bytes() -> None:
    """The issue columns hand their offsets as int64 bytes (``_issue_columns``)."""
    data = b"abcdef"
    column = StringColumn(data, np.array([0, 1, 3, 6], dtype=np.int64).tobytes())
    assert list(column) == ["a", "bc", "def"]
