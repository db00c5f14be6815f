"""The baseline track (tuner.tune.baseline_track): with two workers the baseline's
training-window and held-out replays and the capacity search run in a stage-1 worker,
and the study's baseline, held-out figures and overload report are those of one worker."""

from __future__ import annotations

import os
import pathlib

import pytest

from tuner.perf.target import Target
from tuner.tune import SearchOptions, StudyOutput, TuneInputs, tune

TARGET = Target(hardware="mi355x", model="llama-3.1-70b", tp=8, num_gpu_blocks=1500)


def test_two_workers_run_the_baselines_replays_beside_stage1(
        small_trace: pathlib.Path, tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.tune import baseline_track

    ran = tmp_path / "track-pid"
    run = baseline_track.BaselineTrack.run

    def marked(self: baseline_track.BaselineTrack) -> None:
        ran.write_text(str(os.getpid()))
        run(self)

    monkeypatch.setattr(baseline_track.BaselineTrack, "run", marked)
    results = {}
    for workers in (1, 2):
        results[workers] = tune(
            TuneInputs(small_trace, target=TARGET),
            SearchOptions(n_trials=4, seed=0),
            output=StudyOutput(storage=str(tmp_path / f"w{workers}.optuna-journal"),
                               study_name="s", workers=workers))
        assert ran.exists() == (workers == 2)
    assert int(ran.read_text()) != os.getpid()  # in a forked worker
    one, two = results[1], results[2]
    drop = ("wall_s", "speed_ratio")  # the replay's own timing
    assert {k: v for k, v in two.baseline.metrics.items() if k not in drop} == \
        {k: v for k, v in one.baseline.metrics.items() if k not in drop}
    assert {k: v for k, v in two.baseline.holdout.items() if k not in drop} == \
        {k: v for k, v in one.baseline.holdout.items() if k not in drop}
    assert one.overload is not None  # the small trace's held-out window falls behind
    assert two.overload is not None and two.overload.to_dict() == one.overload.to_dict()
    assert two.overload.probes  # the capacity search ran (in the worker)
    # stage 2 found the baseline stored: it was replayed once, not again after stage 1
    import optuna

    study2 = optuna.load_study(study_name="s.full", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "w2.optuna-journal"))))
    baselines = [t for t in study2.get_trials(deepcopy=False)
                 if t.user_attrs.get("role") == "baseline"]
    assert len(baselines) == 1
