"""``--async-scheduling/--no-async-scheduling`` on every command that models a deployment.

The flag reaches the ``Target`` each command builds (``tuner replay``, ``tune``,
``tune-log``, ``fidelity``, ``validate``, ``calibrate``); the replay resolves it as vLLM
0.33.0 does (on for GPU targets) and reports the mode in its summary and JSON; a retune
config takes it as a target key.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import pytest
from click.testing import CliRunner
from replay_traces import make_requests

from tuner.cli import cli
from tuner.trace.schema import TraceMetadata
from tuner.trace.store import write_trace

BASE = ["--hardware", "h200", "--model", "llama-3.1-8b", "--tp", "1", "--block-size", "16",
        "--num-gpu-blocks", "4000"]
MODES = {(): None, ("--async-scheduling",): True, ("--no-async-scheduling",): False}


@pytest.fixture
def trace_path(tmp_path: pathlib.Path) -> str:
    meta = TraceMetadata(hash_block_size=32, source_format="synth:test")
    return str(write_trace(tmp_path / "trace.parquet", make_requests(20, hbs=32), meta))


def replay_json(*args: str) -> dict[str, Any]:
    res = CliRunner().invoke(cli, ["replay", *args, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_replay_defaults_to_async_on_a_gpu_target_and_reports_the_mode(trace_path: str) -> None:
    assert replay_json(trace_path, *BASE)["async_scheduling"] is True  # vLLM 0.33.0 on CUDA
    assert replay_json(trace_path, *BASE, "--async-scheduling")["async_scheduling"] is True
    assert replay_json(trace_path, *BASE, "--no-async-scheduling")["async_scheduling"] is False


def test_replay_table_names_the_mode(trace_path: str) -> None:
    res = CliRunner().invoke(cli, ["replay", trace_path, *BASE, "--no-async-scheduling"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "no async scheduling" in res.output
    row = [line for line in res.output.splitlines() if "async_scheduling" in line]
    assert len(row) == 1 and row[0].split()[-2:] == ["false", row[0].split()[-1]]
    assert "false" in row[0] and "true" not in row[0]


def test_a_cpu_platform_target_resolves_sync(trace_path: str) -> None:
    """vLLM's CPU platform forces --no-async-scheduling (the CI server's hardware YAML)."""
    cpu = str(pathlib.Path(__file__).resolve().parents[1] / "data" / "serve" / "cpu-epyc-2core.yaml")
    args = [trace_path, "--hardware", cpu, "--model", "llama-3.1-8b", "--block-size", "16",
            "--num-gpu-blocks", "4000"]
    assert replay_json(*args)["async_scheduling"] is False
    assert replay_json(*args, "--async-scheduling")["async_scheduling"] is False


class Reached(Exception):
    """Raised by a stand-in for the command's work: the target got this far."""

    def __init__(self, mode: bool | None) -> None:
        super().__init__(mode)
        self.mode = mode


def _invoke(args: list[str]) -> Any:
    res = CliRunner().invoke(cli, args)
    assert isinstance(res.exception, Reached), (res.exit_code, res.output, res.exception)
    return res.exception.mode


@pytest.mark.parametrize("flags,mode", sorted(MODES.items(), key=str))
def test_tune_and_tune_log_take_the_flag(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path,
                                         trace_path: str, flags: tuple[str, ...],
                                         mode: bool | None) -> None:
    import tuner.cli._tune as tune_cli

    def stand_in(trace: str, output: str, kw: dict[str, Any], flags: Any,
                 router_flags: Any) -> Any:
        raise Reached(flags.target().async_scheduling)

    monkeypatch.setattr(tune_cli, "_run_tune", stand_in)
    out = str(tmp_path / "p.yaml")
    assert _invoke(["tune", trace_path, *BASE, *flags, "-o", out]) is mode
    log = tmp_path / "requests.jsonl"
    log.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 20,
                               "hash_ids": [1, 2]}) + "\n")
    assert _invoke(["tune-log", str(log), *BASE, *flags, "--no-progress", "-o", out]) is mode


@pytest.mark.parametrize("flags,mode", sorted(MODES.items(), key=str))
def test_fidelity_takes_the_flag(monkeypatch: pytest.MonkeyPatch, trace_path: str,
                                 flags: tuple[str, ...], mode: bool | None) -> None:
    import tuner.fidelity.parity as parity
    import tuner.fidelity.runs as runs
    from tuner import vllm_compat

    def stand_in(trace: Any, settings: Any, *, target: Any, **kw: Any) -> Any:
        raise Reached(target.async_scheduling)

    monkeypatch.setattr(parity, "run_parity", stand_in)
    monkeypatch.setattr(vllm_compat, "find_vllm_python", lambda explicit, purpose: explicit)
    from tuner.sim.settings import SimOptions

    # the command adds its drafts (--speculative-config) to these: a real SimOptions
    monkeypatch.setattr(runs, "twin_options_for", lambda python, mode: SimOptions())
    assert _invoke(["fidelity", trace_path, "--vllm-python", sys.executable, *BASE,
                    *flags]) is mode


@pytest.mark.parametrize("profile_mode", [True, False])
@pytest.mark.parametrize("flags,mode", sorted(MODES.items(), key=str))
def test_validate_runs_the_profiles_mode_unless_the_flag_says(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, trace_path: str,
        flags: tuple[str, ...], mode: bool | None, profile_mode: bool) -> None:
    import tuner.fidelity.validate as validate
    from tests.profile.test_export import make_profile
    from tuner.profile import save_profile

    profile = save_profile(make_profile(async_scheduling=profile_mode), tmp_path / "p.yaml")
    seen: list[Any] = []

    def stand_in(profile: Any, trace: Any, *, server: Any, target: Any, **kw: Any) -> Any:
        seen.append(server.async_scheduling)
        raise Reached(target.async_scheduling)

    monkeypatch.setattr(validate, "validate", stand_in)
    got = _invoke(["validate", str(profile), trace_path, *BASE, *flags, "--launch",
                   "--vllm-python", sys.executable])
    expected = profile_mode if mode is None else mode
    assert got is expected and seen == [expected]  # the twin and the launched server


def test_calibrate_probes_sync_and_refuses_async(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: pathlib.Path) -> None:
    import tuner.fidelity.runs as runs

    def stand_in(options: Any, **kw: Any) -> Any:
        raise Reached(options.async_scheduling)

    monkeypatch.setattr(runs, "calibrate_server", stand_in)
    out = str(tmp_path / "calib.yaml")
    args = ["calibrate", *BASE, "--endpoint", "http://127.0.0.1:9", "-o", out]
    assert _invoke(args + ["--no-async-scheduling"]) is None  # attached: the server's own
    res = CliRunner().invoke(cli, args + ["--async-scheduling"])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert res.output.startswith("Error: --async-scheduling: calibrate times whole steps")


def test_retune_config_takes_async_scheduling(tmp_path: pathlib.Path) -> None:
    from tuner.errors import ConfigError
    from tuner.jobs.config import load_config

    base = ("sources: [logs/*.jsonl]\nstate_dir: state\nprofile: prod\nprofiles_dir: p\n"
            "target:\n  hardware: mi355x\n  model: llama-3.1-70b\n  tp: 8\n")
    path = tmp_path / "retune.yaml"
    path.write_text(base + "  async_scheduling: false\n")
    assert load_config(path).make_target().async_scheduling is False
    path.write_text(base)
    assert load_config(path).make_target().async_scheduling is None  # = as vLLM resolves
    path.write_text(base + "  async_scheduling: maybe\n")
    with pytest.raises(ConfigError, match=r"retune.yaml:9: target.async_scheduling: expected"):
        load_config(path)
