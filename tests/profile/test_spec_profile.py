"""Speculative decoding in profiles: recorded under ``target.speculative``, checked as the
replay reads it, exported as vLLM's ``--speculative-config`` (flags, plugin flags, the
``--config`` file), and parsed back by vLLM 0.33.0 itself (``--check-vllm``)."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from tests.vllm.vllm_env import vllm_python
from tuner.errors import ProfileError
from tuner.profile.export import export_profile
from tuner.profile.model import load_profile, profile_from_dict
from tuner.profile.vllm_check import check_with_vllm

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = {"speculative_config": {"method": "mtp", "num_speculative_tokens": 2},
        "acceptance": [0.85, 0.7225], "seed": 3}


def _with_spec(spec: object = SPEC):  # type: ignore[no-untyped-def]
    data = load_profile(ROOT / "profiles" / "agentic-mi355x.yaml").to_dict()
    data["target"]["speculative"] = spec
    return profile_from_dict(data)


def test_round_trip_and_off_is_written_as_before() -> None:
    profile = _with_spec()
    assert profile.target.speculative == SPEC
    again = profile_from_dict(yaml.safe_load(profile.to_yaml()))
    assert again.target.speculative == SPEC
    plain = load_profile(ROOT / "profiles" / "agentic-mi355x.yaml")
    assert "speculative" not in plain.to_dict()["target"]


def test_bad_speculative_section_names_the_field() -> None:
    with pytest.raises(ProfileError, match="target.speculative.*method 'medusa'"):
        _with_spec({"speculative_config": {"method": "medusa", "num_speculative_tokens": 2},
                    "acceptance": [0.5]})
    with pytest.raises(ProfileError, match="target.speculative"):
        _with_spec({"acceptance": [0.5]})


def test_exports_carry_the_speculative_config() -> None:
    profile = _with_spec()
    flag = """--speculative-config '{"method":"mtp","num_speculative_tokens":2}'"""
    assert flag in export_profile(profile, "flags")
    assert flag in export_profile(profile, "plugin")
    config = yaml.safe_load(export_profile(profile, "yaml"))
    assert config["speculative-config"] == SPEC["speculative_config"]
    assert "speculative" not in export_profile(_with_spec(None), "flags")


@pytest.mark.vllm
def test_vllm_033_parses_the_exported_speculative_config() -> None:
    check = check_with_vllm(_with_spec(), python=vllm_python("0.33"))
    assert check.status == "ok", check.errors
