"""The study on the real twin (a small synthetic trace): windows, join by trace, profile."""

from __future__ import annotations

import pathlib

import pytest

from tests.tune.tracegen import write_small_trace
from tuner.errors import ConfigError
from tuner.profile import export_profile, load_profile, profile_of, save_profile
from tuner.perf.target import Target
from tuner.tune import ReplayEvaluator, SearchOptions, StudyOutput, TuneInputs, join, tune

TARGET = Target(hardware="mi355x", model="llama-3.1-70b", tp=8, num_gpu_blocks=1500)


def test_windows_and_evaluation(small_trace: pathlib.Path) -> None:
    ev = ReplayEvaluator(small_trace, target=TARGET, holdout=0.25, stage1_fraction=0.25)
    w = ev.windows
    assert w.t0 < w.t_stage1 < w.t_split < w.t1
    assert w.t_split == pytest.approx(w.t0 + 0.75 * (w.t1 - w.t0))
    stage1 = ev.evaluate(ev.default_settings, "stage1")
    train = ev.evaluate(ev.default_settings, "train")
    held = ev.evaluate(ev.default_settings, "holdout")
    assert 0 < stage1["num_requests"] < train["num_requests"]
    total = len(ev._all)  # type: ignore[arg-type]
    assert train["num_requests"] + held["num_requests"] == total
    warm = ev._requests("holdout")
    assert warm[0].arrival_s >= w.t_split - 0.5 * (w.t1 - w.t_split) and len(warm) < total
    assert "p90_interactivity" in ev.known_metrics


def test_tune_on_the_twin_writes_a_loadable_profile(small_trace: pathlib.Path,
                                                    tmp_path: pathlib.Path) -> None:
    out = tmp_path / "small.yaml"
    result = tune(TuneInputs(small_trace, target=TARGET), SearchOptions(n_trials=6, seed=0),
                  output=StudyOutput(output=out))
    assert result.storage == str(tmp_path / "small.optuna-journal")
    prof = profile_of(result, "small")
    save_profile(prof, out)
    again = load_profile(out)
    assert again.provenance["trace"]["fingerprint"] == ReplayEvaluator(
        small_trace, target=TARGET).fingerprint
    assert again.provenance["study"]["name"] == "small"
    assert again.target.num_gpus == 8 and again.target.block_size == 16
    for window in ("train", "holdout"):
        section = again.predicted[window]
        assert set(section) >= {"window_s", "baseline", "tuned", "delta_pct"}
        assert section["baseline"]["p90_interactivity"] > 0
    tuned, base = again.predicted["train"]["tuned"], again.predicted["train"]["baseline"]
    assert tuned["p90_interactivity"] >= base["p90_interactivity"]
    assert "--max-num-seqs" in export_profile(again, "flags")


def test_join_rebuilds_the_evaluator_and_checks_the_trace(small_trace: pathlib.Path,
                                                          tmp_path: pathlib.Path) -> None:
    journal = str(tmp_path / "j.optuna-journal")
    tune(TuneInputs(small_trace, target=TARGET), SearchOptions(n_trials=3),
         output=StudyOutput(storage=journal, study_name="j"))
    other = write_small_trace(tmp_path / "other.parquet", seed=7)
    with pytest.raises(ConfigError, match="fingerprint"):
        join("j", journal, trace=other)
    import optuna

    from tuner.tune import open_storage

    study = optuna.load_study(study_name="j", storage=open_storage(journal))
    study.set_user_attr("tuner", {**study.user_attrs["tuner"], "n_trials": 5})
    out = join("j", journal)  # trace path from the study's attrs
    assert out == {"study": "j", "trials_run": 2, "study_trials": 5, "n_trials": 5}
