#!/usr/bin/env python3
"""How well the step-time model predicts published serving results (not a test: prints).

Replays every usable row of tuner/perf/data/benchmarks/published-train.csv through the
twin (tuner.perf.fit.benchmark_rows), fits the per-GPU coefficients (tuner.perf.fit.to_benchmarks,
the same code as `tuner calibrate --from-benchmarks`) and prints, per row and figure:
published, predicted in sample, and predicted by a fit that never saw the row's series
(leave-one-series-out). Then the median absolute errors (targets: in sample <= 10 %,
leave-one-series-out <= 15 %, TTFT figures <= 20 % leave-one-series-out), per series, at
the priors alone; the error bands' coverage of the held-out rows (bench/error_bands.py's
samples and bands; target >= 80 %); for offline rows the time per request the model leaves
unexplained, by format (a miss that is the same in every format is not in the GEMMs); and
whether the fit reproduces the shipped presets (tuner/perf/presets/fitted/published.yaml).

Usage:  .venv/bin/python bench/calibration_fit.py [--csv CSV] [--no-loso] [--markdown OUT]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tuner.perf.fit.benchmark_rows import PUBLISHED_CSV  # noqa: E402
from tuner.perf.fit.to_benchmarks import fit_benchmarks, median_abs_error, table  # noqa: E402
from tuner.perf.fit.published import load_fitted  # noqa: E402

#: Figure -> the metric it reports (the error bands' grouping, tuner/perf/fit/bands.py).
METRIC_OF = {"ttft_med": "TTFT", "ttft_mean": "TTFT", "tpot_med": "TPOT/ITL",
             "tpot_mean": "TPOT/ITL", "intvty": "TPOT/ITL", "e2el_mean_s": "TPOT/ITL",
             "tok_s_gpu": "throughput", "out_tok_s": "throughput", "total_tok_s": "throughput"}


def _reproduces(doc: dict, shipped: dict) -> tuple[bool, float]:
    """Largest relative difference between fitted and shipped coefficients."""
    worst = 0.0

    def walk(a: object, b: object) -> None:
        nonlocal worst
        if isinstance(a, dict) and isinstance(b, dict):
            for k in set(a) | set(b):
                walk(a.get(k), b.get(k))
        elif isinstance(a, float) or isinstance(b, float):
            if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
                worst = math.inf
            else:
                worst = max(worst, abs(a - b) / max(abs(b), 1e-30))

    for gpu, entry in doc["hardware"].items():
        walk(entry["coefficients"], (shipped.get("hardware", {}).get(gpu) or {}).get("coefficients"))
    return worst < 1e-3, worst


def ttft_parts(fit) -> str:  # type: ignore[no-untyped-def]
    """The TTFT path of each row with a TTFT figure, part by part, under the fitted clock:
    the engine alone with its recorded steps priced at CPU + GPU, priced in the row's own
    mode (async: ``max(cpu, gpu)``; the recording already has async's later admission),
    and with the API server in front (intake, queue, first token out; the server's
    utilisation), against the published median."""
    from tuner.perf.api_server import server_load
    from tuner.perf.fit.benchmark_rows import API_SERVER
    from tuner.perf.fit.to_benchmarks import _model

    lines = ["TTFT path (median ms): engine, cpu + gpu | engine, row's mode | + API server "
             "(its utilisation) | published"]
    for run in fit.runs:
        if "ttft_med" not in run.row.figures:
            continue
        model = _model(run, fit.fitted[run.row.hardware])
        sync = run.figures(model, api=None, async_scheduling=False)["ttft_med"]
        engine = run.figures(model, api=None)
        mode = engine["ttft_med"]
        full = run.figures(model)["ttft_med"]
        load = server_load(API_SERVER, run.input_len, run.output_len,
                           float(run.output_len.sum()) / engine["out_tok_s"], len(run.arrays[0]))
        lines.append(f"  {run.row.id:28s} {sync:7.1f} | {mode:7.1f} "
                     f"({'async' if run.row.async_scheduling else 'sync'}) | {full:7.1f} "
                     f"({100 * load.utilisation:.0f}%) | "
                     f"{run.row.figures['ttft_med']:7.1f}")
    return "\n".join(lines)


def band_coverage(fit) -> str:  # type: ignore[no-untyped-def]
    """Coverage of the leave-one-series-out rows by the error bands, as bench/error_bands.py
    derives them (one sample per held-out row and metric): in sample, and each series
    judged by bands derived without it (the done-when figure, target >= 80 %)."""
    from error_bands import samples_from  # bench/error_bands.py

    from tuner.perf.fit.bands import METRICS, coverage, derive_cells, held_out_coverage

    samples = samples_from(fit.runs, fit.loso or [])
    cells = derive_cells(samples)
    h, t = coverage(samples, cells)
    ho, to = held_out_coverage(samples)
    parts = []
    for metric in METRICS:
        mine = [s for s in samples if s.metric == metric]
        hm, tm = coverage(mine, cells)
        parts.append(f"{metric} {hm}/{tm}")
    return (f"band coverage of the leave-one-series-out rows: {100 * h / t:.0f}% ({h}/{t}; "
            + ", ".join(parts) + f"); each series against bands derived without it "
            f"{100 * ho / to:.0f}% ({ho}/{to}) [target >= 80%]")


def offline_unexplained(fit) -> list[str]:  # type: ignore[no-untyped-def]
    """Offline rows (every prompt queued): the time per request the fitted clock leaves
    unexplained, ``OSL / published - OSL / predicted`` output tok/s, next to the model's own
    GEMM time per request. GEMMs scale with the weight format; a miss that stays the same
    in ms per request across BF16/FP8/MXFP4 of one model lives outside them."""
    from tuner.perf.fit.to_benchmarks import _model

    lines = ["offline rows, engine time per request (ms, 1 / request throughput): published | "
             "predicted | unexplained | "
             "of which the model's GEMMs (predicted)"]
    for run in fit.runs:
        if run.row.kind != "offline" or "out_tok_s" not in run.row.figures:
            continue
        model = _model(run, fit.fitted[run.row.hardware])
        pred = run.figures(model)["out_tok_s"]
        osl = float(run.output_len.mean())
        pub_ms, pred_ms = 1e3 * osl / run.row.figures["out_tok_s"], 1e3 * osl / pred
        parts = model.terms(*run.arrays, maximum=np.maximum, minimum=np.minimum)
        total = sum(float(np.sum(v)) for v in parts.values())
        gemm_share = float(np.sum(parts["gemm"]) + np.sum(parts["lm_head"])) / total
        lines.append(f"  {run.row.id:34s} {pub_ms:7.2f} | {pred_ms:7.2f} | "
                     f"{pub_ms - pred_ms:+7.2f} | {gemm_share * pred_ms:7.2f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(PUBLISHED_CSV))
    ap.add_argument("--no-loso", action="store_true", help="skip leave-one-series-out")
    ap.add_argument("--markdown", default=None, help="also write the table to this file")
    args = ap.parse_args()
    t0 = time.perf_counter()
    fit = fit_benchmarks(args.csv, loso=not args.no_loso)
    wall = time.perf_counter() - t0
    lines = table(fit.in_sample, fit.loso)
    print("\n".join(lines))
    print()
    print(f"rows replayed {len(fit.runs)}, skipped {len(fit.skipped)}; figures "
          f"{len(fit.in_sample)}; {wall:.0f} s")
    for s in fit.skipped:
        print(f"  skipped {s.id} ({s.series}): {s.reason}")
    summary = [f"median |error|, all figures: in sample {100 * median_abs_error(fit.in_sample):.1f}% "
               f"(target <= 10%), priors only {100 * median_abs_error(fit.at_priors):.1f}%"]
    if fit.loso is not None:
        summary.append(f"leave-one-series-out {100 * median_abs_error(fit.loso):.1f}% (target <= 15%)")
    print("; ".join(summary))
    print("| series | figures | in sample | leave-one-series-out | priors only |")
    print("|---|---:|---:|---:|---:|")
    for series in sorted({p.row.series for p in fit.in_sample}):
        sel = [p for p in fit.in_sample if p.row.series == series]
        lo = [p for p in fit.loso or [] if p.row.series == series]
        pr = [p for p in fit.at_priors if p.row.series == series]
        print(f"| {series} | {len(sel)} | {100 * median_abs_error(sel):.1f}% | "
              f"{100 * median_abs_error(lo):.1f}% | {100 * median_abs_error(pr):.1f}% |"
              if lo else f"| {series} | {len(sel)} | {100 * median_abs_error(sel):.1f}% | | "
              f"{100 * median_abs_error(pr):.1f}% |")
    for label, preds in (("in sample", fit.in_sample), ("leave-one-series-out", fit.loso)):
        if preds is None:
            continue
        by_fig: dict[str, list[float]] = {}
        by_metric: dict[str, list[float]] = {}
        for p in preds:
            by_fig.setdefault(p.figure, []).append(abs(p.rel_error))
            by_metric.setdefault(METRIC_OF[p.figure], []).append(abs(p.rel_error))
        print(f"per figure ({label}): " + ", ".join(
            f"{k} {100 * statistics.median(v):.1f}% (n={len(v)})" for k, v in sorted(by_fig.items())))
        print(f"per metric ({label}): " + ", ".join(
            f"{k} {100 * statistics.median(v):.1f}% (n={len(v)})" for k, v in sorted(by_metric.items()))
            + (" [targets: all <= 10% in sample, <= 15% leave-one-series-out; TTFT <= 20%"
               " leave-one-series-out]" if label != "in sample" else ""))
    print(ttft_parts(fit))
    if fit.loso is not None:
        print(band_coverage(fit))
    print("\n".join(offline_unexplained(fit)))
    ok, worst = _reproduces(fit.document(), load_fitted())
    print(f"reproduces the shipped presets: {'yes' if ok else 'NO'} "
          f"(largest relative coefficient difference {worst:.2e})")
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines + [""] + summary) + "\n")


if __name__ == "__main__":
    main()
