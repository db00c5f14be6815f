"""Early stop of stage-1 replays (tuner.tune.early_stop): a replay stops only once its
constraint is proven violated, its bound never exceeds what the whole replay gives, a
replay that is not stopped is unchanged, and a study with the stop keeps every feasible
point (and its numbers) of the study without it."""

from __future__ import annotations

import math
import pathlib
import random

import numpy as np
import pytest

from tuner.perf.target import Target
from tuner.tune import ReplayEvaluator, SearchOptions, StudyOutput, TuneInputs, tune
from tuner.tune.early_stop import ReplayStopped, StopRule, stop_rules
from tuner.tune.objectives import parse_constraints

TARGET = Target(hardware="mi355x", model="llama-3.1-70b", tp=8, num_gpu_blocks=1500)


def test_stop_rules_are_latency_percentile_upper_bounds() -> None:
    rules = stop_rules(parse_constraints(["ttft_p90_s<=2", "e2e_p99_s<=30",
                                          "ttft_mean_s<=1", "output_throughput>=10"]))
    assert [(r.metric, r.q, r.bound) for r in rules] == [("ttft", 90.0, 2.0),
                                                         ("e2e", 99.0, 30.0)]
    assert rules[0].constraint == "ttft_p90_s<=2"


@pytest.mark.parametrize("q", [50.0, 90.0, 95.5, 99.0])
def test_the_needed_count_proves_numpys_percentile_for_any_rest(q: float) -> None:
    """``needed(n)`` values above the bound put the percentile of any N <= n values that
    include them above it, whatever the others are (ties at the bound included)."""
    rng = random.Random(int(q))
    rule = StopRule("x", "ttft", q, 2.0)
    for n in list(range(1, 60)) + [101, 1000, 1387, 4096]:
        k = rule.needed(n)
        assert 1 <= k <= n
        for _ in range(4):
            late = [2.0 + rng.expovariate(1.0) + 1e-9 for _ in range(k)]
            n_true = rng.randint(k, n)  # some requests never count (rejected)
            rest = [rng.choice([2.0, rng.uniform(0.0, 2.0)]) for _ in range(n_true - k)]
            assert np.percentile(late + rest, q, method="linear") > 2.0, (n, k, n_true)


def _replay_pair(small_trace: pathlib.Path, key: str, fraction: float
                 ) -> tuple[ReplayEvaluator, dict, StopRule]:
    ev = ReplayEvaluator(small_trace, target=TARGET, holdout=0.25, stage1_fraction=1.0)
    whole = ev.evaluate(ev.default_settings, "train")
    bound = whole[key] * fraction
    (rule,) = stop_rules(parse_constraints([f"{key}<={bound!r}"]))
    return ev, whole, rule


@pytest.mark.parametrize("key", ["ttft_p90_s", "e2e_p90_s"])
def test_a_stopped_replay_bounds_the_whole_replay_from_below(small_trace: pathlib.Path,
                                                             key: str) -> None:
    ev, whole, rule = _replay_pair(small_trace, key, 0.5)
    with pytest.raises(ReplayStopped) as caught:
        ev.evaluate(ev.default_settings, "train", stop=(rule,))
    stopped = caught.value
    assert stopped.rule == rule
    assert rule.bound < stopped.lower_bound <= whole[key] + 1e-9
    assert 0 < stopped.violation <= whole[key] - rule.bound + 1e-9
    assert stopped.late == rule.needed(stopped.n) and stopped.finished < whole["num_requests"]
    assert key.split("_")[0] in stopped.reason and "proven violated" in stopped.reason


@pytest.mark.parametrize("key", ["ttft_p90_s", "e2e_p90_s"])
def test_a_replay_that_meets_its_bound_runs_whole_and_unchanged(small_trace: pathlib.Path,
                                                                key: str) -> None:
    ev, whole, rule = _replay_pair(small_trace, key, 1.0)  # the bound is met exactly
    watched = ev.evaluate(ev.default_settings, "train", stop=(rule,))
    assert {k: v for k, v in watched.items() if k not in ("wall_s", "speed_ratio")} == \
        {k: v for k, v in whole.items() if k not in ("wall_s", "speed_ratio")}


def test_a_study_with_the_stop_keeps_every_feasible_point_of_one_without(
        small_trace: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Nine trials: the baseline and TPE's random start-up points, the same with the stop
    on and off (the start-up draws do not depend on the results). Every trial the stop
    pruned is infeasible in the whole replays, by at least the bound it recorded; every
    other trial has the same numbers; stage 2 and the pick are the same."""
    import optuna
    from optuna.trial import TrialState

    from tuner.tune.study_records import StudyRecords

    runs = {}
    for early in (True, False):
        runs[early] = tune(TuneInputs(small_trace, target=TARGET, stage1_fraction=0.5),
                           SearchOptions(space="scheduler", n_trials=9, seed=3,
                                         constraints=("ttft_p90_s<=0.3",), early_stop=early),
                           output=StudyOutput(storage=str(tmp_path / f"{early}.optuna-journal"),
                                              study_name="s"))
    on, off = runs[True], runs[False]
    assert off.n_stopped == 0 and on.n_stopped >= 1  # the premise: the stop happened
    trials = {early: optuna.load_study(study_name="s", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / f"{early}.optuna-journal")))
    ).get_trials(deepcopy=False) for early in (True, False)}
    feasible = 0
    for a, b in zip(trials[True], trials[False], strict=True):
        assert a.params == b.params
        if StudyRecords.stopped(a) is not None:
            assert a.state == TrialState.PRUNED and StudyRecords.role(a) != StudyRecords.BASELINE
            (name, bound), = a.constraints.items() if a.constraints else ((None, None),)
            assert name == "ttft_p90_s<=0.3" and 0 < bound <= b.constraints[name] + 1e-9
            continue
        assert a.state == b.state == TrialState.COMPLETE and a.values == b.values
        assert a.constraints == b.constraints
        feasible += all(v <= 0 for v in b.constraints.values())
    assert feasible >= 1  # the premise: some points meet the bound
    assert [p.settings for p in on.stage2] == [p.settings for p in off.stage2]
    assert on.recommended.settings == off.recommended.settings
    assert on.to_dict()["recommended"] == off.to_dict()["recommended"]
    assert math.isclose(on.baseline.metrics["ttft_p90_s"], off.baseline.metrics["ttft_p90_s"])
