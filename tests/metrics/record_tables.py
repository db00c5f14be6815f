"""Random per-request tables for the streamed-metrics tests (every status, nan times, a
fleet's engine column, pooled gaps, a time series)."""

from __future__ import annotations

import math

import numpy as np

from tuner.records import EngineSummary, GapSamples, ReplayResult, RequestTable

STATUSES = ("finished", "rejected", "aborted", "unfinished", "error")


def random_result(seed: int, n: int = 3000, engines: int = 3, *,
                  table: bool = True) -> ReplayResult:
    rng = np.random.default_rng(seed)
    t = RequestTable([f"r{i}" for i in range(n)], rng.integers(1, 5000, n).tolist(),
                     [None if i % 7 == 0 else f"s{i % 50}" for i in range(n)])
    arrival = np.sort(rng.uniform(0, 600, n))
    for i in range(n):
        status = STATUSES[int(rng.choice(5, p=[0.7, 0.1, 0.05, 0.1, 0.05]))]
        a = float(arrival[i])
        if status == "rejected":
            t.record(i, "rejected", a)
            t.engine[i] = -1 if engines > 1 else 0
            continue
        sched = a + float(rng.exponential(2.0)) if rng.random() > 0.05 else math.nan
        first = sched + float(rng.exponential(0.5)) if sched == sched and rng.random() > 0.1 \
            else math.nan
        out = int(rng.integers(0, 400))
        finish = first + out * float(rng.uniform(0.01, 0.05)) if status == "finished" \
            and first == first else math.nan
        t.record(i, status if finish == finish or status != "finished" else "unfinished", a,
                 output_len=out, first_scheduled_s=sched, first_token_s=first,
                 finish_s=finish, num_cached_tokens=int(rng.integers(0, 2000)),
                 num_preemptions=int(rng.integers(0, 3)))
        t.engine[i] = int(rng.integers(0, engines))
    gaps = GapSamples()
    for g, c in zip(rng.exponential(0.03, 5000), rng.integers(0, 9, 5000)):
        gaps.append((float(g), int(c)))
    steps = 4000
    ts = {"t_s": np.sort(rng.uniform(0, 700, steps)).tolist(),
          "kv_usage": rng.uniform(0, 1, steps).tolist(),
          "num_running": rng.integers(0, 300, steps).tolist(),
          "num_waiting": rng.integers(0, 80, steps).tolist(),
          "num_scheduled_tokens": rng.integers(0, 8192, steps).tolist()}
    summaries = [EngineSummary(engine=e, replica=e, dp_rank=0, num_requests=0,
                               num_finished=0, prefix_cache_queries=1, prefix_cache_hits=0,
                               preemptions=0, kv_usage_mean=0.5, kv_usage_max=0.9,
                               num_steps=10) for e in range(engines)] if engines > 1 else []
    return ReplayResult(backend="sim", requests=t if table else list(t), itl_samples=gaps,
                        timeseries=ts, counters={"prefix_cache_queries": 10.0,
                                                 "prefix_cache_hits": 3.0, "num_steps": 4000},
                        simulated_s=700.0, wall_s=1.5, num_gpus=8, engines=summaries)
