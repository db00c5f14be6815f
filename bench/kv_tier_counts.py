#!/usr/bin/env python3
"""Where the CPU KV tier's replay time goes, as counts (not a test: prints numbers).

``bench/kv_tier.py`` gives the tier / no-tier speed ratio; this gives the counts that
explain it, for one slice of traces/agentic_1h.parquet at 70B TP8 MI355X (async
scheduling), with and without the tier, each replay in its own child process:

* the LRU eviction order (``EvictionOrder``): ``take`` calls, chunks evicted, windows
  read (one heap pop each), the searches inside a run that end a window (``_upto``: at
  the next run's head or at a lazy entry's true rank), runs and entries pushed;
* the decode group (the fast path): members joined, plans that were not provably a group
  step (``plan`` returned None, so the group was dissolved and every member rejoins
  afterwards) and the members they dissolved; group steps short of free blocks
  (``_run_preempting``), and of those the ones the block fence stopped (a connector
  under async scheduling: the victim's blocks are still in flight) with the members the
  stopped loop did not reach (they leave the group unscheduled and rejoin later).

The counters wrap the methods from outside (no change to the replay); the CPU seconds
include the wrappers' small cost, so take the speed ratio from ``bench/kv_tier.py``.

Usage:  .venv/bin/python bench/kv_tier_counts.py [--end 10m] [--size 512] [--policy lru|arc]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import collections, heapq, json, sys, time, types
from tuner import replay
from tuner.perf.presets import resolve_target
from tuner.perf.target import Target
from tuner.sim import decode_group
from tuner.sim.kv_connector import eviction_order
from tuner.sim.settings import SimOptions

counts = collections.Counter()

def wrap(cls, name, count):
    inner = getattr(cls, name)
    def outer(self, *args, **kwargs):
        out = inner(self, *args, **kwargs)
        count(self, args, out)
        return out
    setattr(cls, name, outer)

def on_take(order, args, out):
    counts["take calls"] += 1
    counts["chunks evicted"] += args[0]

def on_push(order, args, out):
    counts["runs pushed"] += 1
    counts["entries pushed"] += len(args[1])

def on_plan(group, args, out):
    counts["group plans"] += 1
    if out is None:
        counts["plans not a group step"] += 1
        counts["members dissolved"] += group.size

def on_join(group, args, out):
    counts["group joins"] += 1

def on_short(group, args, out):
    counts["short group steps"] += 1

def count_unreached():
    # fence stops inside a short group step (absent before branch tierfence)
    inner = getattr(decode_group.DecodeGroup, "_leave_unreached", None)
    if inner is None:
        return
    def outer(self, stopped):
        size = self.size
        inner(self, stopped)
        counts["fence stops in group steps"] += 1
        counts["members left unreached"] += size - self.size
    decode_group.DecodeGroup._leave_unreached = outer

def heappop(heap):
    counts["windows (heap pops)"] += 1
    return heapq.heappop(heap)

def count_searches():
    # run searches (a window's bound, a lazy cut) inside take: one numpy searchsorted
    # or more each
    inner = eviction_order._upto
    def outer(*args):
        counts["window searches (_upto)"] += 1
        return inner(*args)
    eviction_order._upto = outer

wrap(eviction_order.EvictionOrder, "take", on_take)
# every run goes in through push_sorted (branch tier6: a finish's run skips push's sort
# check), _push_sorted (branch tier5: a take's go-back-in batch skips it), else push
_order = eviction_order.EvictionOrder
wrap(_order, next(n for n in ("push_sorted", "_push_sorted", "push") if hasattr(_order, n)),
     on_push)
wrap(decode_group.DecodeGroup, "plan", on_plan)
wrap(decode_group.DecodeGroup, "_join", on_join)
wrap(decode_group.DecodeGroup, "_run_preempting", on_short)
count_unreached()
count_searches()
eviction_order.heapq = types.SimpleNamespace(heappop=heappop, heappush=heapq.heappush)

spec = json.loads(sys.argv[1])
target = Target(hardware="mi355x", model="llama-3.1-70b", tp=8,
                kv_offloading_size=spec["size"], kv_offloading_eviction_policy=spec["policy"])
settings = replay.parse_settings([], resolve_target(target).default_settings)
c0 = time.process_time()
replay.run(spec["trace"], settings, target=target, options=SimOptions(fast_forward=True))
counts["CPU s (with counters)"] = round(time.process_time() - c0, 2)
print(json.dumps(dict(counts)))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--end", default="10m", help="slice of the agentic hour (tuner trace slice)")
    ap.add_argument("--size", type=float, default=512.0, help="--kv-offloading-size, GiB")
    ap.add_argument("--policy", default="lru", choices=["lru", "arc"])
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT), POLARS_MAX_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        trace = str(Path(tmp) / "slice.parquet")
        subprocess.run([sys.executable, "-c", "from tuner.cli import main; main()", "trace",
                        "slice", str(ROOT / "traces" / "agentic_1h.parquet"), "--end",
                        args.end, "-o", trace], env=env, check=True, capture_output=True)
        for size in (None, args.size):
            spec = json.dumps({"trace": trace, "size": size, "policy": args.policy})
            out = subprocess.run([sys.executable, "-c", _CHILD, spec], env=env, cwd=ROOT,
                                 check=True, capture_output=True, text=True).stdout
            counts = json.loads(out.strip().splitlines()[-1])
            label = "no tier" if size is None else f"tier {size:g} GiB {args.policy}"
            print(f"slice {args.end}, {label}:")
            for name, value in counts.items():
                print(f"  {name:28s} {value}")


if __name__ == "__main__":
    main()
