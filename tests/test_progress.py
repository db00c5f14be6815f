"""One progress protocol (tuner/progress.py); the displays live only in the CLI."""

from __future__ import annotations

import io
import pathlib
import re

import pytest

from tuner.progress import Progress, Reporter, check_progress, fraction_callback

ROOT = pathlib.Path(__file__).resolve().parents[1]


class Recorder:
    """A notebook-style sink: records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def stage(self, name: str, total: float, completed: float = 0.0, unit: str = "") -> None:
        self.calls.append(("stage", name, total, completed, unit))

    def update(self, completed: float, detail: str = "") -> None:
        self.calls.append(("update", completed, detail))


def test_protocol_and_refusals() -> None:
    rec = Recorder()
    assert isinstance(rec, Progress) and check_progress(rec) is rec
    assert check_progress(None) is None and check_progress(False) is None
    with pytest.raises(TypeError, match="tuner.progress.Progress"):
        check_progress(True)
    with pytest.raises(TypeError):
        check_progress(lambda f: None)
    cb = fraction_callback(rec, "replay")
    assert cb is not None
    cb(0.5)
    cb(1.7)  # clamped
    assert rec.calls == [("stage", "replay", 1.0, 0.0, ""), ("update", 0.5, ""),
                         ("update", 1.0, "")]
    assert fraction_callback(None, "replay") is None


def test_ingest_reports_bytes(tmp_path: pathlib.Path) -> None:
    from tuner.trace import ingest

    src = ROOT / "traces" / "mooncake_synthetic.jsonl"
    rec = Recorder()
    ingest([str(src)], tmp_path / "m.parquet", progress=rec, salt=b"s" * 16)
    assert rec.calls[0] == ("stage", "ingest", src.stat().st_size, 0.0, "bytes")
    done = [c[1] for c in rec.calls if c[0] == "update"]
    assert done and done == sorted(done) and done[-1] <= src.stat().st_size


def test_replay_reports_fractions(tmp_path: pathlib.Path) -> None:
    from tuner import replay
    from tuner.perf.target import Target
    from tuner.trace import synthesize

    trace = synthesize("chat", duration_s=20, rate=2, seed=1)
    rec = Recorder()
    replay.run(trace, target=Target(hardware="mi355x", model="llama-3.1-8b", tp=1,
                                    num_gpu_blocks=2000), progress=rec)
    assert rec.calls[0][:2] == ("stage", "replay")
    assert rec.calls[-1] == ("update", 1.0, "")


def test_tune_reports_stages_and_best(tmp_path: pathlib.Path) -> None:
    from tests.tune.fake import FakeEvaluator
    from tuner.tune import SearchOptions, StudyOutput, TuneInputs, tune

    rec = Recorder()
    tune(TuneInputs(evaluator=FakeEvaluator()), SearchOptions(n_trials=6, seed=0),
         output=StudyOutput(storage=str(tmp_path / "j.journal"), study_name="p", progress=rec))
    stages = [c[1] for c in rec.calls if c[0] == "stage"]
    assert stages[0].startswith("stage 1") and "stage 2" in stages
    assert all(c[4] == "trials" for c in rec.calls if c[0] == "stage")
    assert any(c[2].startswith("best: ") for c in rec.calls if c[0] == "update")


def test_plain_display_prints_lines() -> None:
    from tuner.cli._progress import ProgressDrawer, progress_display

    out = io.StringIO()
    p = ProgressDrawer(out, rich=False, every_s=1e9)
    p.stage("stage 1", 10, unit="trials")
    for i in range(1, 11):
        p.update(i, "best: x")
    lines = out.getvalue().splitlines()
    assert lines[0] == "stage 1: 0% (0/10 trials)"
    assert lines[-1] == "stage 1: 100% (10/10 trials) best: x" and len(lines) == 11
    with progress_display(None, stream=io.StringIO()) as shown:  # not a terminal: silent
        assert shown is None
    with progress_display(True, stream=out) as shown:  # asked for, not a terminal: lines
        assert isinstance(shown, ProgressDrawer) and not shown.rich


def test_one_drawer_writes_the_same_amount_as_a_bar_and_as_lines() -> None:
    """The bar and the lines are one drawer: the same stage state and amount text."""
    from tuner.cli._progress import ProgressDrawer, amount

    bar = ProgressDrawer(io.StringIO(), rich=True)
    try:
        bar.stage("ingest", 10 * 2**20, unit="bytes")
        bar.update(4 * 2**20)
        assert bar._bar.tasks[-1].fields["amount"] == "4.0/10.0 MiB"
        bar.stage("replay", 1.0)
        bar.update(0.25)
        assert bar._bar.tasks[-1].fields["amount"] == "25%"
    finally:
        bar.close()
    out = io.StringIO()
    lines = ProgressDrawer(out, rich=False)
    lines.stage("ingest", 10 * 2**20, unit="bytes")
    lines.update(4 * 2**20)
    assert out.getvalue().splitlines() == ["ingest: 0% (0.0/10.0 MiB)", "ingest: 40% (4.0/10.0 MiB)"]
    assert amount(3, 8, "trials") == "3/8 trials" and amount(0.5, 1.0, "") == ""


def test_reporter_forwards_or_does_nothing() -> None:
    rec = Recorder()
    with Reporter(rec, unit="trials") as bar:
        bar.stage("stage 1", 8, 2)
        bar.update(3, "best: x")
    assert rec.calls == [("stage", "stage 1", 8, 2, "trials"), ("update", 3, "best: x")]
    Reporter(None).stage("x", 1)  # no sink: nothing to call, nothing raised
    Reporter(None).update(1)


def test_no_display_outside_the_cli() -> None:
    """rich progress bars and terminal checks are the CLI's alone."""
    pattern = re.compile(r"rich\.progress|rich\.live|isatty\(")
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "tuner").rglob("*.py")
                 if "cli" not in p.relative_to(ROOT / "tuner").parts
                 and pattern.search(p.read_text())]
    assert offenders == []
