"""``tuner fidelity`` end to end, against each vLLM environment."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from parity_cases import agentic_trace

from tuner.cli import cli

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("flag", ["--async-scheduling", "--no-async-scheduling"])
def test_fidelity_command_json(any_vllm: tuple[str, str], flag: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """PSI=4 with window 16, in both scheduling modes: parity on 0.33 (local cadence) and
    on 0.32, where the command picks the twin's prefill_interval_mode='off' from the
    installed version."""
    version, python = any_vllm
    path = tmp_path / "agentic.parquet"
    agentic_trace().write(path)
    res = CliRunner().invoke(cli, [
        "fidelity", str(path), "--vllm-python", python, "--hardware", "h200",
        "--model", "llama-3.1-8b", "--block-size", "16", "--num-gpu-blocks", "200",
        "--max-model-len", "8192", "--set", "max_num_batched_tokens=512",
        "--set", "max_num_seqs=64", "--set", "prefill_schedule_interval=4",
        "--set", "cache_aware_admission_window=16", "--set", "cache_aware_admission_threshold=0.5",
        flag, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["async_scheduling"] is (flag == "--async-scheduling")
    mode = "async scheduling (batch queue of depth 2)" if flag == "--async-scheduling" else \
        "no async scheduling"
    assert mode in report["notes"], report["notes"]
    assert report["identical"] is True and report["identical_pct"] == 100.0, report
    assert report["num_compared"] > 1000
    assert report["speed_ratio"] > 0
    mode_note = [n for n in report["notes"] if "prefill_interval_mode" in n]
    assert bool(mode_note) == (version == "0.32"), report["notes"]
