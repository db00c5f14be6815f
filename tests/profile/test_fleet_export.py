"""Multi-engine profiles: the fleet fields round-trip, every export format of a
4-replica prefix-aware fleet and of a DP2 MoE deployment against golden files, and the
router configuration each policy exports.

Regenerate the golden files after an intended change with
``TUNER_UPDATE_GOLDEN=1 .venv/bin/pytest tests/profile`` and review the diff.
"""

from __future__ import annotations

import json
import pathlib
import shlex

import pytest
import yaml

from tests.profile.test_export import _check_golden
from tuner.errors import ConfigError, ProfileError
from tuner.profile import FORMATS, Profile, ProfileTarget, export_profile, load_profile, save_profile
from tuner.profile.model import profile_from_dict
from tuner.sim.settings import SchedulerSettings

EXT = {"flags": "sh", "plugin": "sh", "env": "sh", "yaml": "yaml", "json": "json",
       "python": "py", "router": "sh"}


def fleet_profile(policy: str = "prefix-aware", **router: object) -> Profile:
    """Llama-3.1-70B as 4 replicas of TP2 on one 8-GPU MI355X node behind a router."""
    settings = SchedulerSettings.vllm_defaults(288).replace(
        cache_aware_admission_window=16, cache_aware_admission_threshold=0.35)
    params = {"prefix-aware": {"overlap_weight": 1.5, "block_size": 0},
              "least-loaded": {"load_metric": "tokens"}, "session": {"load_metric": "requests"},
              "round-robin": {}}[policy]
    return Profile(name="fleet", scheduler=settings,
                   router={"policy": policy, **params, **router},
                   target=ProfileTarget(hardware="mi355x", model="llama-3.1-70b", tp=2, dp=1,
                                        replicas=4, num_gpus=8, block_size=16,
                                        max_model_len=131072, gpu_memory_utilization=0.92))


def moe_dp_profile() -> Profile:
    """DeepSeek-V3 as one deployment of DP2 x TP4 with expert parallelism."""
    settings = SchedulerSettings.vllm_defaults(288).replace(max_num_seqs=512)
    return Profile(name="moe-dp2", scheduler=settings,
                   target=ProfileTarget(hardware="mi355x", model="deepseek-v3", tp=4, dp=2,
                                        enable_expert_parallel=True, num_gpus=8, block_size=16,
                                        max_model_len=32768, gpu_memory_utilization=0.92))


@pytest.mark.parametrize("fmt", FORMATS + ("router",))
def test_golden_prefix_aware_fleet(fmt: str) -> None:
    _check_golden(f"fleet-prefix-aware-{fmt}.{EXT[fmt]}", export_profile(fleet_profile(), fmt))


@pytest.mark.parametrize("fmt", FORMATS)
def test_golden_dp2_moe(fmt: str) -> None:
    _check_golden(f"moe-dp2-{fmt}.{EXT[fmt]}", export_profile(moe_dp_profile(), fmt))


def _commands(text: str) -> list[list[str]]:
    """The shell commands of a flags export (comments and heredoc bodies dropped)."""
    out, in_heredoc = [], False
    body = [ln for ln in text.replace("\\\n", " ").splitlines()]
    for line in body:
        if in_heredoc:
            in_heredoc = line != "EOF"
            continue
        if line.startswith("#") or not line.strip():
            continue
        if "<<'EOF'" in line:
            in_heredoc = True
        out.append(shlex.split(line.rstrip(" &")))
    return out


def test_fleet_flags_start_every_replica_on_its_own_gpus_and_the_router() -> None:
    cmds = _commands(export_profile(fleet_profile(), "flags"))
    engines = [c for c in cmds if "serve" in c]
    assert len(engines) == 4
    for i, cmd in enumerate(engines):
        assert cmd[0] == f"CUDA_VISIBLE_DEVICES={2 * i},{2 * i + 1}"
        assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
        assert cmd[cmd.index("--port") + 1] == str(8000 + i)
        assert "--data-parallel-size" not in cmd and "--scheduler-cls" in cmd
    router = cmds[-1]
    assert router[:3] == ["python", "-m", "dynamo.frontend"]
    assert router[router.index("--router-mode") + 1] == "kv"
    assert router[router.index("--kv-overlap-score-weight") + 1] == "1.5"
    assert router[router.index("--kv-cache-block-size") + 1] == "16"


def test_each_policy_exports_its_real_router() -> None:
    rr = _commands(export_profile(fleet_profile("round-robin"), "router"))[0]
    assert rr[0] == "vllm-router" and rr[rr.index("--routing-logic") + 1] == "roundrobin"
    assert rr[rr.index("--static-backends") + 1].split(",") == [
        f"http://localhost:{8000 + i}" for i in range(4)]
    session = _commands(export_profile(fleet_profile("session"), "router"))[0]
    assert session[session.index("--routing-logic") + 1] == "session"
    assert session[session.index("--session-key") + 1] == "x-session-id"
    epp = yaml.safe_load(export_profile(fleet_profile("least-loaded"), "router"))
    assert epp["kind"] == "EndpointPickerConfig"
    refs = [p["pluginRef"] for p in epp["schedulingProfiles"][0]["plugins"]]
    assert refs == ["pending-tokens-scorer", "max-score-picker"]
    requests = yaml.safe_load(export_profile(fleet_profile("least-loaded", load_metric="requests"),
                                             "router"))
    assert requests["plugins"][1]["type"] == "active-request-scorer"


def test_json_and_yaml_carry_the_per_engine_layout() -> None:
    data = json.loads(export_profile(fleet_profile(), "json"))
    assert data["engine_args"] == ["--tensor-parallel-size", "2"] and data["replicas"] == 4
    assert data["router"]["policy"] == {"policy": "prefix-aware", "overlap_weight": 1.5,
                                        "block_size": 0}
    assert data["router"]["args"][:3] == ["python", "-m", "dynamo.frontend"]
    moe = yaml.safe_load(export_profile(moe_dp_profile(), "yaml"))
    assert (moe["tensor-parallel-size"], moe["data-parallel-size"],
            moe["enable-expert-parallel"]) == (4, 2, True)
    flags = _commands(export_profile(moe_dp_profile(), "flags"))
    assert len(flags) == 1 and "--enable-expert-parallel" in flags[0]
    assert flags[0][flags[0].index("--data-parallel-size") + 1] == "2"


def test_router_format_refuses_a_single_replica() -> None:
    with pytest.raises(ConfigError, match="has no router section"):
        export_profile(moe_dp_profile(), "router")


def test_fleet_profile_round_trips(tmp_path: pathlib.Path) -> None:
    for prof in (fleet_profile(), moe_dp_profile(), fleet_profile("least-loaded")):
        path = save_profile(prof, tmp_path / f"{prof.name}.yaml")
        back = load_profile(path)
        assert back.target == prof.target and back.router == prof.router
        assert back.scheduler == prof.scheduler


def test_single_engine_profile_file_is_unchanged_by_the_fleet_fields() -> None:
    single = Profile(name="one", scheduler=SchedulerSettings(),
                     target=ProfileTarget(hardware="mi355x", model="llama-3.1-70b", tp=8,
                                          num_gpus=8))
    data = single.to_dict()
    assert "router" not in data and "replicas" not in data["target"]
    assert "enable_expert_parallel" not in data["target"]


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["target"].update(replicas=0), "target.replicas"),
    (lambda d: d["target"].update(enable_expert_parallel="yes"), "target.enable_expert_parallel"),
    (lambda d: d["target"].update(num_gpus=4), "target.num_gpus"),
    (lambda d: d["target"].update(replicas=1, num_gpus=2), "router"),
    (lambda d: d["router"].update(policy="random"), "router"),
    (lambda d: d["router"].update(overlap_weight=-1), "router"),
    (lambda d: d["router"].update(temperature=0.5), "router"),
])
def test_fleet_fields_are_validated_with_one_line_errors(edit, field: str) -> None:
    data = fleet_profile().to_dict()
    edit(data)
    with pytest.raises(ProfileError) as info:
        profile_from_dict(data, source="p.yaml")
    message = str(info.value)
    assert message.startswith(f"p.yaml: {field}: ") and "\n" not in message


def test_a_fleet_larger_than_a_node_gets_one_command_per_host() -> None:
    import dataclasses

    prof = fleet_profile("round-robin")
    big = dataclasses.replace(prof, target=dataclasses.replace(prof.target, tp=4, num_gpus=16))
    text = export_profile(big, "flags")
    cmds = _commands(text)
    engines = [c for c in cmds if "serve" in c]
    assert len(engines) == 1 and not engines[0][0].startswith("CUDA_VISIBLE_DEVICES")
    assert engines[0][engines[0].index("--port") + 1] == "8000"
    assert "run this on each replica's host" in text
    router = cmds[-1]
    assert router[router.index("--static-backends") + 1].split(",") == [
        f"http://replica-{i}:8000" for i in range(4)]


def test_prefix_aware_router_over_the_dp_ranks_of_one_deployment() -> None:
    import dataclasses

    prof = dataclasses.replace(moe_dp_profile(), router={"policy": "prefix-aware",
                                                         "overlap_weight": 2.0,
                                                         "block_size": 64})
    text = export_profile(prof, "flags")
    cmds = _commands(text)
    assert len([c for c in cmds if "serve" in c]) == 1
    assert cmds[-1][cmds[-1].index("--kv-cache-block-size") + 1] == "64"
    assert cmds[-1][cmds[-1].index("--kv-overlap-score-weight") + 1] == "2"
    back = profile_from_dict(prof.to_dict(), source="p.yaml")
    assert back.router == prof.router
