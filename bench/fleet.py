#!/usr/bin/env python3
"""Cost of a fleet replay against its number of engines (not a test: prints ratios).

The same total traffic (one synthetic chat trace, 20 minutes at 8 requests/s, sessions
known, which one engine keeps up with) replayed on 1, 2, 4 and 8 engines of Llama-3.1-8B
on H200 (TP1): as replicas behind a router (round-robin, and prefix-aware, whose cost
also scans every engine's prefix cache per request) and as DP ranks of one deployment
(dense, vLLM's load balancer). The total number of steps grows with the engines (each
engine steps for itself), so about linear cost is the goal. Columns: CPU seconds of the
whole call (trace loading included; CPU, not wall, so a machine shared with other work
does not inflate them), that over the 1-engine figure, steps, CPU microseconds a step.

The 1-engine row runs the single-engine ``Simulator`` (the path every single-engine replay
takes); the row below it (``fleet loop, 1 engine``: ``FleetSimulator`` with one engine, the
trace read into memory) shows what the fleet machinery costs by itself.

Usage:  .venv/bin/python bench/fleet.py [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RATE = 8.0  # one H200 keeps up with it (TTFT p90 well under a second)


def _trace(quick: bool) -> Any:
    from tuner.trace.synth import synthesize

    return synthesize("chat", duration_s=300 if quick else 1200, rate=RATE, seed=7)


def _run(trace: Any, *, dp: int, replicas: int, policy: str,
         single_engine_fleet: bool = False) -> dict[str, Any]:
    from tuner import replay
    from tuner.metrics import summarize
    from tuner.perf.presets import resolve_target
    from tuner.perf.target import Target
    from tuner.sim.fleet import RouterSettings
    from tuner.sim.fleet.simulator import FleetSimulator

    target = Target(hardware="h200", model="llama-3.1-8b", tp=1, dp=dp, replicas=replicas)
    router = RouterSettings(policy)
    if single_engine_fleet:
        from tuner.sim.settings import SimOptions

        t0, c0 = time.perf_counter(), time.process_time()
        resolved = resolve_target(target)
        # the scheduling mode replay.run() resolves for the target (async on a GPU where
        # the twin models it), so this row replays what the Simulator row replays
        mode = bool(getattr(resolved, "async_scheduling", False))
        requests = replay.intern_requests(trace, resolved.cache.block_size)
        fleet = FleetSimulator(requests, resolved.default_settings, resolved.cache,
                               resolved.step_time, num_gpus=1,
                               num_hash_ids=requests.num_hash_ids,
                               options=SimOptions(async_scheduling=mode))
        result = fleet.run()
    else:
        t0, c0 = time.perf_counter(), time.process_time()
        result = replay.run(trace, target=target, router=router)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = summarize(result)
    return {"engines": dp * replicas, "dp": dp, "replicas": replicas, "router": policy,
            "wall_s": wall, "cpu_s": cpu, "replay_s": result.wall_s,
            "steps": int(result.counters["num_steps"]),
            "us_per_step": 1e6 * cpu / max(1, result.counters["num_steps"]),
            "ttft_p90_s": s.ttft_p90_s, "hit_rate": s.prefix_cache_hit_rate,
            "single_engine_fleet": single_engine_fleet}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 minutes of traffic, not 20")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    trace = _trace(args.quick)
    print(f"trace: chat, {sum(1 for _ in trace.requests()):,} requests "
          f"({'5' if args.quick else '20'} min at {RATE:g} req/s); Llama-3.1-8B TP1 on H200")
    rows = [_run(trace, dp=1, replicas=1, policy="round-robin"),
            _run(trace, dp=1, replicas=1, policy="round-robin", single_engine_fleet=True)]
    for n in (2, 4, 8):
        rows.append(_run(trace, dp=1, replicas=n, policy="round-robin"))
        rows.append(_run(trace, dp=1, replicas=n, policy="prefix-aware"))
        rows.append(_run(trace, dp=n, replicas=1, policy="round-robin"))
    base = rows[0]["cpu_s"]
    print(f"{'deployment':<34}{'CPU s':>10}{'x 1 engine':>12}{'steps':>11}"
          f"{'us/step':>9}{'TTFT p90':>10}{'hit rate':>10}")
    for r in rows:
        if r["single_engine_fleet"]:
            name = "fleet loop, 1 engine"
        elif r["engines"] == 1:
            name = "1 engine (Simulator)"
        elif r["dp"] > 1:
            name = f"DP {r['dp']} (vLLM balancer)"
        else:
            name = f"{r['replicas']} replicas, {r['router']}"
        print(f"{name:<34}{r['cpu_s']:>10.2f}{r['cpu_s'] / base:>12.2f}"
              f"{r['steps']:>11,}{r['us_per_step']:>9.1f}{r['ttft_p90_s']:>10.3f}"
              f"{r['hit_rate']:>10.4f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
