"""Honest exit codes: Ctrl-C is 130 with a resume hint, dead servers and typos fail."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import yaml
from click.testing import CliRunner

from tuner.cli import cli

REPO = pathlib.Path(__file__).resolve().parents[1]
AGENTIC = REPO / "traces" / "agentic_1h.parquet"
PROFILE = REPO / "profiles" / "agentic-mi355x.yaml"
TARGET = ["--hardware", "mi355x", "--model", "llama-3.1-70b", "--tp", "8"]


def test_ctrl_c_in_tune_exits_130_and_says_how_to_resume(tmp_path: pathlib.Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import tuner.tune

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tuner.tune, "tune", interrupted)
    result = CliRunner().invoke(cli, ["tune", str(AGENTIC), *TARGET, "-o",
                                      str(tmp_path / "p.yaml")])
    assert result.exit_code == 130, result.output
    assert "run the same command again to resume" in result.output
    assert "Aborted!" not in result.output


@pytest.mark.slow
def test_sigint_to_a_running_tune_exits_130(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "TUNER_SALT": "x"}
    proc = subprocess.Popen([sys.executable, "-c", "from tuner.cli import main; main()",
                             "tune", str(AGENTIC), *TARGET,
                             "--trials", "400", "--no-progress", "-o", str(tmp_path / "p.yaml")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=REPO)
    # interrupt the study itself, not the interpreter's start-up: wait for its journal
    # (a fixed sleep raced the imports and the trace's loading on a loaded machine)
    journal, end = tmp_path / "p.optuna-journal", time.monotonic() + 180
    while not journal.exists() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.2)
    assert journal.exists(), "the tune did not start its study"
    time.sleep(1.0)  # a trial or two under way
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Interrupted; finished trials are kept in the study" in err
    assert "Traceback" not in err


def test_validate_with_no_server_fails_fast() -> None:
    t0 = time.perf_counter()
    result = CliRunner().invoke(cli, ["validate", str(PROFILE), str(AGENTIC), *TARGET,
                                      "--endpoint", "http://127.0.0.1:9"])
    assert result.exit_code != 0
    assert "does not answer" in result.output and "use --launch" in result.output
    assert time.perf_counter() - t0 < 15, "it replayed on the twin before trying the server"


def test_profile_history_of_a_typo_fails(tmp_path: pathlib.Path) -> None:
    (tmp_path / "prod").mkdir()
    result = CliRunner().invoke(cli, ["profile", "history", "prdo", "--profiles-dir",
                                      str(tmp_path)])
    assert result.exit_code == 2
    assert "no profile history named 'prdo' (found: prod)" in result.output


def test_retune_with_globs_matching_nothing_is_a_config_error(tmp_path: pathlib.Path) -> None:
    from tests.jobs.conftest import BASE_CONFIG

    cfg = {**BASE_CONFIG, "sources": [{"glob": "logz/*.jsonl", "format": "mooncake"}]}
    path = tmp_path / "retune.yaml"
    path.write_text(yaml.safe_dump(cfg))
    result = CliRunner().invoke(cli, ["retune", "--config", str(path)],
                                env={"TUNER_SALT": "x"})
    assert result.exit_code == 2, result.output  # EXIT_CONFIG, not 3 (kept)
    assert "sources: no file matches" in result.output and "logz/*.jsonl" in result.output


def test_rerunning_tune_says_it_resumes(tmp_path: pathlib.Path) -> None:
    sys.path.insert(0, str(REPO))
    from tests.tune.fake import FakeEvaluator
    from tuner.tune import SearchOptions, StudyOutput, TuneInputs, tune

    journal = str(tmp_path / "s.optuna-journal")
    first = tune(TuneInputs(evaluator=FakeEvaluator()), SearchOptions(n_trials=10, seed=1),
                 output=StudyOutput(storage=journal, study_name="s"))
    assert not any("resumed study" in n for n in first.notes)
    second = tune(TuneInputs(evaluator=FakeEvaluator()), SearchOptions(n_trials=12, seed=1),
                  output=StudyOutput(storage=journal, study_name="s"))
    assert any(n.startswith("resumed study 's'") and "were already finished" in n
               for n in second.notes), second.notes
