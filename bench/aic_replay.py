#!/usr/bin/env python3
"""One replay priced by the analytic model and by the measured tables (not a test).

Llama-3.1-70B on 8x H200 (16-token blocks, vLLM's batch defaults), traces/agentic_1h.parquet,
once with ``step_time_source="analytic"`` and once with ``"aic"`` (aiconfigurator-core's
measured vLLM GEMM and all-reduce tables, docs/step-time-model.md §10.1). Prints, as
Markdown: the step-time components of a few batches under both sources, the replay's
headline figures, and the wall time of each replay (the speed check: the measured source
must replay at >= 0.9x the analytic one). Needs the ``[aic]`` extra.

Usage:  .venv/bin/python bench/aic_replay.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner import replay  # noqa: E402
from tuner.metrics import summarize  # noqa: E402
from tuner.perf.presets import resolve_target  # noqa: E402
from tuner.perf.target import Target  # noqa: E402
from tuner.sim.batch import StepBatch  # noqa: E402
from tuner.trace import read_trace  # noqa: E402

SOURCES = ("analytic", "aic")
BATCHES = {
    "decode 1 req, 2k ctx": StepBatch(num_decode_reqs=1, decode_ctx_tokens=2000),
    "decode 64 reqs, 3k ctx": StepBatch(num_decode_reqs=64, decode_ctx_tokens=64 * 3000),
    "prefill 2048 tokens": StepBatch(num_prefill_reqs=1, num_prefill_tokens=2048,
                                     prefill_attn_pairs=2048 * 2049 / 2),
    "mixed 8000 + 100 decode": StepBatch(num_prefill_reqs=2, num_decode_reqs=100,
                                         num_prefill_tokens=8000, prefill_attn_pairs=16e6,
                                         decode_ctx_tokens=100 * 5000),
}
FIGURES = ("num_steps", "simulated_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s",
           "itl_p90_s", "output_throughput_per_gpu", "p90_interactivity")


def _target(source: str) -> Target:
    return Target(hardware="h200", model="llama-3.1-70b", tp=8, block_size=16,
                  step_time_source=source)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--trace", default=str(ROOT / "traces" / "agentic_1h.parquet"))
    args = ap.parse_args()
    models = {s: resolve_target(_target(s)) for s in SOURCES}
    print(f"measured source: {models['aic'].step_time_source}\n")
    print("| batch | term | analytic ms | aic ms |\n|---|---|---:|---:|")
    for label, batch in BATCHES.items():
        parts = {s: models[s].step_time.breakdown(batch) for s in SOURCES}
        for term in ("gemm", "lm_head", "attention", "allreduce", "launch"):
            print(f"| {label} | {term} | {1e3 * parts['analytic'][term]:.2f} | "
                  f"{1e3 * parts['aic'][term]:.2f} |")
        print(f"| {label} | **step** | {1e3 * models['analytic'].step_time.step_time_s(batch):.2f}"
              f" | {1e3 * models['aic'].step_time.step_time_s(batch):.2f} |")
    trace = read_trace(args.trace)
    walls: dict[str, list[float]] = {s: [] for s in SOURCES}
    figures: dict[str, dict] = {}
    for _ in range(args.repeats):
        for s in SOURCES:  # alternating, so machine load hits both alike
            t = time.perf_counter()
            result = replay.run(trace, target=_target(s))
            walls[s].append(time.perf_counter() - t)
            figures[s] = summarize(result).to_dict()
    print("\n| figure | analytic | aic | aic / analytic |\n|---|---:|---:|---:|")
    for key in FIGURES:
        a, m = figures["analytic"][key], figures["aic"][key]
        print(f"| {key} | {a:.4g} | {m:.4g} | {m / a:.3f} |")
    per_step = {s: min(walls[s]) / figures[s]["num_steps"] * 1e6 for s in SOURCES}
    print(f"\nreplay wall s (best of {args.repeats}): analytic {min(walls['analytic']):.2f}, "
          f"aic {min(walls['aic']):.2f}; µs per step {per_step['analytic']:.0f} / "
          f"{per_step['aic']:.0f}; aic speed = {per_step['analytic'] / per_step['aic']:.2f}x "
          "analytic")


if __name__ == "__main__":
    main()
