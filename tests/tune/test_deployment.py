"""Deployment dimensions: GPU splits of a budget (vLLM's TP rules, memory), the router
as a conditional dimension, and a study that records, ranks and exports them."""

from __future__ import annotations

import json
import pathlib

import optuna
import pytest

from tests.tune.fake import FleetFake
from tuner.errors import ConfigError
from tuner.perf.deployment import Deployment, Split, gpu_splits
from tuner.perf.target import Target
from tuner.profile import profile_of, warm_start_of
from tuner.sim.fleet import RouterSettings
from tuner.sim.settings import SchedulerSettings
from tuner.tune import DeploymentSearch, SearchOptions, StudyOutput, TuneInputs, tune
from tuner.tune.deployment_space import (deployment_for, evaluate_point, join_settings,
                                         split_settings, with_deployment)
from tuner.tune.space import GPU_SPLIT, ROUTER_POLICY, admission_space, space_from_dict


def _labels(splits: list[Split]) -> list[str]:
    return [s.label for s in splits]


def test_eight_gpus_split_every_way_for_llama_70b_on_mi355x() -> None:
    valid, refused = gpu_splits(Target(hardware="mi355x", model="llama-3.1-70b", tp=8), 8)
    assert _labels(valid) == [
        "tp=8,dp=1,replicas=1", "tp=4,dp=2,replicas=1", "tp=4,dp=1,replicas=2",
        "tp=2,dp=4,replicas=1", "tp=2,dp=2,replicas=2", "tp=2,dp=1,replicas=4",
        "tp=1,dp=8,replicas=1", "tp=1,dp=4,replicas=2", "tp=1,dp=2,replicas=4",
        "tp=1,dp=1,replicas=8"]
    assert refused == []
    assert all(s.gpus == 8 for s in valid)


def test_splits_that_do_not_fit_are_refused_with_the_memory_reason() -> None:
    valid, refused = gpu_splits(Target(hardware="h100", model="llama-3.1-70b", tp=8), 8)
    assert {s.tp for s in valid} == {8, 4}
    reasons = dict(refused)
    assert "does not fit on 1x" in reasons[Split(1, 1, 8)]
    assert "KV tokens" in reasons[Split(2, 1, 4)]  # the weights fit, no room for one sequence


def test_a_tp_that_does_not_divide_the_attention_heads_is_excluded(tmp_path: pathlib.Path) -> None:
    # Qwen2.5-7B's shape: 28 query heads, 4 KV heads -> TP 8 is refused by vLLM
    config = {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
              "intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4,
              "vocab_size": 152064, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    valid, refused = gpu_splits(Target(hardware="mi355x", model=str(path), tp=4), 8)
    assert 8 not in {s.tp for s in valid} and {4, 2, 1} <= {s.tp for s in valid}
    why = dict(refused)[Split(8, 1, 1)]
    assert "28 attention heads do not divide by TP 8" in why


def test_expert_parallel_is_a_choice_for_moe_only() -> None:
    moe, _ = gpu_splits(Target(hardware="mi355x", model="deepseek-v3", tp=8), 8)
    assert Split(4, 2, 1, True) in moe and Split(4, 2, 1, False) in moe
    dense, _ = gpu_splits(Target(hardware="mi355x", model="llama-3.1-70b", tp=8), 8)
    assert not any(s.enable_expert_parallel for s in dense)


def test_gpu_budget_space_makes_the_router_conditional_on_replicas() -> None:
    target = Target(hardware="mi355x", model="llama-3.1-70b", tp=8)
    space, notes = with_deployment(admission_space(), target, gpu_budget=8)
    assert space.name == "admission+gpu8" and notes == []
    router = next(p for p in space.params if p.name == ROUTER_POLICY)
    assert dict(router.when)[GPU_SPLIT] == tuple(
        s.label for s in gpu_splits(target, 8)[0] if s.replicas > 1)
    assert space_from_dict(space.to_dict()).to_dict() == space.to_dict()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    base = Deployment.of_target(target)
    seen_router = seen_single = False
    for _ in range(60):
        trial = study.ask()
        params = space.suggest(trial)
        assert space.contains(params), params
        deployment = deployment_for(space, base, params)
        split = Split.parse(params[GPU_SPLIT])
        assert deployment.split == split
        if split.replicas > 1:
            seen_router = True
            assert ROUTER_POLICY in params and deployment.router.policy == params[ROUTER_POLICY]
            if params[ROUTER_POLICY] == "prefix-aware":
                assert deployment.router.overlap_weight == params["router.overlap_weight"]
        else:
            seen_single = True
            assert ROUTER_POLICY not in params and deployment.router is None
        study.tell(trial, 0.0)
    assert seen_router and seen_single


def test_gpu_budget_refusals() -> None:
    target = Target(hardware="mi355x", model="llama-3.1-70b", tp=4)
    with pytest.raises(ConfigError, match="must use the same GPUs"):
        with_deployment(admission_space(), target, gpu_budget=8)
    with pytest.raises(ConfigError, match="one engine has no router"):
        with_deployment(admission_space(), target, routers=["session"])
    fleet = Target(hardware="mi355x", model="llama-3.1-70b", tp=2, replicas=4)
    space, _ = with_deployment(admission_space(), fleet, routers=["prefix-aware"])
    assert space.names[-2:] == (ROUTER_POLICY, "router.overlap_weight")
    assert next(p for p in space.params if p.name == ROUTER_POLICY).choices == ("prefix-aware",)
    # the baseline behind round-robin is outside that space: a different point
    base = Deployment.of_target(fleet, RouterSettings("round-robin"))
    assert not space.contains(space.project(SchedulerSettings(), base))
    point = {**space.project(SchedulerSettings(), base), ROUTER_POLICY: "prefix-aware",
             "router.overlap_weight": 2.0}
    assert deployment_for(space, base, point).router == RouterSettings(
        "prefix-aware", overlap_weight=2.0)


def test_points_keep_their_deployment_in_one_settings_dict() -> None:
    d = Deployment(Split(2, 1, 4), RouterSettings("session", load_metric="requests"))
    joined = join_settings(SchedulerSettings(), d)
    settings, back = split_settings(joined)
    assert settings == SchedulerSettings() and back == d
    assert split_settings(SchedulerSettings().to_dict())[1] is None
    with pytest.raises(ConfigError, match="router: a router needs replicas > 1"):
        Deployment(Split(8), RouterSettings("round-robin"))
    with pytest.raises(TypeError, match="expected RouterSettings"):
        Deployment(Split(2, 1, 4), {"policy": "round-robin"})  # type: ignore[arg-type]
    # fields its policy does not read are reset: two deployments that route alike are equal
    assert Deployment(Split(2, 1, 4), RouterSettings("round-robin", overlap_weight=3.0)) == \
        Deployment(Split(2, 1, 4), RouterSettings("round-robin"))


def test_a_trial_replays_its_settings_and_deployment_as_given() -> None:
    """No dict in between: the evaluator gets the very objects the trial built."""
    fake = FleetFake()
    seen: list[tuple[SchedulerSettings, Deployment | None]] = []
    evaluate = fake.evaluate

    def spy(settings, window, *, deployment=None):  # type: ignore[no-untyped-def]
        seen.append((settings, deployment))
        return evaluate(settings, window, deployment=deployment)

    fake.evaluate = spy  # type: ignore[method-assign]
    settings = SchedulerSettings(max_num_seqs=64)
    d = Deployment(Split(2, 1, 4), RouterSettings("prefix-aware", overlap_weight=1.5))
    evaluate_point(fake, settings, d, "train")
    evaluate_point(fake, settings, None, "train")
    assert seen[0][0] is settings and seen[0][1] is d and seen[1] == (settings, None)


def test_a_study_over_a_gpu_budget_records_and_exports_the_deployment() -> None:
    fake = FleetFake()
    result = tune(TuneInputs(evaluator=fake,
                             target=Target(hardware="mi355x", model="llama-3.1-70b", tp=8)),
                  SearchOptions(space="admission", n_trials=24, seed=2, n_survivors=6),
                  DeploymentSearch(gpu_budget=8, routers=["round-robin", "prefix-aware"]))
    assert result.space.has_deployment
    assert any(d["replicas"] > 1 for d in fake.deployments if d)
    baseline = result.to_dict()["baseline"]
    assert baseline["deployment"] == Deployment(Split(8)).to_dict()
    rec = result.to_dict()["recommended"]
    assert "deployment" not in rec["settings"] and GPU_SPLIT in rec["params"]
    assert Split.parse(rec["params"][GPU_SPLIT]) == Deployment.from_dict(rec["deployment"]).split
    profile = profile_of(result, "fleet")
    dep = Deployment.from_dict(rec["deployment"])
    assert (profile.target.tp, profile.target.dp, profile.target.replicas) == (
        dep.split.tp, dep.split.dp, dep.split.replicas)
    assert profile.target.num_gpus == 8 and profile.deployment() == dep
    if dep.split.engines > 1:
        assert len(profile.predicted["train"]["engines"]["tuned"]) == dep.split.engines
    table = result.front_table()
    assert "GPU split" in [c.header for c in table.columns]


def test_yaml_spaces_name_deployment_parameters_and_conditions(tmp_path: pathlib.Path) -> None:
    from tuner.tune.space import load_space

    path = tmp_path / "fleet.yaml"
    path.write_text("""
params:
  gpu_split: {type: categorical, choices: ["tp=8,dp=1,replicas=1", "tp=2,dp=1,replicas=4"]}
  router.policy: {type: categorical, choices: [session, prefix-aware],
                  when: {gpu_split: ["tp=2,dp=1,replicas=4"]}}
  router.overlap_weight: {type: float, low: 0.5, high: 2.0, step: 0.5,
                          when: {router.policy: [prefix-aware]}}
""")
    space = load_space(path)
    assert space.has_deployment and space.names[-1] == "router.overlap_weight"
    assert space.contains({"gpu_split": "tp=8,dp=1,replicas=1"})
    assert not space.contains({"gpu_split": "tp=8,dp=1,replicas=1", "router.policy": "session"})
    assert space.contains({"gpu_split": "tp=2,dp=1,replicas=4", "router.policy": "prefix-aware",
                           "router.overlap_weight": 1.5})
    for bad, match in (
            ('  router.temperature: {type: float, low: 0, high: 1}\n', "not a router parameter"),
            ('  gpu_split: {type: categorical, choices: ["tp8"]}\n', "expected tp=T,dp=D"),
            ('  router.policy: {type: categorical, choices: [random]}\n', "'random' is not one"),
            ('  router.load_metric: {type: categorical, choices: [requests], '
             'when: {gpu_split: [x]}}\n', "depends on 'gpu_split'")):
        path.write_text("params:\n" + bad)
        with pytest.raises(ConfigError, match=match):
            load_space(path)


def test_a_fleet_profile_warm_starts_a_budget_study_with_its_points_deployments() -> None:
    fake = FleetFake()
    target = Target(hardware="mi355x", model="llama-3.1-70b", tp=8)
    first = tune(TuneInputs(evaluator=fake, target=target),
                 SearchOptions(space="admission", n_trials=16, seed=4, n_survivors=4),
                 DeploymentSearch(gpu_budget=8, routers=["prefix-aware"]))
    profile = profile_of(first, "warm")
    assert all("deployment" in p for p in profile.pareto)
    again = FleetFake()
    second = tune(TuneInputs(evaluator=again, target=target),
                  SearchOptions(space="admission", n_trials=4, seed=5, n_survivors=2,
                                warm_start=warm_start_of(profile)),
                  DeploymentSearch(gpu_budget=8, routers=["prefix-aware"]))
    assert any("warm start: enqueued" in n for n in second.notes)
    replayed = [d for d in again.deployments[:1 + len(profile.pareto)]]
    assert Deployment.from_dict(profile.pareto[0]["deployment"]).to_dict() in replayed


def test_profile_pareto_deployments_are_validated() -> None:
    from tuner.errors import ProfileError
    from tuner.profile.model import profile_from_dict
    from tests.profile.test_fleet_export import fleet_profile

    data = fleet_profile().to_dict()
    data["pareto"] = [{"settings": data["scheduler"], "deployment": {"tp": 0}}]
    with pytest.raises(ProfileError, match=r"^p.yaml: pareto\[0\].deployment.tp: must be"):
        profile_from_dict(data, source="p.yaml")


def test_resuming_a_fleet_study_with_another_router_is_refused(tmp_path: pathlib.Path) -> None:
    from tests.tune.tracegen import write_small_trace

    trace = write_small_trace(tmp_path / "small.parquet")
    target = Target(hardware="mi355x", model="llama-3.1-70b", tp=4, replicas=2,
                    num_gpu_blocks=800)
    journal = str(tmp_path / "s.optuna-journal")
    inputs = TuneInputs(trace, target=target, holdout=0.0, stage1_fraction=1.0)
    search = SearchOptions(n_trials=2, n_survivors=1)
    study = StudyOutput(storage=journal, study_name="s")
    tune(inputs, search, DeploymentSearch(router=RouterSettings("round-robin")), study)
    with pytest.raises(ConfigError, match="a different baseline router"):
        tune(inputs, search, DeploymentSearch(router=RouterSettings("session")), study)


def test_summary_lines_name_the_deployment_change() -> None:
    import pathlib as _p

    from tuner.profile.recommend import TunedProfile, summary_lines

    fake = FleetFake()
    result = tune(TuneInputs(evaluator=fake,
                             target=Target(hardware="mi355x", model="llama-3.1-70b", tp=8)),
                  SearchOptions(space="admission", n_trials=16, seed=2, n_survivors=4),
                  DeploymentSearch(gpu_budget=8, routers=["prefix-aware"]))
    run = TunedProfile(result, profile_of(result, "x"), _p.Path("x.yaml"), "", [])
    line = next(ln for ln in summary_lines(run) if ln.startswith("deployment: "))
    dep = Deployment.from_dict(result.to_dict()["recommended"]["deployment"])
    assert line.endswith(dep.describe()) or line == f"deployment: {dep.describe()} (the baseline's)"
    assert all("deployment" in f for f in result.to_dict()["front"])
