"""P/D layouts in the search (``--disaggregated``): the layouts of a budget, the space each
mode gives, the answer (does disaggregation win, by how much, the knee) and the export of
a P/D pick."""

from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any

import pytest
from click.testing import CliRunner

from tests.tune.fake import FleetFake
from tuner.cli import cli
from tuner.errors import ConfigError, ProfileError
from tuner.perf.deployment import Deployment, Split, pd_layout_label
from tuner.perf.pd_link import PDLayout
from tuner.perf.target import Target
from tuner.profile import export_profile, profile_from_dict, profile_of, save_profile
from tuner.sim.settings import SchedulerSettings
from tuner.tune import DeploymentSearch, SearchOptions, TuneInputs, tune
from tuner.tune.deployment_space import deployment_for, with_deployment
from tuner.tune.pd_space import gpu_ratio, layout_gpus, pd_layouts, with_pd
from tuner.tune.pd_verdict import knee_ratios
from tuner.tune.select import Point
from tuner.tune.space import (GPU_SPLIT, PD_LAYOUT, PD_MODE, PD_PREFILL_BATCHED_TOKENS,
                              PD_PREFILL_SEQS, PD_ROUTER, PD_TRANSFER_MODE, ROUTER_POLICY,
                              admission_space)

TARGET = Target(hardware="mi355x", model="llama-3.1-70b", tp=8)


def _labels(layouts: list[PDLayout]) -> set[str]:
    return {pd_layout_label(lay) for lay in layouts}


# --------------------------------------------------------------------------- layouts


def test_layouts_of_a_budget_use_every_gpu_by_default() -> None:
    layouts, notes = pd_layouts(TARGET, 8, pool_tps=(2, 4))
    assert notes == []
    assert _labels(layouts) == {
        "1:3,prefill_tp=2,decode_tp=2", "2:2,prefill_tp=2,decode_tp=2",
        "3:1,prefill_tp=2,decode_tp=2", "2:1,prefill_tp=2,decode_tp=4",
        "1:2,prefill_tp=4,decode_tp=2", "1:1,prefill_tp=4,decode_tp=4"}
    assert all(layout_gpus(lay) == 8 for lay in layouts)


def test_up_to_the_budget_adds_the_smaller_layouts_and_never_more() -> None:
    full, _ = pd_layouts(TARGET, 16, pool_tps=(4, 8))
    up_to, _ = pd_layouts(TARGET, 16, pool_tps=(4, 8), fill="up-to")
    assert _labels(full) < _labels(up_to)
    assert all(layout_gpus(lay) <= 16 for lay in up_to)
    assert "1:1,prefill_tp=4,decode_tp=4" in _labels(up_to) - _labels(full)  # 8 GPUs
    assert max(layout_gpus(lay) for lay in up_to) == 16


def test_a_pool_tp_that_does_not_fit_is_excluded_with_the_reason() -> None:
    h100 = Target(hardware="h100", model="llama-3.1-70b", tp=8)  # 80 GB: 70B needs TP 4
    layouts, notes = pd_layouts(h100, 8, pool_tps=(1, 4))
    assert [n.split(":")[0] for n in notes] == ["P/D pool TP1 excluded"]
    assert "does not fit" in notes[0]
    assert _labels(layouts) == {"1:1,prefill_tp=4,decode_tp=4"}


def test_mixed_pools_put_the_prefill_pool_on_each_hardware_named() -> None:
    """``--pd-prefill-hardware mi355x,mi300x``: every layout of the target's hardware (its
    labels as before, the same study keys) plus the same layouts with an MI300X prefill
    pool; the label names the prefill hardware and reads back to the same layout."""
    from tuner.tune.pd_space import parse_layout_label

    plain, _ = pd_layouts(TARGET, 8, pool_tps=(2, 4))
    mixed, notes = pd_layouts(TARGET, 8, pool_tps=(2, 4), prefill_hardware=("mi355x", "mi300x"))
    assert notes == []
    on_target = [lay for lay in mixed if lay.prefill_hardware is None]
    on_mi300x = [lay for lay in mixed if lay.prefill_hardware == "mi300x"]
    assert _labels(on_target) == _labels(plain) and len(on_mi300x) == len(plain)
    assert len(mixed) == 2 * len(plain)
    for lay in mixed:
        label = pd_layout_label(lay)
        assert label.endswith(",prefill_hardware=mi300x") == (lay.prefill_hardware == "mi300x")
        assert parse_layout_label(label) == lay


def test_a_prefill_tp_that_does_not_fit_its_own_hardware_is_excluded() -> None:
    """The prefill pool's TP is checked on the prefill pool's hardware: 70B BF16 fits one
    MI355X (288 GB) but not one H100 (80 GB), so H100 prefill instances start at TP 4."""
    layouts, notes = pd_layouts(TARGET, 8, pool_tps=(1, 4), prefill_hardware=("h100",))
    assert [n.split(":")[0] for n in notes] == ["P/D prefill pool on h100 TP1 excluded"]
    assert {lay.prefill_hardware for lay in layouts} == {"h100"}
    assert {lay.prefill_tp for lay in layouts} == {4}
    assert {lay.decode_tp for lay in layouts} == {1, 4}
    assert all(layout_gpus(lay) == 8 for lay in layouts)


def test_a_mixed_point_replays_its_prefill_pool_on_its_hardware() -> None:
    """A drawn mixed layout reaches the replayed deployment (and so the P/D replay's
    prefill pool, ``tuner.replay._disagg.pd_pools``) and its description."""
    from tuner.tune.pd_space import pd_deployment_for

    dep = pd_deployment_for({PD_LAYOUT: "1:1,prefill_tp=4,decode_tp=4,prefill_hardware=mi300x",
                             PD_ROUTER: "llm-d"})
    assert dep is not None and dep.pd is not None
    assert dep.pd.prefill_hardware == "mi300x" and dep.pd.router == "llm-d"
    assert "prefill TP4 on mi300x" in dep.describe()


def test_unknown_prefill_hardware_is_a_one_line_error(tmp_path: pathlib.Path) -> None:
    from tuner.tune.pd_space import parse_prefill_hardware

    assert parse_prefill_hardware(None) is None
    assert parse_prefill_hardware("MI355X, mi300x") == ("mi355x", "mi300x")
    with pytest.raises(ConfigError, match="--pd-prefill-hardware 'mi999': one of b200"):
        parse_prefill_hardware("mi355x,mi999")
    with pytest.raises(ConfigError, match="distinct hardware presets"):
        parse_prefill_hardware("mi300x,mi300x")
    trace = tmp_path / "t.parquet"
    trace.write_bytes(b"")
    res = CliRunner().invoke(cli, [
        "tune", str(trace), "--hardware", "mi355x", "--model", "llama-3.1-70b", "--tp", "8",
        "--disaggregated", "on", "--gpu-budget", "16", "--pd-prefill-hardware", "mi999",
        "-o", str(tmp_path / "p.yaml")])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "--pd-prefill-hardware 'mi999'" in res.output
    assert not (tmp_path / "p.yaml").exists()


def test_budgets_without_a_layout_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="at least 2 GPUs"):
        pd_layouts(TARGET, 1)
    with pytest.raises(ConfigError, match="no P/D layout of 8 GPUs"):
        pd_layouts(TARGET, 8, pool_tps=(8,))  # 1 x TP8 + 1 x TP8 needs 16


def test_the_gpu_ratio_is_in_lowest_terms() -> None:
    assert gpu_ratio(PDLayout(1, 3, 4, 4)) == "1:3"
    assert gpu_ratio(PDLayout(2, 1, 2, 4)) == "1:1"
    assert gpu_ratio(PDLayout(1, 2, 8, 4)) == "1:1"


# --------------------------------------------------------------------------- the space


def _space(mode: str, budget: int | None = 8, **kw: Any):
    base = admission_space()
    agg, _ = with_deployment(base, TARGET, gpu_budget=budget)
    return agg, with_pd(base, agg, TARGET, mode=mode, gpu_budget=budget, **kw)[0]  # type: ignore[arg-type]


def test_off_is_todays_space() -> None:
    agg, space = _space("off")
    assert space is agg
    assert not any(n.startswith("pd.") for n in space.names)


def test_on_searches_only_p_d_layouts() -> None:
    _, space = _space("on", pool_tps=(2, 4))
    assert GPU_SPLIT not in space.names and ROUTER_POLICY not in space.names
    layout = next(p for p in space.params if p.name == PD_LAYOUT)
    assert len(layout.choices) == 6 and layout.when == ()
    assert next(p for p in space.params if p.name == PD_ROUTER).choices == ("vllm-proxy", "llm-d", "dynamo")
    drawn = {"cache_aware_admission_window": 16, "cache_aware_admission_threshold": 0.5,
             PD_LAYOUT: "1:3,prefill_tp=2,decode_tp=2", PD_ROUTER: "vllm-proxy",
             PD_PREFILL_BATCHED_TOKENS: 16384, PD_PREFILL_SEQS: 32}
    assert space.contains(drawn)
    dep = deployment_for(space, Deployment(Split(8)), drawn)
    assert dep is not None and dep.router is None
    assert dep.pd == PDLayout(1, 3, 2, 2, prefill_max_num_batched_tokens=16384,
                              prefill_max_num_seqs=32)
    assert dep.apply(TARGET).tp == 2  # the decode pool is the replay's main target
    # the point's own coordinates read back from its deployment (a warm start, a resume)
    assert space.project(SchedulerSettings(cache_aware_admission_window=16), dep)[
        PD_PREFILL_SEQS] == 32


def test_auto_conditions_both_kinds_on_the_mode() -> None:
    agg, space = _space("auto", pool_tps=(2, 4))
    names = space.names
    assert names.index(PD_MODE) < names.index(GPU_SPLIT) < names.index(PD_LAYOUT)
    split = next(p for p in space.params if p.name == GPU_SPLIT)
    assert split.when == ((PD_MODE, ("aggregated",)),)
    router = next(p for p in space.params if p.name == ROUTER_POLICY)
    assert (PD_MODE, ("aggregated",)) in router.when and any(
        name == GPU_SPLIT for name, _ in router.when)
    layout = next(p for p in space.params if p.name == PD_LAYOUT)
    assert layout.when == ((PD_MODE, ("disaggregated",)),)
    base = {"cache_aware_admission_window": 0, "cache_aware_admission_threshold": 0.5}
    aggregated = {**base, PD_MODE: "aggregated", GPU_SPLIT: "tp=8,dp=1,replicas=1"}
    split_pd = {**base, PD_MODE: "disaggregated", PD_LAYOUT: "1:1,prefill_tp=4,decode_tp=4",
                PD_ROUTER: "vllm-proxy", PD_PREFILL_BATCHED_TOKENS: 8192, PD_PREFILL_SEQS: 64}
    assert space.contains(aggregated) and space.contains(split_pd)
    assert not space.contains({**split_pd, GPU_SPLIT: "tp=8,dp=1,replicas=1"})
    assert deployment_for(space, Deployment(Split(8)), aggregated).pd is None  # type: ignore[union-attr]
    # the baseline (the target's split) projects into the aggregated half
    projected = space.project(SchedulerSettings.vllm_defaults(288), Deployment(Split(8)))
    assert projected[PD_MODE] == "aggregated" and PD_LAYOUT not in projected


def test_transfer_modes_are_a_dimension_only_when_asked() -> None:
    """``--pd-transfer-modes``: without it every P/D point pulls (no dimension, the study
    keys of before); with pull,push a point's mode reaches its layout, and a push
    layout reads back (a warm start) and is described as such."""
    _, plain = _space("on", pool_tps=(4,))
    assert PD_TRANSFER_MODE not in plain.names
    _, space = _space("on", pool_tps=(4,), transfer_modes=("pull", "push", "push"))
    mode = next(p for p in space.params if p.name == PD_TRANSFER_MODE)
    assert mode.choices == ("pull", "push") and mode.when == ()
    drawn = {"cache_aware_admission_window": 16, "cache_aware_admission_threshold": 0.5,
             PD_LAYOUT: "1:1,prefill_tp=4,decode_tp=4", PD_ROUTER: "llm-d",
             PD_PREFILL_BATCHED_TOKENS: 8192, PD_PREFILL_SEQS: 64, PD_TRANSFER_MODE: "push"}
    assert space.contains(drawn) and not plain.contains(drawn)
    dep = deployment_for(space, Deployment(Split(8)), drawn)
    assert dep is not None and dep.pd is not None and dep.pd.transfer_mode == "push"
    assert "; push" in dep.describe()
    assert space.project(SchedulerSettings(), dep)[PD_TRANSFER_MODE] == "push"
    pulled = deployment_for(space, Deployment(Split(8)), {**drawn, PD_TRANSFER_MODE: "pull"})
    assert pulled is not None and pulled.pd is not None and pulled.pd.transfer_mode == "pull"
    assert "push" not in pulled.describe()
    _, auto = _space("auto", pool_tps=(4,), transfer_modes=("push",))
    assert next(p for p in auto.params if p.name == PD_TRANSFER_MODE).when == (
        (PD_MODE, ("disaggregated",)),)


@pytest.mark.parametrize(("kw", "match"), [
    ({"mode": "on", "transfer_modes": ("write",)}, "--pd-transfer-modes 'write': pull or push"),
    ({"mode": "on", "transfer_modes": ("",)}, "--pd-transfer-modes '': pull or push"),
    ({"mode": "off", "transfer_modes": ("push",)}, "add --disaggregated on or auto"),
    ({"mode": "on", "gpu_budget": None}, "add --gpu-budget N"),
    ({"mode": "off", "pool_tps": (4,)}, "add --disaggregated on or auto"),
    ({"mode": "auto", "routers": ("nginx",)}, "P/D proxy 'nginx'"),
    ({"mode": "auto", "fill": "some"}, "--pd-gpus 'some'"),
    ({"mode": "off", "prefill_hardware": ("mi300x",)}, "add --disaggregated on or auto"),
])
def test_bad_p_d_search_inputs(kw: dict[str, Any], match: str) -> None:
    base = admission_space()
    with pytest.raises(ConfigError, match=match):
        with_pd(base, base, TARGET, **{"gpu_budget": 8, **kw})


def test_the_cli_refuses_bad_p_d_flags_in_one_line(tmp_path: pathlib.Path) -> None:
    trace = tmp_path / "t.parquet"
    trace.write_bytes(b"")
    args = ["tune", str(trace), "--hardware", "mi355x", "--model", "llama-3.1-70b",
            "--tp", "8", "-o", str(tmp_path / "p.yaml")]
    for extra, text in ((["--disaggregated", "on"], "add --gpu-budget N"),
                        (["--pd-tp", "3", "--disaggregated", "on", "--gpu-budget", "8"],
                         "--pd-tp '3': distinct powers of two"),
                        (["--disaggregated", "on", "--gpu-budget", "8",
                          "--pd-transfer-modes", "pull,read"],
                         "--pd-transfer-modes 'read': pull or push")):
        res = CliRunner().invoke(cli, args + extra)
        assert res.exit_code == 2, res.output
        assert res.output.count("\n") == 1 and text in res.output, res.output
    res = CliRunner().invoke(cli, args + ["--disaggregated", "maybe"])
    assert res.exit_code == 2 and "maybe" in res.output
    assert not (tmp_path / "p.yaml").exists()


# --------------------------------------------------------------------------- the answer


class PDFake(FleetFake):
    """FleetFake plus P/D layouts: ``wins`` shapes an agentic-like surface (splitting helps
    both objectives, up to a decode share of 3/4 of the GPUs: the knee at 1:3), otherwise
    a chat-like one (splitting costs throughput and interactivity)."""

    def __init__(self, *, wins: bool) -> None:
        super().__init__()
        self.wins = wins

    def evaluate(self, settings: SchedulerSettings, window: str, *,
                 deployment: Deployment | None = None) -> dict[str, Any]:
        pd = deployment.pd if deployment is not None else None
        out = super().evaluate(settings, window,
                               deployment=None if pd is not None else deployment)
        if pd is None:
            return out
        share = pd.num_decode * pd.decode_tp / layout_gpus(pd)
        if self.wins:
            gain = min(share, 0.75) / 0.75
            out["p90_interactivity"] *= 1 + 0.6 * gain
            out["output_throughput_per_gpu"] *= 1 + 0.5 * gain
        else:
            out["p90_interactivity"] *= 0.9
            out["output_throughput_per_gpu"] *= 0.85
        out["ttft_p90_s"] = out["ttft_p90_s"] * 1.1
        out.pop("engines", None)
        return out


def _pd_study(wins: bool, mode: str = "auto"):
    fake = PDFake(wins=wins)
    result = tune(TuneInputs(evaluator=fake, target=TARGET),
                  SearchOptions(space="admission", n_trials=40, seed=5, n_survivors=8),
                  DeploymentSearch(gpu_budget=8, disaggregated=mode, pd_tps=(1, 2, 4)))
    return fake, result


def test_a_study_picks_p_d_where_it_wins_and_says_so_with_the_knee() -> None:
    from tuner.profile.recommend import TunedProfile, summary_lines

    fake, result = _pd_study(wins=True)
    assert any(d and d.get("pd") for d in fake.deployments) or result.pd_verdict is not None
    verdict = result.pd_verdict
    assert verdict is not None and verdict.wins
    assert result.to_dict()["recommended"]["deployment"]["pd"] is not None
    assert verdict.delta_pct("p90_interactivity") > 10  # type: ignore[operator]
    assert verdict.delta_pct("output_throughput_per_gpu") > 5  # type: ignore[operator]
    knees = {k.objective: k for k in verdict.knees}
    assert knees["p90_interactivity"].ratio == "1:3"
    run = TunedProfile(result, profile_of(result, "pd"), pathlib.Path("pd.yaml"), "", [])
    lines = summary_lines(run)
    head = next(ln for ln in lines if ln.startswith("disaggregation "))
    assert head.startswith("disaggregation wins on this trace: the best P/D layout, P/D ")
    assert "against the best aggregated layout" in head and "p90_interactivity" in head
    assert f"{verdict.delta_pct('p90_interactivity'):+.1f} %" in head
    assert any(ln.startswith("P:D knee (prefill:decode GPUs") and "p90_interactivity 1:3"
               in ln for ln in lines)
    data = result.to_dict()["disaggregation"]
    assert data["wins"] is True and data["knees"] and data["points"]["pd"] > 0


def test_a_study_declines_p_d_where_it_loses() -> None:
    _, result = _pd_study(wins=False)
    verdict = result.pd_verdict
    assert verdict is not None and not verdict.wins
    assert "pd" not in result.to_dict()["recommended"]["deployment"]
    assert verdict.delta_pct("output_throughput_per_gpu") < 0  # type: ignore[operator]
    assert verdict.lines()[0].startswith("disaggregation does not win on this trace")


def test_off_gives_no_verdict_and_on_compares_with_the_baseline() -> None:
    fake = PDFake(wins=True)
    off = tune(TuneInputs(evaluator=fake, target=TARGET),
               SearchOptions(space="admission", n_trials=8, seed=3, n_survivors=4),
               DeploymentSearch(gpu_budget=8))
    assert off.pd_verdict is None and "disaggregation" not in off.to_dict()
    assert not any(d and "pd" in d for d in fake.deployments)
    _, on = _pd_study(wins=True, mode="on")
    assert on.pd_verdict is not None and on.pd_verdict.best_aggregated_trial == -1
    assert "the baseline (--disaggregated on" in on.pd_verdict.lines()[0]


def test_the_knee_is_the_first_ratio_within_two_percent_of_the_best() -> None:
    from tuner.tune.deployment_space import join_settings
    from tuner.tune.objectives import parse_objectives

    objs = parse_objectives(["p90_interactivity"], None)
    settings = SchedulerSettings.vllm_defaults(288)

    def point(n: int, layout: PDLayout, value: float) -> Point:
        dep = Deployment(Split(layout.decode_tp), None, pd=layout, pd_router="vllm-proxy")
        return Point(n, {}, join_settings(settings, dep), {"p90_interactivity": value})

    points = [point(0, PDLayout(3, 1, 2, 2), 10.0), point(1, PDLayout(1, 1, 4, 4), 15.0),
              point(2, PDLayout(1, 3, 2, 2), 19.7), point(3, PDLayout(1, 7, 1, 1), 20.0),
              point(4, PDLayout(1, 3, 2, 2), 12.0)]
    (knee,) = knee_ratios(points, objs)
    assert (knee.ratio, knee.best_ratio) == ("1:3", "1:7")
    assert [r for r, _ in knee.curve] == ["3:1", "1:1", "1:3", "1:7"]
    assert knee_ratios(points[:1], objs) == []  # one ratio: no knee


# --------------------------------------------------------------------------- export


def _pd_profile() -> Any:
    _, result = _pd_study(wins=True)
    return profile_of(result, "pd"), result


def test_a_p_d_pick_is_recorded_and_exported_per_pool_instance(tmp_path: pathlib.Path) -> None:
    profile, result = _pd_profile()
    pick = Deployment.from_dict(result.to_dict()["recommended"]["deployment"])
    assert pick.pd is not None
    t = profile.target
    assert t.disaggregation is not None and t.tp == pick.pd.decode_tp
    assert t.num_gpus == layout_gpus(pick.pd) == 8
    assert profile.deployment() == pick
    again = profile_from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again.target.disaggregation == t.disaggregation and again.deployment() == pick
    text = export_profile(again, "flags")
    serves = [ln for ln in text.splitlines() if ln.startswith("vllm serve ")]
    assert len(serves) == pick.pd.num_prefill + pick.pd.num_decode
    assert all("MoRIIOConnector" in ln and "--max-num-batched-tokens" in ln for ln in serves)
    assert sum(f"--tensor-parallel-size {pick.pd.prefill_tp} " in ln
               for ln in serves[:pick.pd.num_prefill]) == pick.pd.num_prefill
    # the prefill pool's own limits (searched per pool) on its instances, the profile's
    # scheduler flags on the decode instances
    own = pick.pd.prefill_overrides()
    assert set(own) == {"max_num_batched_tokens", "max_num_seqs"}
    for ln in serves[:pick.pd.num_prefill]:
        assert f"--max-num-batched-tokens {own['max_num_batched_tokens']} " in ln
        assert f"--max-num-seqs {own['max_num_seqs']} " in ln
    settings = profile.scheduler
    for ln in serves[pick.pd.num_prefill:]:
        assert f"--max-num-batched-tokens {settings.max_num_batched_tokens} " in ln
    assert t.disaggregation["prefill_max_num_seqs"] == own["max_num_seqs"]
    assert "toy_proxy_server.py" in text.splitlines()[-1]
    assert export_profile(again, "router").startswith("python toy_proxy_server.py")
    assert "--format flags" in export_profile(again, "yaml")  # one instance's settings, said so
    bad = json.loads(json.dumps(profile.to_dict()))
    bad["target"]["disaggregation"]["num_decode"] = 0
    with pytest.raises(ProfileError, match=r"target\.disaggregation: num_decode: must be an "
                                           r"integer >= 1 \(got 0\)"):
        profile_from_dict(bad)


@pytest.mark.skipif(not os.environ.get("TUNER_VLLM033_PYTHON"),
                    reason="needs TUNER_VLLM033_PYTHON (a vLLM 0.33.0 environment)")
def test_check_vllm_accepts_an_exported_p_d_pick(tmp_path: pathlib.Path) -> None:
    profile, _ = _pd_profile()
    path = save_profile(profile, tmp_path / "pd.yaml")
    res = CliRunner().invoke(
        cli, ["export", str(path), "--check-vllm", os.environ["TUNER_VLLM033_PYTHON"]])
    assert res.exit_code == 0, res.output
    assert "vLLM check: ok 0.33.0" in res.stderr
    assert "vLLM P/D check: ok 0.33.0 prefill 0" in res.stderr and "decode 0" in res.stderr


# --------------------------------------------------------------------------- the twin


@pytest.mark.slow
def test_a_study_on_the_twin_replays_p_d_layouts(small_trace: pathlib.Path) -> None:
    """Trials replay P/D layouts through the P/D replay, and the answer compares the best
    of them with the baseline on the same held-out requests."""
    from tuner.tune.robust import RobustOptions

    target = Target(hardware="mi355x", model="llama-3.1-70b", tp=8, num_gpu_blocks=1500)
    result = tune(TuneInputs(small_trace, target=target),
                  SearchOptions(n_trials=5, n_survivors=2, seed=0,
                                robust=RobustOptions(enabled=False)),
                  DeploymentSearch(gpu_budget=8, disaggregated="on", pd_tps=(4,)))
    verdict = result.pd_verdict
    assert verdict is not None and verdict.window == "holdout"
    assert verdict.best_pd.startswith("P/D 1:1 (prefill TP4, decode TP4")
    assert verdict.best_pd.endswith(", 8 GPUs") and verdict.best_aggregated.endswith(", 8 GPUs")
    pd, agg = verdict.pd_metrics, verdict.aggregated_metrics
    assert pd["num_requests"] == agg["num_requests"] > 0
    assert pd["num_finished"] > 0 and math.isfinite(pd["p90_interactivity"])
    assert pd != agg


def _twin_pd_study(trace: pathlib.Path, n_trials: int, n_survivors: int, **pd: Any) -> Any:
    """A small ``--disaggregated on`` study of 8 GPUs (pool TP4) on the twin."""
    from tuner.tune.robust import RobustOptions

    target = Target(hardware="mi355x", model="llama-3.1-70b", tp=8, num_gpu_blocks=1500)
    return tune(TuneInputs(trace, target=target),
                SearchOptions(n_trials=n_trials, n_survivors=n_survivors, seed=0,
                              robust=RobustOptions(enabled=False)),
                DeploymentSearch(gpu_budget=8, disaggregated="on", pd_tps=(4,), **pd))


@pytest.mark.slow
def test_a_study_on_the_twin_replays_mixed_pools(small_trace: pathlib.Path) -> None:
    """``prefill_hardware``: the study's P/D trials replay the prefill pool on the named
    hardware (here only MI300X prefill with MI355X decode), and the answer names it."""
    result = _twin_pd_study(small_trace, 4, 2, pd_prefill_hardware=("mi300x",))
    verdict = result.pd_verdict
    assert verdict is not None
    assert verdict.best_pd.startswith("P/D 1:1 (prefill TP4 on mi300x, decode TP4")
    pick = result.to_dict()["recommended"]["deployment"]
    if pick.get("pd"):
        assert pick["pd"]["prefill_hardware"] == "mi300x"


@pytest.mark.slow
def test_a_study_searching_push_replays_it_and_records_the_pick(small_trace: pathlib.Path
                                                                ) -> None:
    """``transfer_modes=("push",)``: every P/D trial replays the push connector (the
    prefill engine keeps stepping while it writes), and a P/D pick records it."""
    result = _twin_pd_study(small_trace, 3, 1, pd_transfer_modes=("push",))
    assert result.pd_verdict is not None and "; push" in result.pd_verdict.best_pd
    pick = result.to_dict()["recommended"]["deployment"]
    if pick.get("pd"):
        assert pick["pd"]["transfer_mode"] == "push"


def _push_profile() -> Any:
    profile, _ = _pd_profile()
    raw = json.loads(json.dumps(profile.to_dict()))
    raw["target"]["disaggregation"]["transfer_mode"] = "push"
    return profile_from_dict(raw), raw


def test_a_push_pick_is_recorded_and_exported_with_the_push_connector() -> None:
    profile, raw = _push_profile()
    assert profile.target.disaggregation["transfer_mode"] == "push"
    assert profile.deployment().pd.transfer_mode == "push"
    again = profile_from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again.target.disaggregation == profile.target.disaggregation
    serves = [ln for ln in export_profile(again, "flags").splitlines()
              if ln.startswith("vllm serve ")]
    assert serves and all('"read_mode":"false"' in ln for ln in serves)  # MoRIIO WRITE
    raw["target"]["disaggregation"]["transfer_mode"] = "write"
    with pytest.raises(ProfileError, match=r"target\.disaggregation: transfer_mode: pull or "
                                           r"push \(got 'write'\)"):
        profile_from_dict(raw)


@pytest.mark.skipif(not os.environ.get("TUNER_VLLM033_PYTHON"),
                    reason="needs TUNER_VLLM033_PYTHON (a vLLM 0.33.0 environment)")
def test_check_vllm_accepts_an_exported_push_pick(tmp_path: pathlib.Path) -> None:
    profile, _ = _push_profile()
    path = save_profile(profile, tmp_path / "pd.yaml")
    res = CliRunner().invoke(
        cli, ["export", str(path), "--check-vllm", os.environ["TUNER_VLLM033_PYTHON"]])
    assert res.exit_code == 0, res.output
    assert "vLLM P/D check: ok 0.33.0 prefill 0" in res.stderr
