#!/usr/bin/env python3
"""Replay speed with the CPU KV tier against without it, side by side (not a test: prints ratios).

Issue 24's speed goal: with ``--kv-offloading-size 512`` a replay of the agentic hour runs at
>= 0.8x the speed of the same replay without a tier. This replays a slice of
traces/agentic_1h.parquet (default the first 2 minutes: 567 requests) at 70B TP8 on MI355X
(async scheduling, the default), with and without the tier, in alternation, each replay in
its own child process, and prints the CPU seconds of each and the ratio (no tier / tier:
1.0 means the tier costs nothing). With ``--compare DIR`` the same pair is also replayed
with another checkout (``DIR`` first on ``PYTHONPATH``), interleaved, so the two checkouts'
ratios come from the same minutes of a shared machine.

Usage:  .venv/bin/python bench/kv_tier.py [--end 2m] [--size 512] [--policy lru|arc]
        [--rounds 3] [--compare OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, sys, time
from tuner import replay
from tuner.perf.presets import resolve_target
from tuner.perf.target import Target
spec = json.loads(sys.argv[1])
target = Target(hardware="mi355x", model="llama-3.1-70b", tp=8,
                kv_offloading_size=spec["size"], kv_offloading_eviction_policy=spec["policy"])
from tuner.sim.settings import SimOptions
settings = replay.parse_settings([], resolve_target(target).default_settings)
c0 = time.process_time()
result = replay.run(spec["trace"], settings, target=target,
                    options=SimOptions(fast_forward=spec["fast_forward"]))
print(json.dumps({"cpu_s": time.process_time() - c0}))
"""


def _replay(checkout: Path, trace: str, size: float | None, policy: str,
            fast_forward: bool = True) -> float:
    """CPU seconds of one replay in a fresh child with ``checkout`` first on the path."""
    env = dict(os.environ, PYTHONPATH=str(checkout), POLARS_MAX_THREADS="1")
    spec = json.dumps({"trace": trace, "size": size, "policy": policy,
                       "fast_forward": fast_forward})
    out = subprocess.run([sys.executable, "-c", _CHILD, spec], env=env, cwd=checkout,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["cpu_s"]


def _slice(end: str, out: Path) -> str:
    cli = "from tuner.cli import main; main()"
    subprocess.run([sys.executable, "-c", cli, "trace", "slice",
                    str(ROOT / "traces" / "agentic_1h.parquet"), "--end", end, "-o", str(out)],
                   env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True, capture_output=True)
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--end", default="2m", help="slice of the agentic hour (tuner trace slice)")
    ap.add_argument("--size", type=float, default=512.0, help="--kv-offloading-size, GiB")
    ap.add_argument("--policy", default="lru", choices=["lru", "arc"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compare", type=Path, default=None, help="another checkout")
    args = ap.parse_args()
    checkouts = {"this": ROOT}
    if args.compare is not None:
        checkouts["other"] = args.compare.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        trace = _slice(args.end, Path(tmp) / "slice.parquet")
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            # No tier on the plain path (fast_forward off), this checkout, each round: what
            # the decode group saves, for scale (a tier used to turn it off).
            arms = [("this", "plain", None, False)]
            for name in checkouts:  # alternate: a busy neighbour hits every arm alike
                arms += [(name, "off", None, True), (name, "on", args.size, True)]
            for name, arm, size, fast in arms:
                cpu_s = _replay(checkouts[name], trace, size, args.policy, fast)
                times.setdefault((name, arm), []).append(cpu_s)
                print(f"round {r + 1} {name:5s} tier={arm:5s} {cpu_s:6.2f} CPU s", flush=True)
    print(f"\nslice {args.end}, --kv-offloading-size {args.size:g} ({args.policy}), "
          f"median of {args.rounds} rounds, CPU seconds:")
    for name, checkout in checkouts.items():
        off = statistics.median(times[(name, "off")])
        on = statistics.median(times[(name, "on")])
        print(f"  {name:5s} ({checkout.name}): no tier {off:.2f} s, tier {on:.2f} s, "
              f"speed with tier / without = {off / on:.2f}x (goal >= 0.8x)")
    plain = statistics.median(times[("this", "plain")])
    off = statistics.median(times[("this", "off")])
    print(f"  no tier on the plain path (fast_forward off) {plain:.2f} s = "
          f"{off / plain:.2f}x of the fast path; the tier's own work (tier - no tier) is "
          f"{statistics.median(times[('this', 'on')]) - off:.2f} s")
    if args.compare is not None:
        on_this = statistics.median(times[("this", "on")])
        on_other = statistics.median(times[("other", "on")])
        print(f"  tier replay, this checkout over the other: {on_other / on_this:.2f}x faster")


if __name__ == "__main__":
    main()
