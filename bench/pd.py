#!/usr/bin/env python3
"""Cost of a disaggregated (P/D) replay against an aggregated fleet of as many engines
(not a test: prints ratios measured side by side in one run).

One synthetic chat trace (5 or 20 minutes at 8 requests/s), Llama-3.1-8B TP1 on H200:
each P:D layout is replayed beside ``P + D`` aggregated replicas behind round robin (the
same engines, each doing all of its requests' work). A P/D request is stepped on two
engines (its prefill, then its decode after the read), so its steps and empty steps
(engines waiting on transfers) are the cost to watch. Columns: CPU seconds of the call,
steps, CPU microseconds per step, P/D CPU over the aggregated fleet's.

Usage:  .venv/bin/python bench/pd.py [--quick]
"""

from __future__ import annotations

import argparse
import time
from typing import Any


def _run(trace: Any, *, replicas: int = 1, pd: tuple[int, int] | None = None) -> dict:
    from tuner import replay
    from tuner.perf.pd_link import PDLayout
    from tuner.perf.target import Target

    target = Target(hardware="h200", model="llama-3.1-8b", tp=1, replicas=replicas)
    kw: dict[str, Any] = {}
    if pd is not None:
        kw["pd"] = PDLayout(*pd)
    c0 = time.process_time()
    result = replay.run(trace, target=target, **kw)
    cpu = time.process_time() - c0
    steps = int(result.counters["num_steps"])
    return {"cpu_s": cpu, "steps": steps, "us_per_step": 1e6 * cpu / max(1, steps)}


def main() -> None:
    from tuner.trace.synth import synthesize

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 minutes of traffic, not 20")
    args = parser.parse_args()
    trace = synthesize("chat", duration_s=300 if args.quick else 1200, rate=8.0, seed=7)
    print(f"{'layout':<28}{'CPU s':>9}{'steps':>10}{'us/step':>9}{'P/D / aggregated':>18}")
    for p, d in ((1, 1), (1, 2)):
        agg = _run(trace, replicas=p + d)
        pdr = _run(trace, pd=(p, d))
        print(f"{f'{p + d} replicas, round-robin':<28}{agg['cpu_s']:>9.2f}{agg['steps']:>10,}"
              f"{agg['us_per_step']:>9.1f}")
        print(f"{f'--pd {p}:{d}':<28}{pdr['cpu_s']:>9.2f}{pdr['steps']:>10,}"
              f"{pdr['us_per_step']:>9.1f}{pdr['cpu_s'] / agg['cpu_s']:>18.2f}")


if __name__ == "__main__":
    main()
