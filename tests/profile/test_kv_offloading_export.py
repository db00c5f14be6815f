"""Profiles record the CPU KV tier and export it with vLLM 0.33.0's flags."""

from __future__ import annotations

import os

import pytest

from tuner.profile.export import export_profile
from tuner.profile.model import Profile, ProfileTarget, profile_from_dict
from tuner.sim.settings import SchedulerSettings


def _profile(**kv) -> Profile:
    target = ProfileTarget(hardware="mi355x", model="llama-3.1-70b", tp=8, num_gpus=8, **kv)
    return Profile(name="kv", scheduler=SchedulerSettings(), target=target)


def test_no_tier_writes_no_tier_fields_and_no_flags() -> None:
    p = _profile()
    assert not any(k.startswith("kv_offloading") for k in p.target.to_dict())
    assert "--kv-offloading" not in export_profile(p, "flags")


def test_tier_round_trips_and_exports_vllm_flags() -> None:
    p = _profile(kv_offloading_size=512.0, kv_offloading_eviction_policy="arc",
                 kv_offloading_blocks_per_chunk=2)
    again = profile_from_dict(p.to_dict())
    assert again.target == p.target
    flags = export_profile(p, "flags")
    assert "--kv-offloading-size 512.0" in flags
    assert ('--kv-transfer-config \'{"kv_connector_extra_config": {"eviction_policy": '
            '"arc", "blocks_per_chunk": 2}}\'') in flags
    assert "kv-offloading-size: '512.0'" in export_profile(p, "yaml") or \
        "kv-offloading-size: 512.0" in export_profile(p, "yaml")
    lm = export_profile(_profile(kv_offloading_size=64.0, kv_offloading_backend="lmcache"),
                        "flags")
    assert "--kv-offloading-backend lmcache" in lm and "--kv-transfer-config" not in lm


def test_bad_tier_field_is_one_error_naming_it() -> None:
    from tuner.errors import ProfileError

    data = _profile(kv_offloading_size=8.0).to_dict()
    data["target"]["kv_offloading_eviction_policy"] = "fifo"
    with pytest.raises(ProfileError, match="target.kv_offloading_eviction_policy"):
        profile_from_dict(data)


@pytest.mark.skipif(not os.environ.get("TUNER_VLLM033_PYTHON"), reason="needs vLLM 0.33.0")
def test_vllm_033_parses_the_tier_flags() -> None:
    from tuner.profile.vllm_check import check_with_vllm

    p = _profile(kv_offloading_size=512.0, kv_offloading_eviction_policy="arc")
    check = check_with_vllm(p, python=os.environ["TUNER_VLLM033_PYTHON"])
    assert check.status == "ok", check.errors
