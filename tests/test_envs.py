"""A missing outside environment skips locally and fails in CI (tests/envs.py)."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

from tests.envs import env_python, missing_env, tuner_executable

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_missing_env_skips_locally_and_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNER_REQUIRE_ENVS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no chromium"):
        missing_env("no chromium")
    monkeypatch.setenv("TUNER_REQUIRE_ENVS", "1")
    with pytest.raises(pytest.fail.Exception, match="no chromium .*required"):
        missing_env("no chromium")
    monkeypatch.delenv("TUNER_VLLM032_PYTHON", raising=False)
    with pytest.raises(pytest.fail.Exception, match="TUNER_VLLM032_PYTHON is unset"):
        env_python("TUNER_VLLM032_PYTHON", "run .ci/setup-vllm.sh")


def test_ci_requires_every_environment() -> None:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "export TUNER_REQUIRE_ENVS=1" in lines
    test_line = next(i for i, ln in enumerate(lines) if "pytest" in ln and "pip install" in ln)
    assert lines.index("export TUNER_REQUIRE_ENVS=1") < test_line


def test_tuner_executable_is_the_environment_under_test() -> None:
    """Not a path into the checkout: the console script the running environment installed."""
    exe = pathlib.Path(tuner_executable())
    assert exe.name == "tuner" and os.access(exe, os.X_OK)
    beside = pathlib.Path(sys.executable).with_name("tuner")
    assert exe == beside or not beside.exists()
