"""Off a terminal (cron, systemd, CI), long commands print plain progress lines to stderr."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.tune.tracegen import write_small_trace  # noqa: E402

TARGET = ["--hardware", "mi355x", "--model", "llama-3.1-70b", "--tp", "8",
          "--num-gpu-blocks", "1500"]


def _tune(tmp_path: pathlib.Path, *extra: str) -> subprocess.CompletedProcess[str]:
    trace = write_small_trace(tmp_path / "small.parquet")
    return subprocess.run([sys.executable, "-c", "from tuner.cli import main; main()", "tune",
                           str(trace), *TARGET, "--trials", "4", "-o", str(tmp_path / "p.yaml"),
                           *extra], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TUNER_SALT": "x"})


def test_tune_without_a_terminal_prints_plain_progress(tmp_path: pathlib.Path) -> None:
    done = _tune(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [ln for ln in done.stderr.splitlines() if "%" in ln]
    assert any(ln.startswith("stage 1") and "trials" in ln for ln in lines), done.stderr
    assert any("100%" in ln for ln in lines)
    assert "\x1b[" not in done.stderr  # plain text, no terminal control codes


def test_json_and_no_progress_stay_quiet(tmp_path: pathlib.Path) -> None:
    for extra in (("--json",), ("--no-progress",)):
        done = _tune(tmp_path, *extra)
        assert done.returncode == 0, done.stderr[-2000:]
        assert not [ln for ln in done.stderr.splitlines() if "% (" in ln], (extra, done.stderr)
