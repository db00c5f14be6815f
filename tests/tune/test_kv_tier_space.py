"""The CPU KV tier's size and eviction policy as search dimensions (tuner.tune.kv_tier_space),
the host-memory budget, the tier's gain line and the pick's tier in the profile."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import optuna
import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.perf.deployment import Deployment, Split
from tuner.perf.target import Target
from tuner.profile import profile_of
from tuner.tune import ReplayEvaluator, SearchOptions, TuneInputs, admission_space, tune
from tuner.tune.kv_tier_space import (KvTierGain, host_budget, parse_kv_policies,
                                      parse_kv_sizes, with_kv_tier)
from tuner.tune.robust import RobustOptions
from tuner.tune.space import KV_TIER_POLICY, KV_TIER_SIZE

#: KV-bound: 300 blocks of 16 tokens (4,800 tokens) for 24 agentic sessions of 1-10k tokens;
#: an 8B block is 2 MiB, so 1 GiB holds 512 blocks and 4 GiB 2,048.
TARGET = Target(hardware="mi355x", model="llama-3.1-8b", num_gpu_blocks=300)


def test_sampling_draws_sizes_and_policies() -> None:
    space, notes = with_kv_tier(admission_space(), TARGET, (0.0, 1.0, 4.0), ("lru", "arc"),
                                host_memory_gb=64)
    assert space.names[-2:] == (KV_TIER_SIZE, KV_TIER_POLICY) and space.has_deployment
    assert "cache_aware_admission_window" in space.names  # admission searched beside it
    assert notes == ["CPU KV tier searched over 0, 1, 4 GiB per engine within 8 GiB "
                     "(--host-memory-gb)"]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = [space.suggest(study.ask()) for _ in range(40)]
    assert {d[KV_TIER_SIZE] for d in drawn} == {0.0, 1.0, 4.0}
    assert {d[KV_TIER_POLICY] for d in drawn if KV_TIER_POLICY in d} == {"lru", "arc"}
    assert all(KV_TIER_POLICY not in d for d in drawn if d[KV_TIER_SIZE] == 0.0)


def test_deployment_carries_the_tier_onto_the_target() -> None:
    plain = Deployment(Split(1))
    assert "kv_offloading_size" not in plain.to_dict()  # older study records unchanged
    tier = Deployment(Split(1), None, None, 4.0, "arc")
    assert Deployment.from_dict(tier.to_dict()) == tier
    assert tier.describe() == "TP1, CPU KV tier 4 GiB (arc)"
    on = tier.apply(TARGET)
    assert on.kv_offloading_size == 4.0 and on.kv_offloading_eviction_policy == "arc"
    off = Deployment(Split(1), None, None, 0.0).apply(dataclasses.replace(
        TARGET, kv_offloading_size=8.0))
    assert off.kv_offloading_size is None  # 0 = no tier, even over the target's own
    with pytest.raises(ConfigError, match=r"^deployment.kv_offloading_size: must be GiB >= 0"):
        Deployment.from_dict({"tp": 1, "kv_offloading_size": -1})


def test_sizes_above_the_host_budget_are_refused() -> None:
    with pytest.raises(ConfigError, match=(
            r"^--kv-offloading-sizes 16: above the host budget of 8 GiB per engine \(64 GiB "
            r"per node \[--host-memory-gb\] over 8 engine\(s\) of TP1\); lower the size or "
            r"raise --host-memory-gb$")):
        with_kv_tier(admission_space(), TARGET, (0.0, 16.0), None, host_memory_gb=64)
    tp8 = dataclasses.replace(TARGET, hardware="h200", tp=8)
    budget = host_budget(tp8, None)  # DGX H200: 2 TB, one TP8 engine per node
    assert (budget.gib, budget.engines, budget.per_engine_gib) == (2048, 1, 2048)
    assert "DGX H200" in budget.source
    with pytest.raises(ConfigError, match="pass --host-memory-gb"):
        host_budget(TARGET, None)  # MI355X: OEM servers, no single vendor figure
    with pytest.raises(ConfigError, match="modelled for one engine"):
        with_kv_tier(admission_space(), dataclasses.replace(TARGET, replicas=2), (0.0, 1.0),
                     None, host_memory_gb=64)
    with pytest.raises(ConfigError, match="needs a tier"):
        with_kv_tier(admission_space(), TARGET, None, ("lru", "arc"))
    for bad in ("1,x", "-1", "1,1", "0"):
        with pytest.raises(ConfigError, match="--kv-offloading-sizes"):
            parse_kv_sizes(bad)
    with pytest.raises(ConfigError, match="--kv-offloading-policies"):
        parse_kv_policies("lru,fifo")


def test_tune_cli_refuses_a_size_over_budget_in_one_line(small_trace: pathlib.Path,
                                                         tmp_path: pathlib.Path) -> None:
    out = tmp_path / "p.yaml"
    r = CliRunner().invoke(cli, ["tune", str(small_trace), "--model", "llama-3.1-8b",
                                 "--kv-offloading-sizes", "0,512", "--host-memory-gb", "1024",
                                 "-o", str(out), "--trials", "2"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1] == (
        "Error: --kv-offloading-sizes 512: above the host budget of 128 GiB per engine "
        "(1024 GiB per node [--host-memory-gb] over 8 engine(s) of TP1); lower the size or "
        "raise --host-memory-gb")
    assert not out.exists()


def test_a_tier_trial_replays_admission_and_the_tier(small_trace: pathlib.Path) -> None:
    ev = ReplayEvaluator(small_trace, target=TARGET)
    base = ev.default_deployment
    settings = ev.default_settings.replace(cache_aware_admission_window=8,
                                           cache_aware_admission_threshold=0.5)
    off = ev.evaluate(settings, "stage1", deployment=dataclasses.replace(
        base, kv_offloading_size=0.0))
    on = ev.evaluate(settings, "stage1", deployment=dataclasses.replace(
        base, kv_offloading_size=4.0, kv_offloading_eviction_policy="lru"))
    assert on["kv_hit_rate"] > off["kv_hit_rate"]  # CPU hits on top of the GPU's
    plain = ev.evaluate(ev.default_settings, "stage1", deployment=dataclasses.replace(
        base, kv_offloading_size=4.0, kv_offloading_eviction_policy="lru"))
    assert plain != on  # the admission settings reach the tier trial too


def test_a_tune_records_the_tier_and_prints_its_gain(small_trace: pathlib.Path) -> None:
    from tuner.profile.recommend import summary_lines  # noqa: F401  (the CLI's report)

    result = tune(TuneInputs(small_trace, target=TARGET),
                  SearchOptions(n_trials=8, seed=1, kv_offloading_sizes=(0.0, 1.0, 4.0),
                                kv_offloading_policies=("lru", "arc"), host_memory_gb=64,
                                robust=RobustOptions(enabled=False)))
    # None: the baseline, which replays the target's own tier (here none)
    sizes = {p.params.get(KV_TIER_SIZE) for p in result.stage2} - {None}
    assert sizes <= {0.0, 1.0, 4.0} and len(sizes) > 1
    gain = result.kv_tier_gain
    assert isinstance(gain, KvTierGain) and gain.window == "holdout"
    pick = result.deployment_of(result.recommended)
    assert gain.size_gib == pick["kv_offloading_size"]
    assert gain.with_tier != gain.without
    assert gain.line().startswith("CPU KV tier (")
    assert result.to_dict()["kv_tier_gain"]["kv_offloading_size"] == gain.size_gib
    target = profile_of(result, "s").target
    assert target.kv_offloading_size == (pick["kv_offloading_size"] or None)
    if pick["kv_offloading_size"]:
        assert target.kv_offloading_eviction_policy == pick["kv_offloading_eviction_policy"]


def test_gain_line_says_not_worth_it_when_nothing_moves() -> None:
    same = {"kv_hit_rate": 0.4, "ttft_p90_s": 2.0, "output_throughput_per_gpu": 300.0}
    flat = KvTierGain(4.0, 0.0, "lru", "holdout", dict(same), dict(same))
    assert not flat.worth_it and flat.line().endswith("-- not worth it on this trace")
    hits_only = KvTierGain(4.0, 0.0, "lru", "holdout", {**same, "kv_hit_rate": 0.6},
                           dict(same))
    assert not hits_only.worth_it  # hits that buy no TTFT or throughput do not pay
    slower = KvTierGain(4.0, 0.0, "lru", "holdout", {**same, "ttft_p90_s": 1.0,
                                                     "output_throughput_per_gpu": 290.0},
                        dict(same))
    assert not slower.worth_it  # a TTFT gain paid for with throughput
    better = KvTierGain(4.0, 0.0, "arc", "holdout", {**same, "kv_hit_rate": 0.6,
                                                     "ttft_p90_s": 1.5}, dict(same))
    assert better.worth_it
    assert better.line() == (
        "CPU KV tier (4 GiB, arc) against none at the pick's settings, held-out window: "
        "kv_hit_rate 0.4 -> 0.6 (+50.0 %); ttft_p90_s 2 -> 1.5 (-25.0 %); "
        "output_throughput_per_gpu 300 -> 300 (+0.0 %)")
    none = KvTierGain(0.0, 4.0, "lru", "train", dict(same), dict(same))
    assert none.line().endswith("not worth it on this trace (the pick has no tier)")
    assert json.loads(json.dumps(better.to_dict()))["worth_it"] is True


def test_tune_cli_prints_the_gain_line(small_trace: pathlib.Path, tmp_path: pathlib.Path
                                       ) -> None:
    out = tmp_path / "p.yaml"
    args = ["tune", str(small_trace), "--model", "llama-3.1-8b", "--num-gpu-blocks", "300",
            "--kv-offloading-sizes", "0,4", "--host-memory-gb", "64", "--trials", "4",
            "--robust", "off", "--no-progress", "-o", str(out)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "CPU KV tier (4 GiB, lru) against none at the pick's settings, held-out " \
           "window: kv_hit_rate" in " ".join(r.output.split())
    j = CliRunner().invoke(cli, args[:-1] + [str(tmp_path / "q.yaml"), "--json"])
    assert j.exit_code == 0, j.output
    gain = json.loads(j.output)["kv_tier_gain"]
    assert set(gain["with_tier"]) == {"kv_hit_rate", "ttft_p90_s", "output_throughput_per_gpu"}
    assert isinstance(gain["worth_it"], bool)
    flags = json.loads(j.output)["flags"]
    assert ("--kv-offloading-size 4.0" in flags) == (gain["kv_offloading_size"] == 4.0)


def test_a_baseline_pick_with_the_targets_own_tier_is_compared_with_none(
        small_trace: pathlib.Path) -> None:
    """The baseline point carries no drawn size: its tier is the target's own."""
    from tuner.tune.kv_tier_space import kv_tier_gain
    from tuner.tune.select import Point

    own = dataclasses.replace(TARGET, kv_offloading_size=4.0)
    ev = ReplayEvaluator(small_trace, target=own)
    space, _ = with_kv_tier(admission_space(), own, (0.0, 1.0), None, host_memory_gb=64)
    point = Point(number=-1, settings=ev.default_settings.to_dict(), params={},
                  metrics={}, holdout={}, feasible=True)
    gain = kv_tier_gain(ev, point, space, window="stage1")
    assert gain is not None and (gain.size_gib, gain.other_gib) == (4.0, 0.0)
    assert gain.with_tier["kv_hit_rate"] > gain.without["kv_hit_rate"]
