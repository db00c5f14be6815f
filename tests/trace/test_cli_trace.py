"""``tuner ingest`` and ``tuner trace ...`` through Click's CliRunner: exit codes and the
exact ``Error:`` lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.durations import parse_duration
from tuner.errors import ConfigError


def _run(*args: str) -> object:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_ingest_then_stats(tmp_path: Path, data: Path) -> None:
    out = tmp_path / "m.parquet"
    res = _run("ingest", str(data / "mooncake_synthetic.jsonl"), "-o", str(out))
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"Ingested 3,993 requests (mooncake, 512-token blocks) -> {out}")
    res = _run("trace", "stats", str(out), "--json")
    assert res.exit_code == 0
    stats = json.loads(res.output)
    assert stats["requests"] == 3993 and stats["ideal_prefix_hit_rate"] == pytest.approx(0.6512, abs=1e-4)
    res = _run("trace", "stats", str(out))
    assert "ideal prefix-hit rate  0.6512 (unbounded cache)" in res.output


def test_ingest_json_report(tmp_path: Path, data: Path) -> None:
    res = _run("ingest", str(data / "burstgpt_sample.csv"), "-o", str(tmp_path / "b.parquet"),
               "--json")
    report = json.loads(res.output)
    assert res.exit_code == 0 and report["requests"] == 4 and report["format"] == "burstgpt-csv"


def test_ingest_bad_line_exit_2_no_output(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
                   '{"timestamp": 1, "input_length": -4, "output_length": 5, "hash_ids": []}\n')
    out = tmp_path / "o.parquet"
    res = _run("ingest", str(src), "-o", str(out))
    assert res.exit_code == 2
    assert res.output == f"Error: {src}:2: input_length: -4 tokens; a prompt has at least 1\n"
    assert not out.exists()
    res = _run("ingest", str(src), "-o", str(out), "--on-error", "skip")
    assert res.exit_code == 0
    assert f"skipped 1 bad records -> {out}.quarantine.jsonl" in res.output
    assert out.exists()


def test_ingest_unknown_format_and_missing_file(tmp_path: Path) -> None:
    odd = tmp_path / "odd.txt"
    odd.write_text("hello\n")
    res = _run("ingest", str(odd), "-o", str(tmp_path / "o.parquet"))
    assert res.exit_code == 2
    assert res.output == (f"Error: {odd}:1: format: unknown format (first line starts 'hello'); "
                          "pass --format mooncake|bailian|vllm-log|openai-jsonl|azure-csv|"
                          "burstgpt-csv\n")
    res = _run("ingest", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o.parquet"))
    assert res.exit_code == 2 and res.output.startswith(f"Error: {tmp_path / 'nope.jsonl'}: cannot open")


def test_ingest_salt_file_created(tmp_path: Path, data: Path) -> None:
    salt = tmp_path / "salt"
    res = _run("ingest", str(data / "azure_code_sample.csv"), "-o", str(tmp_path / "a.parquet"),
               "--salt-file", str(salt))
    assert res.exit_code == 0 and salt.exists() and (salt.stat().st_mode & 0o777) == 0o600


def test_stats_missing_trace(tmp_path: Path) -> None:
    res = _run("trace", "stats", str(tmp_path / "x.parquet"))
    assert res.exit_code == 2
    assert res.output == f"Error: {tmp_path / 'x.parquet'}: no such trace file or directory\n"


def test_slice_and_synth(tmp_path: Path) -> None:
    syn = tmp_path / "s.parquet"
    res = _run("trace", "synth", "--kind", "chat", "--duration", "5m", "--rate", "2",
               "--seed", "1", "-o", str(syn), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["requests"] > 100
    res = _run("trace", "slice", str(syn), "--last", "2m", "--speedup", "2", "-o",
               str(tmp_path / "c.parquet"))
    assert res.exit_code == 0 and res.output.startswith("Wrote ")
    res = _run("trace", "slice", str(syn), "-o", str(tmp_path / "c.parquet"))
    assert res.exit_code == 2 and res.output == "Error: give --start/--end or --last\n"
    res = _run("trace", "slice", str(syn), "--start", "10m", "--end", "20m", "-o",
               str(tmp_path / "d.parquet"))
    assert res.exit_code == 2 and res.output.startswith("Error: no requests in [600.0, 1200.0)")
    assert not (tmp_path / "d.parquet").exists()


def test_synth_random_and_errors(tmp_path: Path) -> None:
    out = tmp_path / "r.parquet"
    res = _run("trace", "synth", "--kind", "random", "--isl", "8192", "--osl", "1024",
               "--range-ratio", "0.8", "--num-prompts", "640", "-o", str(out))
    assert res.exit_code == 0 and res.output == f"Wrote 640 random requests -> {out}\n"
    res = _run("trace", "synth", "--kind", "agentic", "--rate", "2", "-o", str(out))
    assert res.exit_code == 2
    assert res.output == "Error: agentic needs a positive duration (--duration), got None\n"
    res = _run("trace", "synth", "--kind", "chat", "--duration", "1m", "--rate", "1",
               "--isl", "5", "-o", str(out))
    assert res.exit_code == 2 and res.output == "Error: --isl applies to --kind random only\n"
    res = _run("trace", "synth", "--kind", "agentic", "--duration", "2m", "--rate", "1",
               "--param", "turns=5", "--param", "system_prompt_tokens=100,200", "-o",
               str(tmp_path / "p.parquet"))
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("args", [["ingest"], ["trace"], ["trace", "stats"], ["trace", "slice"],
                                  ["trace", "synth"]])
def test_help_has_example(args: list[str]) -> None:
    res = _run(*args, "--help")
    assert res.exit_code == 0
    assert "Example:\n" in res.output


def test_parse_duration() -> None:
    assert parse_duration("1h30m") == 5400 and parse_duration("90") == 90
    assert parse_duration("2d") == 172800 and parse_duration("250ms") == 0.25
    with pytest.raises(ConfigError):
        parse_duration("soon")
