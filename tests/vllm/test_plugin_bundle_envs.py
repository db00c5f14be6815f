"""``tuner export --format plugin -o DIR`` loads in a vLLM environment without tuner."""

from __future__ import annotations

import json
import os
import pathlib
import stat
import subprocess
import sys

import pytest
from click.testing import CliRunner
from vllm_env import MODEL_DIR, ROOT

from tuner.cli import cli

pytestmark = pytest.mark.vllm

PROFILE = ROOT / "profiles" / "agentic-mi355x.yaml"


def _export(folder: pathlib.Path, version: str) -> str:
    result = CliRunner().invoke(cli, ["export", str(PROFILE), "--format", "plugin",
                                      "--vllm-version", version, "--no-async-scheduling",
                                      "-o", str(folder)])
    assert result.exit_code == 0, result.output
    return result.output


def test_bundle_loads_and_runs_in_a_bare_vllm(any_vllm: tuple[str, str],
                                              tmp_path: pathlib.Path) -> None:
    version, python = any_vllm
    bundle = tmp_path / "plugin"
    out = _export(bundle, {"0.33": "0.33.0", "0.32": "0.32.0"}[version])
    assert f"export PYTHONPATH={bundle}" in out
    assert "--scheduler-cls tuner.vllm_plugin.CacheAwareScheduler" in out
    for path in bundle.rglob("*"):
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(bundle), HF_HUB_OFFLINE="1", VLLM_TARGET_DEVICE="cpu")
    proc = subprocess.run([python, str(ROOT / "tests" / "vllm" / "scenarios" / "bundle_load.py"),
                           str(ROOT), str(MODEL_DIR)], capture_output=True, text=True,
                          timeout=600, env=env, cwd=work)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
    assert proc.returncode == 0
    rows = {r["step"]: r for r in (json.loads(x) for x in proc.stdout.splitlines()
                                   if x.startswith("{"))}
    imp = rows["import"]
    assert not imp["repo_on_path"], "the test would not show the bundle is self-contained"
    assert imp["plugin_file"].startswith(str(bundle)) and imp["tuner_file"].startswith(str(bundle))
    assert imp["heavy"] == []
    assert imp["classes"] == ["CacheAwareScheduler", "CacheAwareAsyncScheduler"]
    run = rows["run"]
    assert run["plugin_file"].startswith(str(bundle))
    assert (run["step1"], run["step2"]) == ({"warm": 16}, {"cold": 48}), run
    assert run["reorders"] == 1
