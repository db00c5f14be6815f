"""``--workers`` is capped by the trial count and the CPUs (issue: ``--workers 500 --trials
2`` forked 500 processes on 2 CPUs and ran about 27 trials while the bar said 2/2)."""

from __future__ import annotations

import json
import pathlib

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.processes import cap_workers, usable_cpus



def test_cap_workers_reasons() -> None:
    assert cap_workers(1, 10) == (1, None)
    n, why = cap_workers(500, 2)
    assert n == min(2, usable_cpus())
    assert why is not None and why.startswith("--workers 500 capped to") and "2 stage-1 trials" in why
    n, why = cap_workers(10_000, 10_000)
    assert n == usable_cpus() and why is not None and f"{usable_cpus()} CPUs" in why


def _tune(trace: pathlib.Path, out: pathlib.Path, workers: int) -> dict:
    res = CliRunner().invoke(cli, ["tune", str(trace), "--model", "llama-3.1-8b", "--trials",
                                   "2", "--workers", str(workers), "-o", str(out), "--json",
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_many_workers_run_no_more_trials_than_one(tmp_path: pathlib.Path,
                                                  mooncake_head_trace: pathlib.Path) -> None:
    one = _tune(mooncake_head_trace, tmp_path / "one.yaml", 1)
    many = _tune(mooncake_head_trace, tmp_path / "many.yaml", 500)
    # Complete and pruned together: the workers sample with their own seeds, so a point
    # stopped early in one run may complete in the other; the budget is the same.
    def ran(out: dict) -> int:
        return out["trials"]["complete"] + out["trials"]["pruned"]

    assert ran(many) == ran(one) == 2 and many["trials"]["failed"] == 0
    assert any(n.startswith("--workers 500 capped to") for n in many["notes"])


def test_a_trial_begun_past_the_budget_is_not_run(tmp_path: pathlib.Path,
                                                  capfd: pytest.CaptureFixture) -> None:
    """Workers check the budget when a trial ends: a worker that begins one while the
    others run the last ones (the one busy with the baseline track, in CI: 3 complete
    trials for ``--trials 2``) must not replay it. Two trials of a 6-trial budget are left
    RUNNING here, as if two other workers ran them; a joiner then finds the budget taken."""
    import optuna

    from tests.tune.fake import FakeEvaluator
    from tuner.tune.storage import open_storage
    from tuner.tune.study import StudyOutput, SearchOptions, TuneInputs, join, tune

    journal = str(tmp_path / "j.optuna-journal")
    tune(TuneInputs(evaluator=FakeEvaluator()), SearchOptions(n_trials=4),
         output=StudyOutput(storage=journal, study_name="j"))
    study = optuna.load_study(study_name="j", storage=open_storage(journal))
    study.set_user_attr("tuner", {**study.user_attrs["tuner"], "n_trials": 6})
    others = [study.ask(), study.ask()]
    fake = FakeEvaluator()
    capfd.readouterr()
    out = join("j", journal, evaluator=fake)
    assert out["trials_run"] == 0 and fake.calls == []
    assert "failed" not in capfd.readouterr().err  # not a failure the user should see
    states = [t.state for t in optuna.load_study(study_name="j",
                                                 storage=open_storage(journal)).get_trials()]
    assert states[-1] == optuna.trial.TrialState.FAIL and len(states) == 7
    for t in others:
        study.tell(t, state=optuna.trial.TrialState.PRUNED)
