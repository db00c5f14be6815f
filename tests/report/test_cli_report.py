"""`tuner report`, `tuner trace report`, `tuner dashboard` through CliRunner."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest
from click.testing import CliRunner

from tuner.cli import cli


def test_report_profile_json(small_study: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["report", str(small_study), "-o", str(out), "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["output"] == str(out) and out.is_file()
    assert data["charts"] == out.read_text().count('<svg xmlns="http://www.w3.org/2000/svg"')
    assert data["charts"] >= 20
    assert data["sections"][:6] == ["Summary", "Pareto front", "Trial history",
                                    "Parameter importance", "Baseline vs tuned", "Time series"]


def test_report_study_by_name(small_study: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "s.html"
    journal = str(small_study.with_suffix(".optuna-journal"))
    res = CliRunner().invoke(cli, ["report", "small", "--storage", journal, "-o", str(out),
                                   "--no-replay", "--no-trace-section"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-1].startswith(f"wrote {out} (")


def test_report_errors(small_study: pathlib.Path, tmp_path: pathlib.Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["report", "small", "-o", str(tmp_path / "x.html")])
    assert res.exit_code == 2
    assert res.output.strip() == ("Error: 'small' is not a profile file; to report a study by "
                                  "name, pass --storage (journal file or database URL)")
    journal = str(small_study.with_suffix(".optuna-journal"))
    res = runner.invoke(cli, ["report", "nope", "--storage", journal, "-o",
                              str(tmp_path / "x.html")])
    assert res.exit_code == 2
    assert res.output.splitlines()[-1] == (f"Error: no study 'nope' in {journal}; "
                                           "existing: small")
    assert not (tmp_path / "x.html").exists()  # nothing half-written


def test_trace_report_cli(small_trace: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "t.html"
    res = CliRunner().invoke(cli, ["trace", "report", str(small_trace), "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["charts"] == 5


@pytest.mark.skipif(importlib.util.find_spec("optuna_dashboard") is not None,
                    reason="optuna-dashboard is installed (the missing-extra message is moot)")
def test_dashboard_without_the_extra(small_study: pathlib.Path) -> None:
    res = CliRunner().invoke(cli, ["dashboard", str(small_study)])
    assert res.exit_code == 2
    assert res.output.strip() == ("Error: optuna-dashboard is not installed; install it with "
                                  "pip install 'vllm-sched-tuner[report]'")
