"""StudyRecords owns every key tuner keeps in an Optuna study (tuner/tune/study_records.py)."""

from __future__ import annotations

import pathlib
import re

import optuna
from optuna.trial import TrialState

from tuner.tune.select import Point
from tuner.tune.study_records import StudyRecords, settings_key

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tuner"


def test_stage2_point_and_holdout_round_trip() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.InMemoryStorage()
    st2 = optuna.create_study(storage=storage, study_name=StudyRecords.stage2_name("s"),
                              directions=["maximize"])
    p = Point(number=7, params={"w": 16}, settings={"max_num_seqs": 64},
              metrics={"output_throughput_per_gpu": 3.5}, is_baseline=True)
    st2.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[3.5],
                                            constraints={"ttft<=1": -0.5},
                                            user_attrs=StudyRecords.stage2_attrs(p)))
    StudyRecords.write_holdout(st2, p.settings, {"output_throughput_per_gpu": 3.1})
    again = optuna.load_study(study_name="s.full", storage=storage)
    held = StudyRecords.holdouts(again)
    assert held == {settings_key(p.settings): {"output_throughput_per_gpu": 3.1}}
    (trial,) = again.get_trials()
    back = StudyRecords.stage2_point(trial, held)
    assert (back.number, back.params, back.settings, back.metrics) == (7, p.params, p.settings,
                                                                        p.metrics)
    assert back.is_baseline and back.feasible
    assert back.holdout == {"output_throughput_per_gpu": 3.1}
    assert StudyRecords.is_stage2_name("s.full") and not StudyRecords.is_stage2_name("s")
    # the stored-result lookup stage 2 and the baseline track share: COMPLETE trials only
    again.add_trial(optuna.trial.create_trial(
        state=TrialState.FAIL, user_attrs=StudyRecords.stage2_attrs(
            Point(number=8, params={}, settings={"max_num_seqs": 32}, metrics={}))))
    assert StudyRecords.stage2_trials(again) == {settings_key(p.settings): trial}


def test_fail_trial_uses_public_api_on_another_process_trial() -> None:
    storage = optuna.storages.InMemoryStorage()
    mine = optuna.create_study(storage=storage, study_name="x")
    running = mine.ask()
    StudyRecords.mark_worker(running, "host-a", 12345)
    theirs = optuna.load_study(study_name="x", storage=storage)  # a second process's view
    (frozen,) = theirs.get_trials(states=(TrialState.RUNNING,))
    assert StudyRecords.worker(frozen) == ("host-a", 12345)
    StudyRecords.fail_trial(theirs, frozen)
    StudyRecords.fail_trial(theirs, frozen)  # already finished: a no-op, not an error
    assert [t.state for t in mine.get_trials()] == [TrialState.FAIL]


def test_no_key_literals_or_private_optuna_api_outside_study_records() -> None:
    """Study attrs are written and read only through StudyRecords; no ``study._storage``."""
    # (``user_attrs=StudyRecords....`` hands a StudyRecords-built mapping to Optuna)
    attr_access = re.compile(r"user_attrs\b(?!=StudyRecords)|set_user_attr\(|system_attrs\b"
                             r"|set_system_attr\(")
    private = re.compile(r"\._storage\b|\._trial_id\b|\._study_id\b")
    offenders = []
    for path in ROOT.rglob("*.py"):
        text = path.read_text()
        if path.name != "study_records.py" and attr_access.search(text):
            offenders.append(f"{path.relative_to(ROOT.parent)}: reads/writes study attrs")
        if private.search(text):
            offenders.append(f"{path.relative_to(ROOT.parent)}: private Optuna API")
    assert offenders == []
