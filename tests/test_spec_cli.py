"""``tuner replay --speculative-config``: the summary and JSON with drafts and acceptance,
the acceptance read from a vLLM server log, and one-line errors (exit 2) for bad input."""

from __future__ import annotations

import json
import pathlib

import pytest
from click.testing import CliRunner

from tuner.cli import cli

MTP = '{"method": "mtp", "num_speculative_tokens": 2}'
LOG = ("INFO 12-01 10:00:00 [metrics.py:121] SpecDecoding metrics: Mean acceptance length: "
       "2.40, Accepted throughput: 100.00 tokens/s, Drafted throughput: 150.00 tokens/s, "
       "Accepted: 1400 tokens, Drafted: 2000 tokens, Per-position acceptance rate: 0.800, "
       "0.600, Avg Draft acceptance rate: 70.0%\n")


def _replay(trace: pathlib.Path, *args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["replay", str(trace), "--model", "llama-3.1-8b",
                                    "--hardware", "h200", *args])


def test_replay_reports_drafts_and_acceptance(mooncake_head_trace: pathlib.Path,
                                              tmp_path: pathlib.Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("startup\n" + LOG)
    r = _replay(mooncake_head_trace, "--speculative-config", MTP, "--spec-acceptance",
                str(log), "--json")
    assert r.exit_code == 0, r.output
    spec = json.loads(r.output)["speculative"]
    assert spec["speculative_config"] == json.loads(MTP)
    assert spec["acceptance"] == [0.8, 0.6]  # the log's per-position rates
    assert spec["num_drafts"] > 0 and spec["num_draft_tokens"] == 2 * spec["num_drafts"]
    assert 1.0 < spec["mean_acceptance_length"] < 3.0
    text = _replay(mooncake_head_trace, "--speculative-config", MTP)  # published default
    assert text.exit_code == 0, text.output
    assert "mean acceptance length" in text.output and "mtp k=2, acceptance 0.85" in text.output


@pytest.mark.parametrize("args, needle", [
    (["--speculative-config", '{"method": "mtp"'], "not JSON"),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'],
     "--spec-acceptance"),
    (["--speculative-config", MTP, "--spec-acceptance", "0.4,0.9"], "non-increasing"),
    (["--spec-acceptance", "0.5"], "needs --speculative-config"),
])
def test_bad_speculative_input_is_one_line_exit_2(mooncake_head_trace: pathlib.Path,
                                                  args: list[str], needle: str) -> None:
    r = _replay(mooncake_head_trace, *args)
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.vllm
def test_fidelity_with_drafts_is_identical(mooncake_head_trace: pathlib.Path) -> None:
    """``tuner fidelity --speculative-config``: vLLM's AsyncScheduler (MTP on an H200
    resolves to async scheduling) fed the same drafts and accepted counts, every step
    identical."""
    from tests.vllm.vllm_env import vllm_python

    r = CliRunner().invoke(cli, [
        "fidelity", str(mooncake_head_trace), "--vllm-python", vllm_python("0.33"),
        "--hardware", "h200", "--model", "llama-3.1-8b", "--num-gpu-blocks", "3000",
        "--speculative-config", MTP, "--spec-acceptance", "0.7,0.4", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["async_scheduling"] is True
    assert report["identical_pct"] == 100.0 and report["num_compared"] > 0
