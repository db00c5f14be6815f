"""Reports find the study's trace from any folder, say what is missing, and replay exactly
what the tuner replayed (the compact, lazily re-blocked trace of tuner.report.study_trace)."""

from __future__ import annotations

import os
import pathlib
import re
import shutil

import sys

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from tests.report.conftest import TARGET, make_trace  # noqa: E402
from tuner.cli import cli  # noqa: E402
from tuner.profile import save_profile  # noqa: E402
from tuner.sim.settings import SchedulerSettings  # noqa: E402


@pytest.fixture(scope="module")
def relative_study(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A study tuned from its own folder on ``traces/t.parquet`` (a relative path)."""
    from tuner.profile import profile_of
    from tuner.tune import SearchOptions, StudyOutput, TuneInputs, tune

    root = tmp_path_factory.mktemp("relative")
    (root / "traces").mkdir()
    make_trace(root / "traces" / "t.parquet")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        result = tune(TuneInputs("traces/t.parquet", target=TARGET),
                      SearchOptions(n_trials=6, seed=0, n_survivors=3),
                      output=StudyOutput(output="profiles/rel.yaml"))
        save_profile(profile_of(result, "rel"), "profiles/rel.yaml")
    finally:
        os.chdir(cwd)
    return root / "profiles" / "rel.yaml"


def _report(profile: pathlib.Path, out: pathlib.Path, cwd: pathlib.Path) -> tuple[int, str]:
    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(cli, ["report", str(profile), "-o", str(out)])
    finally:
        os.chdir(old)
    return result.exit_code, result.output


def test_report_from_another_folder_draws_every_chart(relative_study: pathlib.Path,
                                                      tmp_path: pathlib.Path) -> None:
    root = relative_study.parents[1]
    code, here = _report(relative_study, tmp_path / "a.html", root)
    assert code == 0, here
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, there = _report(relative_study, tmp_path / "b.html", elsewhere)
    assert code == 0, there
    charts = [int(re.search(r"\((\d+) charts", o).group(1)) for o in (here, there)]  # type: ignore[union-attr]
    assert charts[0] == charts[1] >= 14, (here, there)
    assert "Warning" not in there
    # Moved repository: the absolute path is gone, the relative one resolves from the
    # profile's folder upwards.
    moved = tmp_path / "moved"
    shutil.copytree(root, moved)
    shutil.rmtree(root / "traces")
    try:
        code, out = _report(moved / "profiles" / "rel.yaml", tmp_path / "c.html", elsewhere)
        assert code == 0 and f"({charts[0]} charts" in out and "Warning" not in out, out
    finally:
        shutil.copytree(moved / "traces", root / "traces")


def test_missing_trace_is_a_warning_on_the_terminal(relative_study: pathlib.Path,
                                                    tmp_path: pathlib.Path) -> None:
    copy = tmp_path / "alone" / "rel.yaml"
    copy.parent.mkdir()
    shutil.copy(relative_study, copy)
    shutil.copy(relative_study.with_suffix(".optuna-journal"), copy.with_suffix(".optuna-journal"))
    root = relative_study.parents[1]
    (root / "traces" / "t.parquet").rename(root / "traces" / "gone.parquet")
    try:
        code, out = _report(copy, tmp_path / "d.html", tmp_path)
    finally:
        (root / "traces" / "gone.parquet").rename(root / "traces" / "t.parquet")
    assert code == 0
    assert "Warning: the study's trace traces/t.parquet is not available here" in out
    assert "trace charts are missing (pass --trace)" in out


def test_report_replays_equal_the_tuners(relative_study: pathlib.Path) -> None:
    """The report's replays (compact trace, per-request KV ids, a process pool) give the
    same summaries as the tuner's own evaluator on the same windows."""
    from tuner.report.replays import replay_windows, trace_for_spec
    from tuner.report.study_data import load_report_data
    from tuner.tune import ReplayEvaluator

    data = load_report_data(profile=relative_study)
    spec = data.evaluator_spec
    trace, why = trace_for_spec(spec, near=[relative_study.parents[1]])
    assert trace is not None, why
    assert trace.requests.block_size == 16 and trace.compact.hash_block_size == 16
    chosen = SchedulerSettings.from_dict(data.chosen.settings)
    evaluator = ReplayEvaluator.from_spec(spec, trace=str(relative_study.parents[1] / "traces" /
                                                          "t.parquet"))
    for workers in (1, 2):
        rows = replay_windows(spec, trace, {"tuned": chosen}, workers=workers)
        for row in rows:
            want = evaluator.evaluate(chosen, row.window)  # type: ignore[arg-type]
            got = {k: v for k, v in row.summary.items() if k in want}
            for key in ("p90_interactivity", "output_throughput_per_gpu", "ttft_p90_s",
                        "prefix_cache_hit_rate", "num_finished", "preemptions"):
                assert got[key] == pytest.approx(want[key], rel=1e-12), (workers, row.window, key)


def test_a_process_with_other_threads_replays_in_process() -> None:
    """The report forks its replay pool only from a one-thread process (a fork copies
    locks other threads hold, and the child can wait on one forever)."""
    import threading

    from tuner.report.replays import fork_is_safe

    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not fork_is_safe()
    finally:
        stop.set()
        other.join()
    assert fork_is_safe() == (threading.active_count() == 1)
