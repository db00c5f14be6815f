"""``tuner replay`` through Click's CliRunner: exit codes, JSON keys, error lines."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from replay_traces import make_requests

from tuner.cli import cli
from tuner.trace.schema import TraceMetadata
from tuner.trace.store import write_trace

BASE = ["--hardware", "h200", "--model", "llama-3.1-8b", "--tp", "1", "--block-size", "16",
        "--num-gpu-blocks", "4000"]


@pytest.fixture
def trace_path(tmp_path):
    meta = TraceMetadata(hash_block_size=32, source_format="synth:test")
    return str(write_trace(tmp_path / "trace.parquet", make_requests(20, hbs=32), meta))


def invoke(*args):
    return CliRunner().invoke(cli, ["replay", *args], catch_exceptions=False)


def test_json_summary(trace_path):
    res = invoke(trace_path, *BASE, "--set", "cache_aware_admission_window=16", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    for key in ("p90_interactivity", "output_throughput_per_gpu", "total_throughput_per_gpu",
                "prefix_cache_hit_rate", "ttft_p90_s", "preemptions", "simulated_s", "wall_s",
                "speed_ratio", "settings", "target"):
        assert key in data
    assert data["num_requests"] == 20 and data["num_finished"] == 20
    assert data["settings"]["cache_aware_admission_window"] == 16
    assert data["p90_interactivity"] > 0


def test_table_output_and_parquet(tmp_path, trace_path):
    out = tmp_path / "res.parquet"
    res = invoke(trace_path, *BASE, "--concurrency", "2", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "interactivity (tok/s/user)" in res.output
    assert "slowest 10%" in res.output
    assert f"wrote 20 request rows to {out}" in res.output
    assert pq.read_table(out).num_rows == 20


def test_measure_window(trace_path):
    res = invoke(trace_path, *BASE, "--measure-from", "0.3", "--json")
    assert res.exit_code == 0, res.output
    assert 0 < json.loads(res.output)["num_requests"] < 20


@pytest.mark.parametrize("args, error", [
    (["--set", "max_num_seqs=abc"], "Error: --set max_num_seqs='abc': expected an integer\n"),
    (["--set", "bogus=1"], "Error: --set 'bogus=1': unknown scheduler setting 'bogus'; known: "),
    (["--set", "watermark=2"], "Error: watermark=2.0 must be in [0, 1)\n"),
    (["--speedup", "2", "--concurrency", "4"],
     "Error: use just one of --speedup (open loop) or --concurrency (closed loop)\n"),
    (["--backend", "warp"], "Error: unknown backend 'warp'; available: sim"),
    (["--measure-from", "5", "--measure-to", "1"],
     "Error: --measure-to (1.0) must be greater than --measure-from (5.0)\n"),
    (["--measure-from", "1e6"], "Error: no request arrives in the measure window"),
    (["--hardware", "tpu9"], "Error: "),
])
def test_errors_are_one_line_exit_2(trace_path, args, error):
    res = CliRunner().invoke(cli, ["replay", trace_path, *BASE, *args])
    assert res.exit_code == 2
    assert res.output.startswith(error) or error in res.output
    assert "Traceback" not in res.output
    assert res.output.count("\n") == 1  # one line


def test_bad_trace_file(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    res = CliRunner().invoke(cli, ["replay", str(bad), *BASE])
    assert res.exit_code == 2 and res.output.startswith("Error: ")


def test_help_explains_p90_interactivity_with_example():
    res = CliRunner().invoke(cli, ["replay", "--help"], terminal_width=100)
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert "1 / the p90 over requests of the per-request mean inter-token latency" in text
    assert "slowest 10% of users" in text
    assert "Example:" in res.output and "--set cache_aware_admission_window=16" in res.output
