"""The study machinery on the analytic evaluator: baseline, refusals, constraints, resume,
warm start, parallel workers and joining."""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import signal
import socket
import time

import optuna
import pytest
from optuna.trial import TrialState

from tests.tune.fake import FakeEvaluator
from tuner.errors import ConfigError, StudyNotFound
from tuner.profile import Profile, ProfileTarget, load_profile, save_profile, warm_start_of
from tuner.sim.settings import SchedulerSettings
from tuner.tune import (SearchOptions, StudyOutput, TuneInputs, join, open_storage, redact_url,
                        tune)


def _study(path: pathlib.Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(str(path)))


def test_baseline_is_trial_zero_and_the_pick_beats_it(fake: FakeEvaluator) -> None:
    result = tune(TuneInputs(evaluator=fake), SearchOptions(n_trials=30, seed=1))
    assert result.front, "a Pareto front"
    stage1 = [c for c in fake.calls if c[1] == "stage1"]
    assert stage1[0][0] == fake.default_settings.to_dict()  # trial 0 = vLLM's defaults
    assert result.baseline.is_baseline and result.baseline.number == 0
    rec = result.recommended
    assert not rec.is_baseline
    assert rec.metrics["p90_interactivity"] >= result.baseline.metrics["p90_interactivity"]
    assert rec.metrics["output_throughput_per_gpu"] > result.baseline.metrics[
        "output_throughput_per_gpu"]
    assert result.confirms() == {"train": True, "holdout": True,
                                 "failed": {"train": [], "holdout": []}}
    # Stage 2 replays survivors on the train window, stage 3 the front on the held-out one.
    assert {w for _, w in fake.calls} == {"stage1", "train", "holdout"}
    assert rec.holdout is not None and result.baseline.holdout is not None


def test_refused_combinations_are_pruned_and_never_replayed() -> None:
    fake = FakeEvaluator()
    result = tune(TuneInputs(evaluator=fake),
                  SearchOptions(space="scheduler", n_trials=40, seed=2))
    assert result.n_refused > 0
    for settings, _ in fake.calls:
        assert settings["max_num_batched_tokens"] >= settings["max_num_seqs"]
    study_trials = result.n_complete + result.n_pruned
    assert study_trials >= 40


def test_refused_trial_states_reason(tmp_path: pathlib.Path) -> None:
    journal = tmp_path / "s.optuna-journal"
    tune(TuneInputs(evaluator=FakeEvaluator()),
         SearchOptions(space="scheduler", n_trials=40, seed=2),
         output=StudyOutput(storage=str(journal), study_name="s"))
    pruned = _study(journal, "s").get_trials(states=(TrialState.PRUNED,))
    assert pruned and all("must be greater than or equal to max_num_seqs" in t.user_attrs["refused"]
                          for t in pruned)


def test_constraints_reach_optuna_and_the_pick_is_feasible(tmp_path: pathlib.Path) -> None:
    journal = tmp_path / "c.optuna-journal"
    result = tune(TuneInputs(evaluator=FakeEvaluator()),
                  SearchOptions(n_trials=30, seed=1, constraints=["ttft_p90_s<=1.3"]),
                  output=StudyOutput(storage=str(journal), study_name="c"))
    trials = _study(journal, "c").get_trials(states=(TrialState.COMPLETE,))
    assert all("ttft_p90_s<=1.3" in t.constraints for t in trials)
    assert any(t.constraints["ttft_p90_s<=1.3"] > 0 for t in trials)
    assert result.n_infeasible > 0
    assert result.recommended.metrics["ttft_p90_s"] <= 1.3
    assert result.recommended.settings["cache_aware_admission_window"] <= 8
    assert all(p.metrics["ttft_p90_s"] <= 1.3 for p in result.front)


def test_resume_continues_to_n_and_refuses_a_different_search(tmp_path: pathlib.Path) -> None:
    journal = tmp_path / "r.optuna-journal"
    first = FakeEvaluator()
    tune(TuneInputs(evaluator=first), SearchOptions(n_trials=6, seed=0),
         output=StudyOutput(storage=str(journal), study_name="r"))
    assert len([c for c in first.calls if c[1] == "stage1"]) == 6
    second = FakeEvaluator()
    result = tune(TuneInputs(evaluator=second), SearchOptions(n_trials=14, seed=0),
                  output=StudyOutput(storage=str(journal), study_name="r"))
    assert len([c for c in second.calls if c[1] == "stage1"]) == 8
    assert result.n_complete == 14
    # a third run of the finished study replays nothing: stage-1, stage-2 and held-out
    # results are all read back from the study
    third = FakeEvaluator()
    again = tune(TuneInputs(evaluator=third), SearchOptions(n_trials=14, seed=0),
                 output=StudyOutput(storage=str(journal), study_name="r"))
    assert third.calls == []
    assert again.recommended.settings == result.recommended.settings
    with pytest.raises(ConfigError, match="already exists with a different search space"):
        tune(TuneInputs(evaluator=FakeEvaluator()), SearchOptions(space="scheduler", n_trials=14),
             output=StudyOutput(storage=str(journal), study_name="r"))
    with pytest.raises(ConfigError, match=r"a different trace \(fingerprint\)"):
        tune(TuneInputs(evaluator=FakeEvaluator(fingerprint="other")), SearchOptions(n_trials=14),
             output=StudyOutput(storage=str(journal), study_name="r"))


def _run_slow(journal: str) -> None:
    tune(TuneInputs(evaluator=FakeEvaluator(delay_s=0.05)), SearchOptions(n_trials=200, seed=0),
         output=StudyOutput(storage=journal, study_name="k"))


def test_killed_run_resumes(tmp_path: pathlib.Path) -> None:
    # A SIGKILL can land between ask() and the trial recording its pid (milliseconds);
    # that leftover is another case (an orphan, failed after ORPHAN_AFTER_S): retry.
    for attempt in range(5):
        journal = tmp_path / f"k{attempt}.optuna-journal"
        killed = _kill_a_run(journal)
        running = killed.get_trials(states=(TrialState.RUNNING,))
        if running and all("pid" in t.user_attrs for t in running):
            break
    _check_resume(journal, killed)


def _kill_a_run(journal: pathlib.Path) -> "optuna.Study":
    proc = multiprocessing.get_context("fork").Process(target=_run_slow, args=(str(journal),))
    proc.start()
    deadline = time.time() + 60
    try:
        while time.time() < deadline:
            time.sleep(0.2)
            try:  # the file exists a moment before the study does
                done = _study(journal, "k").get_trials(states=(TrialState.COMPLETE,))
            except KeyError:
                continue
            if len(done) >= 5:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
    return _study(journal, "k")


def _check_resume(journal: pathlib.Path, killed: "optuna.Study") -> None:
    done_before = len(killed.get_trials(states=(TrialState.COMPLETE,)))
    assert 5 <= done_before < 200
    assert killed.get_trials(states=(TrialState.RUNNING,)), "the kill left a trial running"
    fresh = FakeEvaluator()
    result = tune(TuneInputs(evaluator=fresh), SearchOptions(n_trials=done_before + 4, seed=0),
                  output=StudyOutput(storage=str(journal), study_name="k"))
    assert any("left running by a dead process" in n for n in result.notes)
    after = _study(journal, "k")
    assert not after.get_trials(states=(TrialState.RUNNING,))
    assert len(after.get_trials(states=(TrialState.COMPLETE,))) == done_before + 4
    assert len([c for c in fresh.calls if c[1] == "stage1"]) == 4


def test_orphan_running_trial_without_a_worker_is_failed(tmp_path, monkeypatch) -> None:
    """A worker killed between ask() and recording its host/pid leaves an orphan."""
    from tuner.tune import study as study_module

    journal = tmp_path / "o.optuna-journal"
    tune(TuneInputs(evaluator=FakeEvaluator()), SearchOptions(n_trials=3, seed=0),
         output=StudyOutput(storage=str(journal), study_name="o"))
    orphan = _study(journal, "o").ask()  # RUNNING, no host/pid recorded
    result = tune(TuneInputs(evaluator=FakeEvaluator()), SearchOptions(n_trials=4, seed=0),
                  output=StudyOutput(storage=str(journal), study_name="o"))
    assert not any("no worker recorded" in n for n in result.notes)  # too young to judge
    monkeypatch.setattr(study_module, "ORPHAN_AFTER_S", 0.0)
    result = tune(TuneInputs(evaluator=FakeEvaluator()), SearchOptions(n_trials=5, seed=0),
                  output=StudyOutput(storage=str(journal), study_name="o"))
    assert any(f"trial {orphan.number} has been running" in n for n in result.notes)
    assert not _study(journal, "o").get_trials(states=(TrialState.RUNNING,))


def test_warm_start_enqueues_the_profile_and_its_pareto_set(tmp_path: pathlib.Path) -> None:
    base = SchedulerSettings.vllm_defaults(288)
    prof = Profile(name="prev", scheduler=base.replace(cache_aware_admission_window=64,
                                                      cache_aware_admission_threshold=0.7),
                   target=ProfileTarget(hardware="mi355x", model="llama-3.1-70b", tp=8, num_gpus=8),
                   pareto=({"settings": base.replace(cache_aware_admission_window=4).to_dict()},
                           {"settings": base.replace(cache_aware_admission_window=300 // 10 + 2,
                                                     ).to_dict()}))
    path = save_profile(prof, tmp_path / "prev.yaml")
    journal = tmp_path / "w.optuna-journal"
    result = tune(TuneInputs(evaluator=FakeEvaluator()),
                  SearchOptions(n_trials=8, warm_start=warm_start_of(load_profile(path))),
                  output=StudyOutput(storage=str(journal), study_name="w"))
    trials = _study(journal, "w").trials
    assert trials[0].user_attrs["role"] == "baseline"
    assert trials[1].user_attrs["role"] == "warm-start-profile"
    assert trials[1].params == {"cache_aware_admission_window": 64,
                                "cache_aware_admission_threshold": 0.7}
    assert trials[2].user_attrs["role"] == "warm-start-pareto"
    assert trials[2].params["cache_aware_admission_window"] == 4
    # window 32 is a choice; 300 // 10 + 2 = 32 -> enqueued as well
    assert trials[3].params["cache_aware_admission_window"] == 32
    assert any("enqueued 3 point(s)" in n for n in result.notes)


def test_two_workers_share_a_journal(tmp_path: pathlib.Path) -> None:
    journal = tmp_path / "p.optuna-journal"
    result = tune(TuneInputs(evaluator=FakeEvaluator(delay_s=0.1)), SearchOptions(n_trials=16),
                  output=StudyOutput(workers=2, storage=str(journal), study_name="p"))
    trials = _study(journal, "p").get_trials(states=(TrialState.COMPLETE,))
    assert len(trials) == 16  # a trial a worker begins past the budget is not run
    assert len({t.user_attrs["pid"] for t in trials}) == 2
    assert result.recommended is not None


def test_join_checks_the_trace_and_runs_up_to_the_budget(tmp_path: pathlib.Path) -> None:
    journal = str(tmp_path / "j.optuna-journal")
    tune(TuneInputs(evaluator=FakeEvaluator()), SearchOptions(n_trials=4),
         output=StudyOutput(storage=journal, study_name="j"))
    with pytest.raises(ConfigError, match="trace fingerprint"):
        join("j", journal, evaluator=FakeEvaluator(fingerprint="another-trace"))
    with pytest.raises(StudyNotFound, match="no study 'nope'.*existing: j"):
        join("nope", journal)
    study = optuna.load_study(study_name="j", storage=open_storage(journal))
    study.set_user_attr("tuner", {**study.user_attrs["tuner"], "n_trials": 9})
    out = join("j", journal, evaluator=FakeEvaluator())
    assert out["trials_run"] == 5 and out["study_trials"] == 9
    assert join("j", journal, evaluator=FakeEvaluator())["trials_run"] == 0


def test_join_refuses_studies_it_cannot_rebuild(tmp_path: pathlib.Path) -> None:
    journal = str(tmp_path / "f.optuna-journal")
    tune(TuneInputs(evaluator=FakeEvaluator()), SearchOptions(n_trials=2),
         output=StudyOutput(storage=journal, study_name="f"))
    with pytest.raises(ConfigError, match="cannot be rebuilt by a joiner"):
        join("f", journal)


def test_redact_url() -> None:
    assert redact_url("postgresql://tuner:s3cret@db:5432/tuner") == "postgresql://tuner:***@db:5432/tuner"
    assert redact_url("postgresql://tuner@db/tuner") == "postgresql://tuner@db/tuner"
    assert redact_url("postgresql://db/t?user=u&password=x&sslmode=require") == \
        "postgresql://db/t?user=u&password=***&sslmode=require"
    assert redact_url(None) is None


def test_host_attr_is_recorded(tmp_path: pathlib.Path) -> None:
    journal = tmp_path / "h.optuna-journal"
    tune(TuneInputs(evaluator=FakeEvaluator()), SearchOptions(n_trials=2),
         output=StudyOutput(storage=str(journal), study_name="h"))
    t = _study(journal, "h").trials[0]
    assert t.user_attrs["host"] == socket.gethostname() and isinstance(t.user_attrs["pid"], int)
