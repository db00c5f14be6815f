"""One progress protocol (tuner/progress.py); the displays live only in the CLI."""

from __future__ import annotations

import io
import pathlib
import re

import pytest

from tuner.progress import Progress, check_progress, fraction_callback

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
    from tuner.cli._progress import PlainProgress, progress_display

    out = io.StringIO()
    p = PlainProgress(out, every_s=1e9)
    p.stage("stage 1", 10, unit="trials")
    for i in range(1, 11):
        p.update(i, "best: x")
    lines = out.getvalue().splitlines()
    assert lines[0] == "stage 1: 0% (0/10 trials)"
    assert lines[-1] == "stage 1: 100% (10/10 trials) best: x" and len(lines) == 11
    with progress_display(None, stream=io.StringIO()) as shown:  # not a terminal: silent
        assert shown is None
    with progress_display(True, stream=out) as shown:  # asked for, not a terminal: lines
        assert isinstance(shown, PlainProgress)


def test_no_display_outside_the_cli() -> None:
    """rich progress bars and terminal checks are the CLI's alone."""
    pattern = re.compile(r"rich\.progress|rich\.live|isatty\(")
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "tuner").rglob("*.py")
                 if "cli" not in p.relative_to(ROOT / "tuner").parts
                 and pattern.search(p.read_text())]
    assert offenders == []
