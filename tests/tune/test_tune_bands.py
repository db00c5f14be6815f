"""The tune table, the recommendation lines and the profile carry error bands."""

from __future__ import annotations

import pathlib

import yaml
from click.testing import CliRunner

from tuner.cli import cli
from tuner.perf.fit.bands import load_bands

TARGET = ["--hardware", "mi355x", "--model", "llama-3.1-70b", "--tp", "8",
          "--num-gpu-blocks", "1500"]


def test_tune_front_recommendation_and_profile_carry_bands(small_trace: pathlib.Path,
                                                             tmp_path: pathlib.Path) -> None:
    out = tmp_path / "t.yaml"
    res = CliRunner().invoke(cli, ["tune", str(small_trace), *TARGET, "--trials", "3",
                                   "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "likely " in res.output  # the front table's band column
    lines = [ln for ln in res.output.splitlines() if "error bands (training window):" in ln]
    assert len(lines) == 1 and ", likely " in lines[0] and "TTFT p90" in lines[0]
    bands = yaml.safe_load(out.read_text())["predicted"]["bands"]
    assert bands["family"] == "amd" and bands["regime"] in ("below", "above")
    assert not bands["calibrated"]
    train = yaml.safe_load(out.read_text())["predicted"]["train"]["tuned"]
    cell = load_bands()[f"ttft/amd/{bands['regime']}"]
    lo, hi = bands["train"]["ttft_p90_s"]
    assert abs(lo - train["ttft_p90_s"] * cell.low) <= 1e-5 * lo
    assert abs(hi - train["ttft_p90_s"] * cell.high) <= 1e-5 * hi
