"""Every replay summary carries its error bands: the Summary, ``--json`` and the printed
table; a calibration file narrows them and says so."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner
from replay_traces import make_requests

from tuner import replay
from tuner.cli import cli
from tuner.metrics import band_lines, summarize, with_bands
from tuner.perf.fit.bands import load_bands
from tuner.perf.presets import resolve_target
from tuner.perf.target import Target
from tuner.trace.schema import TraceMetadata
from tuner.trace.store import write_trace

BASE = ["--hardware", "mi355x", "--model", "llama-3.1-8b", "--tp", "1", "--block-size", "16",
        "--num-gpu-blocks", "4000"]


@pytest.fixture
def trace_path(tmp_path):
    meta = TraceMetadata(hash_block_size=32, source_format="synth:test")
    return str(write_trace(tmp_path / "trace.parquet", make_requests(20, hbs=32), meta))


def _calibration(tmp_path, probes: bool = True) -> str:
    fit = {"vllm_version": "0.33.0"}
    if probes:
        # probes within 10 % (the calibrated floor): narrower than every shipped AMD band,
        # the TPOT one included (x0.88 - x1.13 since the kernels31 refit)
        fit["probes"] = [{"kind": k, "probe": f"{k}{i}", "measured_ms": 10.0 + 0.5 * i,
                          "predicted_ms": 10.0} for k in ("prefill", "decode") for i in range(3)]
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump({"hardware": "mi355x", "model": "llama-3.1-8b", "tp": 1,
                                    "coefficients": {"step_overhead_s": 0.0003}, "fit": fit}))
    return str(path)


def test_summary_carries_bands(trace_path):
    target = Target(hardware="mi355x", model="llama-3.1-8b", tp=1, block_size=16,
                    num_gpu_blocks=4000)
    resolved = resolve_target(target)
    result = replay.run(trace_path, resolved.default_settings, target=target)
    plain = summarize(result)
    assert plain.bands is None and "bands" not in plain.to_dict()
    s = with_bands(plain, result, resolved)
    cells = load_bands()
    assert s.bands.family == "amd" and s.bands.regime in ("below", "above")
    assert s.bands.bands["ttft"] == cells[f"ttft/amd/{s.bands.regime}"]
    data = s.to_dict()["bands"]
    lo, hi = data["likely"]["ttft_p90_s"]
    band = cells[f"ttft/amd/{s.bands.regime}"]
    assert lo == pytest.approx(s.ttft_p90_s * band.low, rel=1e-5)
    assert hi == pytest.approx(s.ttft_p90_s * band.high, rel=1e-5)
    # interactivity is 1/TPOT: its band is the TPOT band turned round
    t = cells[f"tpot/amd/{s.bands.regime}"]
    assert data["likely"]["p90_interactivity"][1] == pytest.approx(
        s.p90_interactivity / t.low, rel=1e-5)
    lines = band_lines(s)
    assert lines[0].startswith("Prediction bands (amd, ") and "uncalibrated" in lines[0]
    assert any(line.strip().startswith("TTFT p90 ") and ", likely " in line for line in lines)


def _replay(*args: str) -> dict:
    res = CliRunner().invoke(cli, ["replay", *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res


def test_json_and_table_carry_bands(trace_path):
    data = json.loads(_replay(trace_path, *BASE, "--json").output)
    assert data["bands"]["family"] == "amd" and not data["bands"]["calibrated"]
    assert set(data["bands"]["likely"]) >= {"ttft_p90_s", "tpot_p90_s", "itl_p90_s",
                                            "output_throughput_per_gpu"}
    out = _replay(trace_path, *BASE).output
    assert "Prediction bands (amd" in out and "TTFT p90" in out and "likely" in out


def test_calibration_narrows_the_replay_bands(tmp_path, trace_path):
    plain = json.loads(_replay(trace_path, *BASE, "--json").output)["bands"]
    cal = json.loads(_replay(trace_path, *BASE, "--calibration", _calibration(tmp_path),
                             "--json").output)["bands"]
    assert cal["calibrated"] and "narrowed by the calibration" in cal["note"]
    for metric in ("ttft", "tpot", "throughput"):
        assert cal[metric]["high"] < plain[metric]["high"]
        assert cal[metric]["source"].startswith("calibration ")
    bare = json.loads(_replay(trace_path, *BASE, "--calibration",
                              _calibration(tmp_path, probes=False), "--json").output)["bands"]
    assert not bare["calibrated"] and "not narrowed" in bare["note"]
    out = _replay(trace_path, *BASE, "--calibration", _calibration(tmp_path)).output
    assert "calibrated): likely = narrowed by the calibration" in out
