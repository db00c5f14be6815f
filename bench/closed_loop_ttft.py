#!/usr/bin/env python3
"""A replay's closed loop against the benchmark fit's and the published TTFT (not a test:
prints).

The published TTFT rows (tuner/perf/data/benchmarks/published-train.csv: InferenceX's
``vllm bench serve`` runs at concurrency 64, 640 random prompts) are closed loops, and the
benchmark fit prices each replacement's missed engine step analytically
(``tuner.perf.fit.benchmark_rows.missed_step_s``, docs/step-time-model.md §1.4). This
replays each such row as a trace replay does (``tuner.sim.engine.Simulator`` with the
shipped coefficients, the row's scheduling mode, the same prompts as the fit's recording,
the API server layer of ``tuner.metrics.summarize``) twice: with the replacement's missed
step in the replay clock (``ClosedLoop(C)``, the default since ``loop31``) and without it
(``replacement_misses_step=False``: the clock replays had before). It prints the median
TTFT of each, engine-side and client-side, next to the fit's figure for the row (the same
coefficients, the recorded steps priced by the fit) and the published median. Both sides
of each row run in this process, one after the other; the figures do not depend on the
machine's load (no wall clock enters them).

Usage:  .venv/bin/python bench/closed_loop_ttft.py [--csv CSV]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.metrics import summarize  # noqa: E402
from tuner.perf.api_server import api_server_cost  # noqa: E402
from tuner.perf.fit.benchmark_rows import (PUBLISHED_CSV, BenchmarkRow,  # noqa: E402
                                           load_rows, record, row_requests)
from tuner.perf.fit.published import default_coefficients  # noqa: E402
from tuner.perf.presets import resolve_target  # noqa: E402
from tuner.perf.step_time import RooflineStepTimeModel  # noqa: E402
from tuner.perf.target import Target  # noqa: E402
from tuner.sim.engine import Simulator  # noqa: E402
from tuner.sim.load import ClosedLoop  # noqa: E402
from tuner.sim.settings import CacheSettings, SimOptions  # noqa: E402


def replay_ttft(row: BenchmarkRow, misses: bool) -> dict[str, float]:
    """Median TTFT (ms) of the row replayed as a closed loop: the engine's and the
    client's (the API server layer, one process as ``vllm serve`` defaults to)."""
    target = Target(hardware=row.hardware, model=row.model, tp=row.tp,
                    quantization=row.quantization, kv_cache_dtype=row.kv_cache_dtype,
                    gpu_memory_utilization=row.gpu_memory_utilization,
                    max_model_len=row.max_model_len)
    resolved = resolve_target(target)
    model = RooflineStepTimeModel(resolved.hardware, resolved.model, row.tp,
                                  default_coefficients(resolved.hardware))
    bs = resolved.cache.block_size
    reqs, num_ids = row_requests(row, bs)
    cache = CacheSettings(block_size=bs, num_gpu_blocks=resolved.cache.num_gpu_blocks,
                          enable_prefix_caching=False, max_model_len=row.max_model_len)
    result = Simulator(reqs, resolved.default_settings, cache, model,
                       options=SimOptions(async_scheduling=row.async_scheduling),
                       load=ClosedLoop(row.concurrency, replacement_misses_step=misses),
                       num_gpus=row.tp, num_hash_ids=num_ids).run()
    done = [r for r in result.requests if r.status == "finished"]
    engine = statistics.median(r.first_token_s - r.arrival_s for r in done)
    # replacements (all but the first C, sent at 0) first scheduled after they were sent
    replacements = [r for r in done if r.arrival_s > 0.0]
    late = [r for r in replacements if r.first_scheduled_s > r.arrival_s]
    summary = summarize(result, api_server=api_server_cost(None))
    return {"engine": 1e3 * engine, "client": 1e3 * summary.ttft_p50_s,
            "tpot": summary.tpot_p50_s, "out_tok_s": summary.output_throughput,
            "late": float(len(late)), "replacements": float(len(replacements))}


def fit_ttft(row: BenchmarkRow) -> float:
    """The benchmark fit's client median TTFT (ms) for the row, shipped coefficients."""
    run = record(row)
    model = RooflineStepTimeModel(run.resolved.hardware, run.resolved.model, row.tp,
                                  default_coefficients(run.resolved.hardware))
    return run.figures(model)["ttft_med"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=PUBLISHED_CSV)
    args = ap.parse_args()
    rows = [r for r in load_rows(args.csv)[0]
            if r.kind == "closed" and "ttft_med" in r.figures]
    print("median TTFT, ms (engine / client with the API server); replay with the missed "
          "step | replay without (the clock before) | the fit's figure | published")
    for row in rows:
        t0 = time.perf_counter()
        now = replay_ttft(row, True)
        before = replay_ttft(row, False)
        fit = fit_ttft(row)
        published = row.figures["ttft_med"]

        def pct(a: float, b: float) -> str:
            return f"{100 * (a / b - 1):+.1f} %"

        print(f"  {row.id:28s} {now['engine']:6.1f} / {now['client']:6.1f} | "
              f"{before['engine']:6.1f} / {before['client']:6.1f} | {fit:6.1f} | "
              f"{published:6.1f}   client vs published {pct(now['client'], published)} "
              f"(before {pct(before['client'], published)}), vs the fit "
              f"{pct(now['client'], fit)} (before {pct(before['client'], fit)}); "
              f"replacements first scheduled after they were sent: "
              f"{int(now['late'])}/{int(now['replacements'])} (before {int(before['late'])}); "
              f"TPOT {100 * (now['tpot'] / before['tpot'] - 1):+.2f} %, output tok/s "
              f"{100 * (now['out_tok_s'] / before['out_tok_s'] - 1):+.2f} % "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)

if __name__ == "__main__":
    main()
