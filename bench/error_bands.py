#!/usr/bin/env python3
"""Derive the twin's error bands from leave-one-series-out residuals (prints coverage).

Replays every usable row of tuner/perf/data/benchmarks/published-train.csv, predicts each
series with a fit that never saw it (the same LOSO as bench/calibration_fit.py), turns
each held-out row into one ``measured / predicted`` sample per metric (TTFT, TPOT/ITL,
throughput) tagged with its GPU family and regime (below/above the knee, see
tuner/perf/fit/bands.py), derives the bands per cell and writes
tuner/perf/data/error-bands.json, which every replay summary, the tune table and the
profile read. Deterministic: the same CSV gives the same file byte for byte.

Prints the bands per cell, their in-sample coverage (nominal by construction) and the
held-out coverage: each series judged by bands derived without it (target >= 80 %).

Usage:  .venv/bin/python bench/error_bands.py [--csv CSV] [--out JSON] [--check]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.perf.fit.bands import (  # noqa: E402
    BANDS_PATH, FIGURE_METRIC, METRICS, Sample, band_document, coverage, derive_cells,
    family_of, held_out_coverage, knee_batch, regime_of)
from tuner.perf.fit.benchmark_rows import PUBLISHED_CSV, RecordedRun  # noqa: E402
from tuner.perf.fit.to_benchmarks import Prediction, fit_benchmarks  # noqa: E402


def row_regime(run: RecordedRun) -> tuple[str, int, float]:
    """(regime, knee batch, mean running batch) of a recorded benchmark run."""
    npr, ndr = run.arrays[0], run.arrays[1]
    running = float((npr + ndr).mean()) if len(npr) else 0.0
    context = float((run.input_len + run.output_len / 2).mean())
    knee = knee_batch(run.resolved.step_time, context)
    if run.row.kind == "offline":
        queue = math.inf  # every prompt queued at once
    elif run.row.kind == "closed":
        queue = max(0.0, run.row.concurrency - running)  # KV-limited: the rest wait
    else:
        queue = max(0.0, run.row.concurrency - running)
    return regime_of(running, queue, knee), knee, running


def samples_from(runs: list[RecordedRun], loso: list[Prediction]) -> list[Sample]:
    """One sample per held-out (row, metric): the geometric mean of its figures' ratios."""
    by_row: dict[str, list[Prediction]] = {}
    for p in loso:
        by_row.setdefault(p.row.id, []).append(p)
    out: list[Sample] = []
    for run in runs:
        preds = by_row.get(run.row.id, [])
        regime, _, _ = row_regime(run)
        family = family_of(run.resolved.hardware.vendor)
        for metric in METRICS:
            logs = [sign * math.log(p.published / p.predicted) for p in preds
                    for m, sign in [FIGURE_METRIC[p.figure]] if m == metric]
            if logs:
                # rounded as the file stores it, so the file's cells follow from its samples
                out.append(Sample(run.row.id, run.row.series, metric, family, regime,
                                  round(math.exp(sum(logs) / len(logs)), 6)))
    return out


def report(samples: list[Sample], cells: dict[str, Any]) -> list[str]:
    lines = ["| cell | band (measured / predicted) | samples | derived from |",
             "|---|---|---:|---|"]
    for key, b in sorted(cells.items()):
        lines.append(f"| {key} | x{b.low:.2f} - x{b.high:.2f} | {b.rows} | {b.cell} |")
    lines.append("")
    lines.append("| metric | held-out rows | in-sample coverage | held-out coverage |")
    lines.append("|---|---:|---:|---:|")
    for metric in (*METRICS, None):
        sel = [s for s in samples if metric is None or s.metric == metric]
        h, t = coverage(sel, cells)
        ho, to = held_out_coverage(samples) if metric is None else _held_out_for(samples, metric)
        lines.append(f"| {metric or 'all'} | {t} | {100 * h / t:.0f}% ({h}/{t}) | "
                     + (f"{100 * ho / to:.0f}% ({ho}/{to}) |" if to else "- |"))
    return lines


def _held_out_for(samples: list[Sample], metric: str) -> tuple[int, int]:
    hit = total = 0
    for series in sorted({s.series for s in samples}):
        rest = [s for s in samples if s.series != series]
        mine = [s for s in samples if s.series == series and s.metric == metric]
        h, t = coverage(mine, derive_cells(rest))
        hit, total = hit + h, total + t
    return hit, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(PUBLISHED_CSV))
    ap.add_argument("--out", default=str(BANDS_PATH), help="where to write the bands JSON")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if the file on disk differs from a fresh one")
    args = ap.parse_args()
    t0 = time.perf_counter()
    fit = fit_benchmarks(args.csv, loso=True)
    samples = samples_from(fit.runs, fit.loso or [])
    cells = derive_cells(samples)
    missing = [f"{m}/{f}/{r}" for m in METRICS for f in ("amd", "nvidia")
               for r in ("below", "above") if f"{m}/{f}/{r}" not in cells]
    if missing:
        sys.exit(f"{args.csv}: no held-out sample for {missing}")
    h, t = coverage(samples, cells)
    ho, to = held_out_coverage(samples)
    doc = band_document(samples, cells, {
        "source": Path(args.csv).name, "command": "python bench/error_bands.py",
        "coverage": {"in_sample": f"{h}/{t}", "held_out_series": f"{ho}/{to}"}})
    text = json.dumps(doc, indent=1, sort_keys=False) + "\n"
    print("\n".join(report(samples, cells)))
    print(f"\n{len(samples)} held-out samples from {len(fit.runs)} rows; coverage in sample "
          f"{100 * h / t:.0f}%, held out by series {100 * ho / to:.0f}% (target >= 80%); "
          f"{time.perf_counter() - t0:.0f} s")
    out = Path(args.out)
    if args.check:
        same = out.is_file() and out.read_text() == text
        print(f"{out.name}: {'up to date' if same else 'DIFFERS from a fresh derivation'}")
        sys.exit(0 if same else 1)
    out.write_text(text)
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
