"""tuner/vllm_compat.py's table against the real vLLM environments (.ci/setup-vllm.sh).

For each installed release: :func:`tuner.vllm_compat.detect` finds its version and no PR
#54625 fields, every field the table gives it is a ``SchedulerConfig`` field there, and the
single-engine prefill cadence is present exactly where the table says.
"""

from __future__ import annotations

import json

import pytest
from vllm_env import ROOT

from tuner import vllm_compat

pytestmark = pytest.mark.vllm

_PROBE = ROOT / "tests" / "vllm" / "scenarios" / "compat_probe.py"


def test_table_matches_the_installed_vllm(any_vllm: tuple[str, str]) -> None:
    minor, python = any_vllm
    found = vllm_compat.detect(python)
    assert vllm_compat.minor(found.version) == minor
    assert found.native_admission is False  # no release has PR #54625
    feats = found.features
    import subprocess

    out = subprocess.run([python, str(_PROBE)], capture_output=True, text=True, timeout=300,
                         env={"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
                              "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(feats.scheduler_fields) <= set(probe["fields"]), probe["fields"]
    assert not set(vllm_compat.ADMISSION_FIELDS) & set(probe["fields"])
    assert probe["local_cadence"] is feats.single_engine_interval
