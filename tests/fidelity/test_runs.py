"""``tuner.fidelity.runs``: the calibration server's policy and the parity run's twin options
(what ``tuner calibrate`` and ``tuner fidelity`` decide), without vLLM."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from tuner.fidelity import runs
from tuner.fidelity.calibrate import ProbePlan
from tuner.serve.server import ServerOptions


def test_probe_settings_keep_max_num_seqs_within_the_budget() -> None:
    assert runs.probe_settings(2048).max_num_batched_tokens == 2048
    assert runs.probe_settings(2048).max_num_seqs == 256
    small = runs.probe_settings(100)
    assert (small.max_num_batched_tokens, small.max_num_seqs) == (100, 100)


class _Recorder:
    """Stands in for VllmServer: records how it was built and started."""

    seen: dict[str, Any] = {}

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.startup_s, self.vllm_version = 1.5, "0.32.0"
        _Recorder.seen["options"] = options

    def __enter__(self) -> "_Recorder":
        return self

    def __exit__(self, *exc: object) -> None:
        _Recorder.seen["stopped"] = True

    def start(self, settings: Any) -> "_Recorder":
        _Recorder.seen["settings"] = settings
        return self


def _calibrate_stub(server: Any, **kw: Any) -> str:
    _Recorder.seen["calibrate"] = kw
    return "result"


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    _Recorder.seen = {}
    monkeypatch.setattr(runs, "VllmServer", _Recorder)
    monkeypatch.setattr(runs, "calibrate", _calibrate_stub)
    return _Recorder.seen


def test_a_launched_calibration_server_runs_synchronous_with_the_probe_budget(
        recorded: dict[str, Any]) -> None:
    launch = ServerOptions(vllm_python="/bin/sh", model="tests/data/tiny-llama")
    lines: list[str] = []
    plan = ProbePlan(prefill_lens=(64,))
    out = runs.calibrate_server(launch, hardware="h200", model="llama-3.1-8b", tp=2, plan=plan,
                                max_num_batched_tokens=1024, max_model_len=2048,
                                progress=lines.append, quantization="fp8")
    assert out == "result" and recorded["stopped"]
    assert recorded["options"].async_scheduling is False
    assert recorded["settings"] == runs.probe_settings(1024)
    assert recorded["calibrate"] == {"hardware": "h200", "model": "llama-3.1-8b", "tp": 2,
                                     "plan": plan, "max_num_batched_tokens": 1024,
                                     "max_model_len": 2048, "progress": lines.append,
                                     "quantization": "fp8", "kv_cache_dtype": None}
    assert lines == ["server ready (1.5 s, vLLM 0.32.0)"]


def test_an_attached_server_keeps_its_settings_and_its_budget_is_not_assumed(
        recorded: dict[str, Any]) -> None:
    attach = ServerOptions(endpoint="http://127.0.0.1:1")
    runs.calibrate_server(attach, hardware="h200", model="llama-3.1-8b")
    assert recorded["options"] is attach  # no async_scheduling forced on a borrowed server
    assert recorded["calibrate"]["max_num_batched_tokens"] is None


@pytest.mark.parametrize("version,mode", [("0.32.0", "off"), ("0.32.1+cpu", "off"),
                                          ("0.33.0", "local"), ("0.34.0.dev1", "local")])
def test_prefill_interval_mode_follows_the_release(version: str, mode: str) -> None:
    from tuner import vllm_compat

    assert vllm_compat.prefill_interval_mode(version) == mode


def _python_with_vllm_metadata(root: Path, version: str) -> str:
    """This interpreter, wrapped so that its distribution metadata lists ``vllm==version``
    (a ``.dist-info`` on its path, no vLLM code): the version is read the way a real
    environment's is, whatever the query runs."""
    site = root / version / "site"
    info = site / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    wrapper = root / version / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return os.fspath(wrapper)


@pytest.mark.parametrize("version,mode", [("0.32.0", "off"), ("0.33.0", "local")])
def test_twin_options_read_the_installed_version(tmp_path: Path, version: str,
                                                 mode: str) -> None:
    python = _python_with_vllm_metadata(tmp_path, version)
    options = runs.twin_options_for(python)
    assert options.prefill_interval_mode == mode
    # 0.33.0 goes on after a priority self-preemption (scheduler.py:982-992); 0.32.0 breaks
    assert options.self_preemption_continues is (version == "0.33.0")


def test_an_explicit_mode_wins_over_the_version(tmp_path: Path) -> None:
    python = _python_with_vllm_metadata(tmp_path, "0.32.0")
    options = runs.twin_options_for(python, "dp")
    assert options.prefill_interval_mode == "dp"
    assert options.self_preemption_continues is False
