"""The report in a real headless Chromium: no console errors, charts render, screenshot.

Chromium comes from Debian (``.ci/chromium.sh``: ``apt-get install -y chromium``); the
test skips with one line when no binary is found. Chromium runs with the flags this
machine needs (no sandbox as root, no GPU, no background networking: the network is
closed) and a fresh profile directory per run.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest

from tests.envs import missing_env
from tuner.report import study_report, write_page

CHROMIUM = next((p for p in (os.environ.get("CHROMIUM"), shutil.which("chromium"),
                             shutil.which("chromium-browser"), shutil.which("google-chrome"))
                 if p), None)


@pytest.fixture(autouse=True)
def _needs_chromium() -> None:
    """Skip without a binary (fail under TUNER_REQUIRE_ENVS=1, as in CI)."""
    if CHROMIUM is None:
        missing_env("no chromium binary (run .ci/chromium.sh)")


FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--enable-logging=stderr", "--v=0"]
#: Chromium's log line for a page's console message or uncaught error.
CONSOLE = re.compile(r":(?:INFO|WARNING|ERROR):CONSOLE[^\]]*\] (.*)")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def chromium(page: pathlib.Path, tmp: pathlib.Path, *extra: str) -> tuple[str, list[str]]:
    """Run Chromium on ``page``; returns (stdout, console messages)."""
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra,
                           page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, [m.group(1) for m in CONSOLE.finditer(proc.stderr)]


def test_console_capture_catches_errors(tmp_path: pathlib.Path) -> None:
    """The check below can fail: a page with a script error is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><svg><circle r='1'/></svg>"
                   "<script>console.error('boom'); notDefined();</script></body></html>")
    _, console = chromium(bad, tmp_path, "--dump-dom")
    assert any("boom" in m for m in console)
    assert any("Uncaught ReferenceError" in m for m in console)


def test_report_renders_in_chromium(small_study: pathlib.Path, tmp_path: pathlib.Path) -> None:
    page = write_page(study_report(profile=small_study), tmp_path / "report.html")
    html = page.read_text()
    dom, console = chromium(page, tmp_path, "--dump-dom")
    # (a) no console errors (the page has no script; any message is a problem)
    assert console == []
    # (b) the charts are in the rendered DOM, as many as the file holds
    n_svg = html.count('<svg xmlns="http://www.w3.org/2000/svg"')
    assert n_svg >= 20
    assert dom.count("<svg") == n_svg
    assert dom.count("<figure>") == n_svg
    assert dom.count("<circle") >= 10  # scatter markers
    assert dom.count('class="line"') >= 10  # CDF and time-series lines
    assert dom.count('class="bar"') >= 4  # hit-rate, preemption, importance bars
    for h in ("Pareto front on the training window", "TTFT distribution (train window)",
              "KV cache usage (training window)"):
        assert h in dom
    # (c) a screenshot
    shot = tmp_path / "report.png"
    _, console = chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1280,2000")
    assert console == []
    data = shot.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 20_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1280, 2000)
    keep = os.environ.get("TUNER_REPORT_SCREENSHOT")
    if keep:  # for a person to look at: TUNER_REPORT_SCREENSHOT=/tmp/r.png pytest ...
        shutil.copy(shot, keep)
