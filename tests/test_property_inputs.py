"""Property tests: generated extreme values into every ingest format and the numeric
options of the commands that read or write traces, each run in a child under a memory
cap (RLIMIT_AS, as ``ulimit -v``) and a time limit (tests/bounded.py, tests/property_inputs.py).

Contract checked for every example: no traceback, exit 0 or 2, a bad record named by
file and line with exit 2 and no output, and no exit 0 with a wrong result.
"""

from __future__ import annotations

import os
import pathlib
import resource
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

CHECKS = ["hashed_jsonl", "openai_jsonl", "csv", "vllm_log", "option:replay",
          "option:trace slice", "option:trace synth", "option:ingest", "option:cluster job"]


def _limit() -> None:
    cap = 4000 << 20  # 4 GB of address space: the old blow-ups needed 7-211 GB
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


@pytest.mark.parametrize("check", CHECKS)
def test_extreme_inputs(tmp_path: pathlib.Path, check: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_ARENA_MAX": "2",
           "POLARS_MAX_THREADS": "2", "TUNER_SALT": "test-salt-0123456789abcdef",
           "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HYPOTHESIS_STORAGE_DIRECTORY":
           str(tmp_path / "hyp")}
    try:
        done = subprocess.run(
            [sys.executable, "-c", "from tests.property_inputs import main; main()", check],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
            preexec_fn=_limit)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{check}: no answer within 600 s (a hang?): {str(exc.output)[-2000:]}")
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "PROPERTY OK" in out, out[-6000:]
