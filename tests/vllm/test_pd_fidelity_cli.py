"""``tuner fidelity --pd``: every pool engine of a disaggregated replay against vLLM 0.33.0's
own scheduler with its NIXL connector (``tuner.fidelity.pd_parity``), end to end."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from vllm_env import vllm_python

from tuner.cli import cli

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.xdist_group("vllm:tests/vllm/test_pd_fidelity_cli.py")]


def _args(trace, python: str, *extra: str) -> list[str]:
    return ["fidelity", str(trace), "--vllm-python", python, "--hardware", "h200",
            "--model", "llama-3.1-8b", "--num-gpu-blocks", "600", *extra]


@pytest.mark.parametrize("pd, extra", [
    ("1:2", ("--prefill-tp", "2", "--no-async-scheduling")),
    ("2:1", ("--async-scheduling", "--prefill-max-num-batched-tokens", "1024",
             "--prefill-max-num-seqs", "4")),
    ("1:2", ("--async-scheduling", "--pd-transfer-mode", "push")),
])
def test_every_pool_engine_matches_vllms_scheduler(mooncake_head_trace, pd, extra) -> None:
    res = CliRunner().invoke(cli, _args(mooncake_head_trace, vllm_python("0.33"), "--pd", pd,
                                        *extra, "--json"), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    p, d = (int(x) for x in pd.split(":"))
    assert [e["role"] for e in report["engines"]] == ["prefill"] * p + ["decode"] * d
    assert report["identical"] is True
    for engine in report["engines"]:
        assert engine["num_compared"] > 0 and engine["identical_pct"] == 100.0, engine
    assert sum(e["num_compared"] for e in report["engines"] if e["role"] == "decode") > 1000
    mode = "no async" if "--no-async-scheduling" in extra else "async"
    assert f"), {mode} scheduling" in report["notes"][0]


def test_a_decoder_scheduled_differently_is_found(mooncake_head_trace, monkeypatch) -> None:
    """The check can fail: vLLM's decoder given a running limit of 2 where the twin's has
    the default schedules other steps, and the command says so with exit code 1."""
    import tuner.fidelity.pd_parity as pd_parity

    real = pd_parity.pd_engine_jobs

    def other_decoder(*args, **kwargs):
        jobs = real(*args, **kwargs)
        for job in jobs:
            if job["pd_role"] == "decode":
                job["settings"] = {**job["settings"], "max_num_seqs": 2}
        return jobs

    monkeypatch.setattr(pd_parity, "pd_engine_jobs", other_decoder)
    res = CliRunner().invoke(cli, _args(mooncake_head_trace, vllm_python("0.33"),
                                        "--pd", "1:1"), catch_exceptions=False)
    assert res.exit_code == 1, res.output
    assert "P/D parity: DIFFERENT" in res.output
    assert "== prefill 0" in res.output and "== decode 0" in res.output


def test_serve_flags_are_a_replay_thing(mooncake_head_trace) -> None:
    res = CliRunner().invoke(cli, _args(mooncake_head_trace, vllm_python("0.33"), "--pd", "1:1",
                                        "--pd-serve"))
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "use them on tuner replay" in res.output
