"""Exports checked by vLLM itself (SchedulerConfig + vLLM's argument parser).

Needs the vLLM environments that .ci/setup-vllm.sh builds (it exports
TUNER_VLLM033_PYTHON and TUNER_VLLM032_PYTHON); skipped with a reason without them (failed
under TUNER_REQUIRE_ENVS=1, as in CI).
"""

from __future__ import annotations

import pytest

from tests.envs import env_python
from tests.profile.test_export import make_profile
from tuner.profile import check_with_vllm

ENVS = {"0.33.0": "TUNER_VLLM033_PYTHON", "0.32.0": "TUNER_VLLM032_PYTHON"}


def _python(version: str) -> str:
    return env_python(ENVS[version], 'run eval "$(.ci/setup-vllm.sh)" first')


@pytest.mark.vllm
@pytest.mark.parametrize("version", sorted(ENVS))
def test_exports_pass_vllms_own_checks(version: str) -> None:
    python = _python(version)
    # Each check imports vLLM in a fresh interpreter (~30 s): keep the list short.
    profiles = [make_profile()] + ([make_profile(async_scheduling=False)]
                                   if version == "0.33.0" else [])
    for profile in profiles:
        result = check_with_vllm(profile, vllm_version=version, python=python)
        assert result.status == "ok", result.errors
        assert result.vllm_version == version
        assert result.checked == ("SchedulerConfig(**kwargs)", "vllm serve flags",
                                  "vllm serve --config file")


@pytest.mark.vllm
def test_vllm_rejections_are_reported() -> None:
    python = _python("0.33.0")
    # Chunked prefill off with a token budget below max_model_len: vLLM refuses it.
    bad = check_with_vllm(make_profile(chunked=False), python=python, max_model_len=131072)
    assert bad.status == "failed"
    assert any("max_num_batched_tokens (16384) is smaller than max_model_len" in e
               for e in bad.errors)
    # PR #54625's flags do not exist in 0.33.0: exactly why the plugin form is the default.
    native = check_with_vllm(make_profile(), vllm_version="0.34.0", native_admission=True,
                             python=python)
    assert native.status == "failed"
    assert any("unrecognized arguments: --cache-aware-admission-window" in e
               for e in native.errors)


@pytest.mark.vllm
def test_fleet_and_dp_exports_pass_vllms_parser() -> None:
    """The per-engine layout flags (--tensor-parallel-size, --data-parallel-size,
    --enable-expert-parallel) parse to the profile's values with vLLM 0.33.0's parser."""
    from tests.profile.test_fleet_export import fleet_profile, moe_dp_profile

    python = _python("0.33.0")
    for profile in (fleet_profile(), moe_dp_profile()):
        result = check_with_vllm(profile, vllm_version="0.33.0", python=python)
        assert result.status == "ok", result.errors
        assert "vllm serve flags" in result.checked
