"""The numbers every trace reader relies on, checked when a trace file is opened.

:func:`check_columns` runs on every :func:`tuner.trace.store.read_trace` (stats, report,
slice, replay and tune all open traces through it), so a bad value is refused once, with
file, row and column named, instead of surfacing later as a wrong count or a traceback.
Split out of ``store`` as its own concept: the rules per column and their messages.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tuner.errors import TraceSchemaError
from tuner.trace.batches import StoredFile, file_batches, null_mask, numbers
from tuner.trace.schema import MAX_SPAN_S, MAX_TOKENS, ROW_GROUP_SIZE


#: What every reader relies on, per column: (test of a good value, what a good value is).
_COLUMN_RULES: dict[str, tuple[Any, str]] = {
    "arrival_s": (lambda a: np.isfinite(a), "a finite time in seconds"),
    # whole numbers: a float column's 100.5 was silently truncated by the old polars
    # read and a pyarrow traceback in the replay's int32 packing
    "input_len": (lambda a: (a >= 1) & (a <= MAX_TOKENS) & (a == np.trunc(a)),
                  f"a whole number of tokens, 1 to {MAX_TOKENS:,}"),
    "output_len": (lambda a: (a >= 0) & (a <= MAX_TOKENS) & (a == np.trunc(a)),
                   f"a whole number of tokens, 0 to {MAX_TOKENS:,}"),
    # the schema's int32 (the replay packs it so): another writer's int64 beyond it was
    # a pyarrow traceback at the replay's start; null means 0 (docs/trace-format.md)
    "priority": (lambda a: (a >= -2**31) & (a < 2**31) & (a == np.trunc(a)),
                 "an int32 (vLLM priority) or null"),
}

#: Columns where null is a good value (read as the default).
_NULL_ALLOWED = frozenset({"priority"})


def check_columns(path: str | os.PathLike[str]) -> None:
    """Refuse a trace file whose numbers no reader can use, naming the column and the
    first bad row (1-based, file order).

    Checked on every read (stats, report, slice, replay, tune all open traces through
    :func:`read_trace`): NaN or infinite arrivals crashed ``trace stats`` and replayed
    with TTFT null and exit 0; a negative ``input_len`` replayed with one request missing
    from the counts; an int64 ``priority`` beyond the schema's int32 stopped the replay
    with a pyarrow traceback. Reads four numeric columns only (the hashes stay on disk), a
    record batch at a time through ``ParquetFile`` (``tuner.trace.batches``;
    ``pq.read_table`` imports pyarrow's dataset layer and pandas with it: 0.4 s of every
    trace load), into numpy from the buffers (pyarrow's own ``to_numpy`` imports pandas
    too). Not through polars: converting the whole columns there left ~40 MB of a
    synthetic day in polars' allocator for the rest of a replay (docs/performance.md,
    fourth memory round).
    """
    names = list(_COLUMN_RULES)
    lo = hi = (0.0, 0)  # earliest and latest arrival so far, with their rows
    at = 0
    try:
        for batch in file_batches([StoredFile(Path(path))], names, ROW_GROUP_SIZE):
            _check_batch(path, batch, at)
            t = numbers(batch.column("arrival_s"), np.float64)
            if len(t):
                i, j = int(np.argmin(t)), int(np.argmax(t))
                if not at or t[i] < lo[0]:
                    lo = (float(t[i]), at + i)
                if not at or t[j] > hi[0]:
                    hi = (float(t[j]), at + j)
            at += batch.num_rows
    except (pa.ArrowInvalid, OSError, KeyError) as exc:
        raise TraceSchemaError(f"{path}: cannot read {', '.join(_COLUMN_RULES)} ({exc})") from None
    finally:
        # The reader's freed buffers stay in Arrow's pool (mimalloc) otherwise: ~15 MB
        # for a synthetic day, for as long as the process runs.
        pa.default_memory_pool().release_unused()
    if hi[0] - lo[0] > MAX_SPAN_S:
        raise TraceSchemaError(
            f"{path}: column arrival_s: rows {lo[1] + 1} and {hi[1] + 1} are "
            f"{(hi[0] - lo[0]) / 86400:.3g} days apart; a trace spans at most "
            f"{MAX_SPAN_S / 86400:.0f} days (see docs/trace-format.md)")


def _check_batch(path: str | os.PathLike[str], batch: pa.RecordBatch, first_row: int) -> None:
    """:func:`check_columns`' rules on one record batch, its rows from ``first_row``."""
    for name, (test, good) in _COLUMN_RULES.items():
        col = batch.column(name)
        try:
            values = numbers(col, np.float64)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # not numbers: polars' cast
            import polars as pl

            series = pl.from_arrow(col)
            assert isinstance(series, pl.Series)
            values = series.cast(pl.Float64, strict=False).fill_null(np.nan).to_numpy()
        with np.errstate(invalid="ignore"):
            good_values = test(values)
        ok = (good_values | null_mask(col)) if name in _NULL_ALLOWED else \
            (good_values & ~null_mask(col))
        if not ok.all():
            import polars as pl  # the message shows the value as polars does

            row = int(np.argmin(ok))
            value = pl.from_arrow(col.slice(row, 1))
            assert isinstance(value, pl.Series)
            raise TraceSchemaError(f"{path}: column {name}: row {first_row + row + 1} is "
                                   f"{_show(value[0])}, not {good} "
                                   "(see docs/trace-format.md)")


def _show(value: Any) -> str:
    return "null" if value is None else repr(value)
