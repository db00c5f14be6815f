"""Parallel studies against a real PostgreSQL server (CI starts one with .ci/postgres.sh).

Locally: ``eval "$(.ci/postgres.sh)"`` then run these tests.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import uuid

import optuna
import pytest
from optuna.trial import TrialState

from tests.envs import missing_env
from tuner.profile import save_profile
from tuner.perf.target import Target
from tuner.profile import profile_of
from tuner.tune import SearchOptions, StudyOutput, TuneInputs, open_storage, tune
from tuner.tune.study_records import StudyRecords

URL = os.environ.get("TUNER_TEST_POSTGRES_URL")
pytestmark = pytest.mark.postgres


@pytest.fixture(autouse=True)
def _needs_postgres() -> None:
    """Skip without a server (fail under TUNER_REQUIRE_ENVS=1, as in CI)."""
    if URL is None:
        missing_env('TUNER_TEST_POSTGRES_URL is unset; run eval "$(.ci/postgres.sh)" first')
TARGET = Target(hardware="mi355x", model="llama-3.1-70b", tp=8, num_gpu_blocks=1500)


@pytest.fixture
def study_name() -> str:
    name = f"test-{uuid.uuid4().hex[:10]}"
    yield name
    storage = open_storage(URL)  # type: ignore[arg-type]
    for n in (name, name + ".full"):
        try:
            optuna.delete_study(study_name=n, storage=storage)
        except KeyError:
            pass


def test_two_workers_on_postgres(small_trace: pathlib.Path, tmp_path: pathlib.Path,
                                 study_name: str) -> None:
    result = tune(TuneInputs(small_trace, target=TARGET), SearchOptions(n_trials=10, seed=3),
                  output=StudyOutput(workers=2, storage=URL, study_name=study_name))
    study = optuna.load_study(study_name=study_name, storage=open_storage(URL))  # type: ignore[arg-type]
    done = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert 10 <= len(done) <= 11
    # both worker processes took part: each ran stage-1 trials or the baseline track (a
    # worker busy with the track's replays on a loaded machine may run no trial at all)
    pids = {t.user_attrs["pid"] for t in done}
    track_pid = StudyRecords.baseline_track_worker(study)[1]
    assert track_pid is not None, "the baseline track ran in a worker"
    assert len(pids | {track_pid}) == 2, "both workers took part"
    assert not study.get_trials(states=(TrialState.RUNNING,))
    assert done[0].user_attrs["role"] == "baseline"
    stage2 = optuna.load_study(study_name=study_name + ".full", storage=open_storage(URL))  # type: ignore[arg-type]
    assert stage2.trials and any(t.user_attrs["role"] == "baseline" for t in stage2.trials)
    path = save_profile(profile_of(result, "pg"), tmp_path / "pg.yaml")
    assert "postgresql://" in path.read_text()


def test_join_from_another_process(small_trace: pathlib.Path, study_name: str) -> None:
    tune(TuneInputs(small_trace, target=TARGET), SearchOptions(n_trials=3),
         output=StudyOutput(storage=URL, study_name=study_name))
    study = optuna.load_study(study_name=study_name, storage=open_storage(URL))  # type: ignore[arg-type]
    study.set_user_attr("tuner", {**study.user_attrs["tuner"], "n_trials": 6})
    proc = subprocess.run([sys.executable, "-c", "from tuner.cli import main; main()",
                           "tune", "--join", study_name,
                           "--storage", URL, "--trials", "10", "--no-progress"],  # type: ignore[list-item]
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(pathlib.Path.cwd())})
    assert proc.returncode == 0, proc.stderr
    assert f"joined {study_name}: ran 3 trial(s); the study has 6 of 6" in proc.stdout


def test_password_in_url_is_redacted(small_trace: pathlib.Path, tmp_path: pathlib.Path,
                                     study_name: str) -> None:
    password = os.environ.get("PGPASSWORD")
    if not password:
        missing_env("PGPASSWORD is unset (the URL from .ci/postgres.sh needs it)")
    with_pw = URL.replace("://tuner@", f"://tuner:{password}@")  # type: ignore[union-attr]
    result = tune(TuneInputs(small_trace, target=TARGET), SearchOptions(n_trials=2),
                  output=StudyOutput(storage=with_pw, study_name=study_name))
    assert result.storage is not None and password not in result.storage
    assert "tuner:***@" in result.storage
    text = save_profile(profile_of(result, "r"), tmp_path / "r.yaml").read_text()
    assert password not in text
