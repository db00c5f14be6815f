"""Every reader of a Parquet trace checks the columns it relies on (issue: NaN/inf
arrivals crashed ``trace stats`` and ``trace report`` and replayed with exit 0 and TTFT
null; a negative ``input_len`` replayed with exit 0 and a request missing from the counts;
``trace slice --speedup nan`` wrote NaN arrivals). And timestamps are bounded at ingest
(issue: ``timestamp: 1e29`` or Unix microseconds ingested as a span of 54,000 years)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.bounded import run_tuner
from tuner.cli import cli

REPO = pathlib.Path(__file__).resolve().parents[2]
TRACE = REPO / "traces" / "agentic_1h.parquet"


def _invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res.exit_code, res.output


def _broken(tmp_path: pathlib.Path, column: str, value: object, row: int = 5) -> pathlib.Path:
    table = pq.read_table(TRACE)
    kv = pq.ParquetFile(TRACE).metadata.metadata
    values = table.column(column).to_pylist()
    values[row] = value
    idx = table.schema.get_field_index(column)
    table = table.set_column(idx, column, pa.array(values, table.schema.field(column).type))
    out = tmp_path / f"bad-{column}.parquet"
    pq.write_table(table.replace_schema_metadata(kv), out)
    return out


BAD = [("arrival_s", float("nan"), "row 6 is nan"), ("arrival_s", float("inf"), "row 6 is inf"),
       ("arrival_s", None, "row 6 is null"), ("input_len", -3, "row 6 is -3"),
       ("input_len", 0, "row 6 is 0"), ("output_len", -1, "row 6 is -1"),
       ("output_len", 2**31 - 1, "row 6 is 2147483647"), ("arrival_s", 1e12, "days apart")]


@pytest.mark.parametrize("column,value,says", BAD)
@pytest.mark.parametrize("command", [["trace", "stats"], ["trace", "report", "-o", "r.html"],
                                     ["trace", "slice", "--last", "10m", "-o", "s.parquet"],
                                     ["replay", "--model", "llama-3.1-8b"]])
def test_every_reader_names_the_column_and_first_bad_row(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, column: str, value: object,
        says: str, command: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    bad = _broken(tmp_path, column, value)
    args = [*command[:2], str(bad), *command[2:]] if command[0] == "trace" else [
        command[0], str(bad), *command[1:]]
    code, out = _invoke(*args)
    assert code == 2, out
    line = out.strip().splitlines()[-1]
    assert line.startswith(f"Error: {bad}: column {column}: ") and says in line, line
    assert not list(tmp_path.glob("r.html")) and not list(tmp_path.glob("s.parquet"))


@pytest.mark.parametrize("speedup", ["nan", "inf", "-inf", "0", "-2", "1e300", "1e-320"])
def test_slice_speedup_must_be_finite_and_positive(tmp_path: pathlib.Path, speedup: str) -> None:
    out = tmp_path / "s.parquet"
    code, output = _invoke("trace", "slice", str(TRACE), "--last", "10m", "--speedup", speedup,
                           "-o", str(out))
    assert code == 2, output
    assert "--speedup" in output and not out.exists()


# -- timestamps at ingest (item 2) ---------------------------------------------------------
MOON = {"input_length": 10, "output_length": 2, "hash_ids": [1]}


def _mooncake(tmp_path: pathlib.Path, stamps: list[float]) -> pathlib.Path:
    src = tmp_path / "m.jsonl"
    src.write_text("".join(json.dumps({"timestamp": t, **MOON}) + "\n" for t in stamps))
    return src


def test_a_timestamp_far_from_the_others_is_refused_with_its_line(tmp_path: pathlib.Path) -> None:
    src = _mooncake(tmp_path, [0, 1000, 1e29, 2000])
    out = tmp_path / "o.parquet"
    run = run_tuner("ingest", str(src), "-o", str(out), cwd=tmp_path)
    assert not run.traceback and run.returncode == 2, run.output
    assert f"{src}:3: timestamp: " in run.output and "spans at most 366 days" in run.output
    assert not out.exists()
    # under --on-error skip the good records stay, and stats stays small
    run = run_tuner("ingest", str(src), "-o", str(out), "--on-error", "skip", cwd=tmp_path)
    assert run.returncode == 0, run.output
    run = run_tuner("trace", "stats", str(out), "--json", cwd=tmp_path, memory_mb=4096)
    assert run.returncode == 0 and not run.traceback, run.output


@pytest.mark.parametrize("unit,scale", [("s", 1.0), ("ms", 1e3), ("us", 1e6), ("ns", 1e9)])
def test_openai_epoch_units_are_detected(tmp_path: pathlib.Path, unit: str, scale: float) -> None:
    src = tmp_path / "a.jsonl"
    base = 1_700_000_000  # 2023-11-14T22:13:20Z
    src.write_text("".join(json.dumps({
        "timestamp": int((base + i) * scale), "request": {"prompt": "hi"},
        "usage": {"prompt_tokens": 3, "completion_tokens": 2}}) + "\n" for i in range(3)))
    code, out = _invoke("ingest", str(src), "-o", str(tmp_path / "o.parquet"), "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["origin_utc"].startswith("2023-11-14T22:13:20")
    assert report["duration_s"] == pytest.approx(2.0)


@pytest.mark.parametrize("scale", [1e3, 1e6])  # Mooncake documents ms: epoch us and ns
def test_mooncake_epoch_in_a_finer_unit_is_read_by_magnitude(tmp_path: pathlib.Path,
                                                              scale: float) -> None:
    base = 1_700_000_000
    src = _mooncake(tmp_path, [int((base + i) * 1e3 * scale) for i in range(3)])
    code, out = _invoke("ingest", str(src), "-o", str(tmp_path / "o.parquet"), "--json")
    assert code == 0, out
    assert json.loads(out)["duration_s"] == pytest.approx(2.0)


def test_burstgpt_epoch_milliseconds(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "b.csv"
    src.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                   + "".join(f"{1_700_000_000_000 + 500 * i},gpt,3,4,7,x\n" for i in range(5)))
    code, out = _invoke("ingest", str(src), "-o", str(tmp_path / "o.parquet"), "--json")
    assert code == 0, out
    assert json.loads(out)["duration_s"] == pytest.approx(2.0)


def _widened(tmp_path: pathlib.Path, column: str, values: pa.Array, rows: int) -> pathlib.Path:
    """The trace's first ``rows`` rows with ``column`` stored as another writer might
    (int64 where the schema says int32, float64 lengths)."""
    table = pq.read_table(TRACE).slice(0, rows)
    kv = pq.ParquetFile(TRACE).metadata.metadata
    out = tmp_path / f"wide-{column}.parquet"
    idx = table.schema.get_field_index(column)
    pq.write_table(table.set_column(idx, column, values).replace_schema_metadata(kv), out)
    return out


def _column(column: str, rows: int, dtype: type, at: int | None = None,
            value: object = None) -> pa.Array:
    values = np.asarray(pq.read_table(TRACE, columns=[column]).column(column)
                        .to_pylist()[:rows], dtype=dtype)
    if at is not None:
        values[at] = value
    return pa.array(values)


WIDE_BAD = [("priority", np.int64, 2**40, "column priority: row 6 is 1099511627776"),
            ("priority", np.float64, 1.5, "column priority: row 6 is 1.5"),
            ("input_len", np.float64, 100.5, "column input_len: row 6 is 100.5"),
            ("output_len", np.float64, 10.5, "column output_len: row 6 is 10.5")]


@pytest.mark.parametrize("column,dtype,value,says", WIDE_BAD)
def test_a_value_the_replay_cannot_pack_is_one_line(
        tmp_path: pathlib.Path, column: str, dtype: type, value: object, says: str) -> None:
    """The replay packs lengths and priorities as int32 (docs/performance.md, fourth
    memory round): a wider writer's value beyond that, or a fraction, was a pyarrow
    traceback at the replay's start; it is refused at read, naming file, row and column."""
    bad = _widened(tmp_path, column, _column(column, 50, dtype, 5, value), 50)
    code, out = _invoke("replay", str(bad), "--model", "llama-3.1-8b")
    assert code == 2, out
    assert says in out and str(bad) in out and "Traceback" not in out


def test_wider_columns_with_good_values_replay(tmp_path: pathlib.Path) -> None:
    """Whole float lengths and an int64 or all-null priority are good values: they replay."""
    for column, values in [("input_len", _column("input_len", 30, np.float64)),
                           ("priority", _column("priority", 30, np.int64)),
                           ("priority", pa.nulls(30, pa.int32()))]:
        path = _widened(tmp_path, column, values, 30)
        code, out = _invoke("replay", str(path), "--model", "llama-3.1-8b", "--json")
        assert code == 0, (column, out[-2000:])
