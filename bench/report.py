#!/usr/bin/env python3
"""Wall time and peak RSS of ``tuner report`` on a profile of the bundled agentic hour.

    .venv/bin/python bench/report.py                      # tunes the README's profile first
    .venv/bin/python bench/report.py --profile /tmp/agentic-mi355x.yaml
    .venv/bin/python bench/report.py --profile P --from-dir /   # report from another folder

Without ``--profile`` it first runs the README's main ``tuner tune`` command (12 trials,
3 survivors, stage-1 fraction 0.1: about 2 minutes on 2 cores) in a temporary folder, so
the profile and its study journal are the ones a new user gets. The report then runs in a
child process (``--from-dir``: its working directory, default the profile's folder), and
the child's peak RSS comes from ``getrusage(RUSAGE_CHILDREN)``. Targets (issue 17 item 14):
under 30 s and under 1 GB, with all 20 charts drawn. Not a test: it prints numbers.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TUNER = [sys.executable, "-c", "from tuner.cli import main; main()"]
README_TUNE = ["tune", str(ROOT / "traces" / "agentic_1h.parquet"), "--hardware", "mi355x",
               "--model", "llama-3.1-70b", "--tp", "8", "--space", "scheduler", "--trials", "12",
               "--survivors", "3", "--stage1-fraction", "0.1", "--no-progress"]
TARGET_S, TARGET_MB = 30.0, 1024.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", type=Path, default=None)
    ap.add_argument("--from-dir", type=Path, default=None,
                    help="working directory of the report (default: the profile's folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tuner-bench-report-") as tmp:
        profile = args.profile
        if profile is None:
            profile = Path(tmp) / "agentic-mi355x.yaml"
            t0 = time.perf_counter()
            subprocess.run([*TUNER, *README_TUNE, "-o", str(profile)], check=True, cwd=ROOT,
                           stdout=subprocess.DEVNULL)
            print(f"tuned the README's profile in {time.perf_counter() - t0:.0f} s -> {profile}")
        profile = profile.resolve()
        out = Path(tmp) / "report.html"
        cwd = args.from_dir or profile.parent
        # A fresh wrapper process runs the report, so the tune child's RSS is not counted.
        wrapper = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
                   "rc = subprocess.run(sys.argv[1:]).returncode; "
                   "print(f'@@ {time.perf_counter() - t} '"
                   "f'{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}', "
                   "file=sys.stderr); sys.exit(rc)")
        done = subprocess.run([sys.executable, "-c", wrapper, *TUNER, "report", str(profile),
                               "-o", str(out)], cwd=cwd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            return done.returncode
        wall_s, peak_kb = done.stderr.rsplit("@@ ", 1)[1].split()
        wall, peak_mb = float(wall_s), int(peak_kb) / 1024
        charts = int(m.group(1)) if (m := re.search(r"\((\d+) charts", done.stdout)) else -1
        warnings = [ln for ln in done.stderr.splitlines() if ln.startswith("Warning:")]
        print(f"tuner report {profile.name} (from {cwd}): {wall:.1f} s wall, peak RSS "
              f"{peak_mb:,.0f} MB, {charts} charts; targets {TARGET_S:.0f} s, "
              f"{TARGET_MB:,.0f} MB; cpus {os.cpu_count()}, load {os.getloadavg()[0]:.1f}")
        for w in warnings:
            print(f"  {w}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
