"""Profiles (a tuned configuration + its evidence) and their exporters (stage ``profile``).

Public API::

    profile = tuner.profile.load_profile("profiles/agentic.yaml")
    print(tuner.profile.export_profile(profile, "flags", vllm_version="0.33.0"))
    profile = tuner.profile.profile_of(tuner.tune.tune(...), "agentic")  # from a study
    search = SearchOptions(warm_start=tuner.profile.warm_start_of(profile))  # and back

File format: ``docs/profiles.md``. The vLLM scheduler plugin the exports refer to lives in
``tuner.vllm_plugin`` (imported only inside a vLLM environment).
"""

from __future__ import annotations

from tuner.profile.build import profile_of, warm_start_of
from tuner.profile.export import (CHECKED_VLLM_VERSION, FORMATS, ExportPlan, export_profile,
                                  flag_name, parse_version, plan_export)
from tuner.profile.model import (PROFILE_VERSION, Profile, ProfileTarget, load_profile,
                                 profile_from_dict, save_profile)
from tuner.profile.vllm_check import VllmCheck, check_with_vllm

__all__ = [
    "CHECKED_VLLM_VERSION", "ExportPlan", "FORMATS", "PROFILE_VERSION", "Profile", "ProfileTarget",
    "VllmCheck", "check_with_vllm", "export_profile", "flag_name", "load_profile",
    "parse_version", "plan_export", "profile_from_dict", "profile_of", "save_profile",
    "warm_start_of",
]
