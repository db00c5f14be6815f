"""Ingest mistakes end in one line, ``Error: FILE[:LINE]: ...``, exit 2, never a traceback."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner

from tuner.cli import cli

GOOD = {"timestamp": 0, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2]}
NOT_UTF8 = json.dumps({**GOOD, "timestamp": 5}).encode()[:-1] + b', "note": "\xff\xfe"}'


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"uncaught {result.exception!r}\n{result.output}")
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def _good_lines(n: int) -> bytes:
    return b"".join(json.dumps({**GOOD, "timestamp": i}).encode() + b"\n" for i in range(n))


@pytest.mark.parametrize("fmt", ["mooncake", "openai-jsonl"])
def test_non_utf8_line_is_named(tmp_path: Path, fmt: str) -> None:
    src = tmp_path / "log.jsonl"
    if fmt == "mooncake":
        src.write_bytes(_good_lines(2) + NOT_UTF8 + b"\n")
    else:
        good = json.dumps({"timestamp": 1, "request": {"prompt": "hello"},
                           "usage": {"prompt_tokens": 3, "completion_tokens": 2}}).encode()
        src.write_bytes(good + b"\n" + good[:-1] + b', "x": "\xff"}\n')
    code, out = _run("ingest", str(src), "-o", str(tmp_path / "o.parquet"), "--format", fmt)
    assert code == 2
    assert f"{src}:3: json: not UTF-8 (byte 0xff" in out or f"{src}:2: json: not UTF-8" in out
    assert not (tmp_path / "o.parquet").exists()


def test_non_utf8_line_is_quarantined_under_skip(tmp_path: Path) -> None:
    src = tmp_path / "log.jsonl"
    src.write_bytes(_good_lines(2) + NOT_UTF8 + b"\n")
    code, out = _run("ingest", str(src), "-o", str(tmp_path / "o.parquet"), "--on-error", "skip")
    assert code == 0, out
    assert "skipped 1 bad records" in out
    rows = [json.loads(x) for x in (tmp_path / "o.parquet.quarantine.jsonl").read_text().splitlines()]
    assert [(r["line"], r["error"].split(" (")[0]) for r in rows] == [(3, "json: not UTF-8")]


def test_truncated_gzip(tmp_path: Path) -> None:
    src = tmp_path / "log.jsonl.gz"
    whole = gzip.compress(_good_lines(2000))
    src.write_bytes(whole[:len(whole) // 2])
    code, out = _run("ingest", str(src), "-o", str(tmp_path / "o.parquet"))
    assert code == 2, out
    assert out.strip() != "Aborted!"
    assert f"Error: {src}: gzip data is truncated or corrupt" in out
    assert not (tmp_path / "o.parquet").exists()


def test_truncated_zstd(tmp_path: Path) -> None:
    """zstandard's stream reader ends quietly at a cut; the log must not ingest as shorter."""
    src = tmp_path / "log.jsonl.zst"
    whole = zstandard.ZstdCompressor().compress(_good_lines(2000))
    src.write_bytes(whole[:len(whole) // 2])
    code, out = _run("ingest", str(src), "-o", str(tmp_path / "o.parquet"), "--format", "mooncake")
    assert code == 2, out
    assert f"Error: {src}: zstd data is truncated or corrupt" in out


def test_multi_frame_zstd_reads_every_frame(tmp_path: Path) -> None:
    data = _good_lines(300)
    cut = data.index(b"\n", len(data) // 2) + 1
    c = zstandard.ZstdCompressor()
    src = tmp_path / "log.jsonl.zst"
    src.write_bytes(c.compress(data[:cut]) + c.compress(data[cut:]))
    code, out = _run("ingest", str(src), "-o", str(tmp_path / "o.parquet"))
    assert code == 0, out
    assert "Ingested 300 requests" in out


@pytest.mark.parametrize("field", ["input_length", "output_length"])
def test_absurd_length_message_prints_the_logged_number(tmp_path: Path, field: str) -> None:
    src = tmp_path / "log.jsonl"
    src.write_text(json.dumps({**GOOD, field: 10**12}) + "\n")
    code, out = _run("ingest", str(src), "-o", str(tmp_path / "o.parquet"))
    assert code == 2
    assert f"{field}: 1,000,000,000,000 tokens is absurd (limit 16,777,216)" in out


def test_absurd_length_in_csv(tmp_path: Path) -> None:
    src = tmp_path / "azure.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:15:46.6805900,1000000000000,10\n")
    code, out = _run("ingest", str(src), "-o", str(tmp_path / "o.parquet"))
    assert code == 2
    assert "1,000,000,000,000 tokens is absurd" in out


def test_output_under_a_file_and_in_proc(tmp_path: Path) -> None:
    src = tmp_path / "log.jsonl"
    src.write_bytes(_good_lines(3))
    existing = tmp_path / "existing.parquet"
    assert _run("ingest", str(src), "-o", str(existing))[0] == 0
    code, out = _run("ingest", str(src), "-o", str(existing / "sub.parquet"))
    assert code == 2 and f"{existing} is a file, not a folder" in out
    code, out = _run("ingest", str(src), "-o", "/proc/x.parquet")
    assert code == 2 and "Error: /proc/x.parquet: cannot create a file in /proc" in out


def test_export_of_a_trace_is_a_one_line_error(tmp_path: Path) -> None:
    src = tmp_path / "log.jsonl"
    src.write_bytes(_good_lines(3))
    trace = tmp_path / "some.parquet"
    assert _run("ingest", str(src), "-o", str(trace))[0] == 0
    code, out = _run("export", str(trace))
    assert code == 2
    assert out.strip() == f"Error: {trace}: cannot read profile: not UTF-8 text (a Parquet file)"
