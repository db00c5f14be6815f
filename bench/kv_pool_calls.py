#!/usr/bin/env python3
"""The LRU pool's own cost, without the replay around it (not a test: prints seconds).

``bench/kv_tier.py`` times whole replays, where the pool is part of the tier's extra time and
the shared machine's load moves single runs by 10-50 %. This records every call a tier
replay makes to its ``LRUPool`` (``lookup_run``, ``prepare_store``, ``complete_store``,
``prepare_load``, ``complete_load``, ``on_request_finished``, ...) with copies of their key
arrays, once, and then plays the same calls against the pool of one or more checkouts in
fresh children, so only the pool's code differs between the arms. The calls need no
replay and hold the pool's decisions (the checkouts must evict the same number of chunks,
printed beside the seconds).

``--play LOG`` plays a kept log once with the ``tuner`` on ``PYTHONPATH``; under
``valgrind --tool=cachegrind --cache-sim=no`` that gives a count of instructions which the
machine's load does not move (subtract a run that only loads the log).

Usage:  .venv/bin/python bench/kv_pool_calls.py [--end 10m] [--size 512] [--rounds 3]
        [--compare OTHER_CHECKOUT] [--log FILE (kept; reused when it exists)]
        PYTHONPATH=CHECKOUT valgrind --tool=cachegrind --cache-sim=no \
            .venv/bin/python bench/kv_pool_calls.py --play FILE
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

#: Record the pool calls of one tier replay: the pool class is wrapped from outside.
_CAPTURE = r"""
import pickle, sys
import numpy as np
from tuner import replay
from tuner.perf.presets import resolve_target
from tuner.perf.target import Target
from tuner.sim.kv_connector import lru_pool
from tuner.sim.settings import SimOptions

log, ctx_ids = [], {}
def arg(x):
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, list):
        return np.asarray(x, np.int64)
    if hasattr(x, "lru_rank"):  # a ReqContext: by number, a fresh one per request in play
        return ("ctx", ctx_ids.setdefault(id(x), (len(ctx_ids), x))[0])
    return x
def wrap(name):
    inner = getattr(lru_pool.LRUPool, name)
    def outer(self, *args):
        log.append((name, [arg(x) for x in args]))
        return inner(self, *args)
    setattr(lru_pool.LRUPool, name, outer)
for name in ("on_new_request", "lookup_run", "prepare_load", "complete_load",
             "prepare_store", "complete_store", "on_request_finished", "renumber"):
    wrap(name)
init = lru_pool.LRUPool.__init__
def logged_init(self, num_chunks):
    log.append(("__init__", [num_chunks]))
    init(self, num_chunks)
lru_pool.LRUPool.__init__ = logged_init
spec = __import__("json").loads(sys.argv[1])
target = Target(hardware="mi355x", model="llama-3.1-70b", tp=8,
                kv_offloading_size=spec["size"], kv_offloading_eviction_policy="lru")
settings = replay.parse_settings([], resolve_target(target).default_settings)
replay.run(spec["trace"], settings, target=target, options=SimOptions(fast_forward=True))
with open(spec["log"], "wb") as f:
    pickle.dump(log, f, protocol=5)
"""

#: Play a recorded call log against this checkout's pool; CPU seconds per method.
_PLAY = r"""
import collections, json, pickle, sys, time
from tuner.sim.kv_connector.lru_pool import LRUPool
from tuner.sim.kv_connector.policies import ReqContext
spec = json.loads(sys.argv[1])
with open(spec["log"], "rb") as f:
    log = pickle.load(f)
clock = time.process_time
best = None
for _ in range(spec["rounds"]):
    seconds, ctxs, pool = collections.Counter(), {}, None
    start = clock()
    for name, args in log:
        if name == "__init__":
            pool = LRUPool(*args)
            continue
        args = [ctxs.setdefault(x[1], ReqContext()) if isinstance(x, tuple) else x
                for x in args]
        t = clock()
        getattr(pool, name)(*args)
        seconds[name] += clock() - t
    seconds["total"] = clock() - start
    if best is None or seconds["total"] < best[0]["total"]:
        best = (seconds, pool.num_evicted)
print(json.dumps({"seconds": best[0], "evicted": best[1]}))
"""


def _child(checkout: Path, code: str, spec: dict) -> str:
    env = dict(os.environ, PYTHONPATH=str(checkout), POLARS_MAX_THREADS="1")
    return subprocess.run([sys.executable, "-c", code, json.dumps(spec)], env=env,
                          cwd=checkout, check=True, capture_output=True, text=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--end", default="10m", help="slice of the agentic hour (tuner trace slice)")
    ap.add_argument("--size", type=float, default=512.0, help="--kv-offloading-size, GiB")
    ap.add_argument("--rounds", type=int, default=3, help="plays per child (the fastest counts)")
    ap.add_argument("--alternations", type=int, default=2, help="children per checkout, in turn")
    ap.add_argument("--compare", type=Path, default=None, help="another checkout")
    ap.add_argument("--log", type=Path, default=None, help="keep the call log here")
    ap.add_argument("--play", type=Path, default=None,
                    help="play this kept log once here (tuner from PYTHONPATH) and stop")
    args = ap.parse_args()
    if args.play is not None:
        sys.argv[1:] = [json.dumps({"log": str(args.play), "rounds": 1})]
        exec(compile(_PLAY, "<play>", "exec"), {"__name__": "__play__"})
        return
    checkouts = {"this": ROOT}
    if args.compare is not None:
        checkouts["other"] = args.compare.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        log = args.log or Path(tmp) / "pool_calls.pkl"
        if not log.exists():
            trace = str(Path(tmp) / "slice.parquet")
            subprocess.run([sys.executable, "-c", "from tuner.cli import main; main()", "trace",
                            "slice", str(ROOT / "traces" / "agentic_1h.parquet"), "--end",
                            args.end, "-o", trace],
                           env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True,
                           capture_output=True)
            # recorded with this checkout's connector: the calls are the connector's, and
            # every checkout's pool answers them (its decisions are printed to compare)
            _child(ROOT, _CAPTURE, {"trace": trace, "size": args.size, "log": str(log)})
        spec = {"log": str(log.resolve()), "rounds": args.rounds}
        results: dict[str, list[dict]] = {name: [] for name in checkouts}
        for a in range(args.alternations):
            for name, checkout in checkouts.items():
                out = json.loads(_child(checkout, _PLAY, spec).strip().splitlines()[-1])
                results[name].append(out)
                print(f"alternation {a + 1} {name:5s} pool {out['seconds']['total']:6.3f} CPU s, "
                      f"{out['evicted']} chunks evicted", flush=True)
    print(f"\npool calls of the {args.end} slice's LRU tier replay "
          f"(--kv-offloading-size {args.size:g}), fastest play per checkout, CPU seconds:")
    for name, runs in results.items():
        best = min(runs, key=lambda r: r["seconds"]["total"])
        parts = ", ".join(f"{k} {v:.3f}" for k, v in sorted(best["seconds"].items(),
                                                                key=lambda kv: -kv[1]))
        print(f"  {name:5s} ({checkouts[name].name}): {parts}")
    if args.compare is not None:
        this = min(r["seconds"]["total"] for r in results["this"])
        other = min(r["seconds"]["total"] for r in results["other"])
        print(f"  pool, this checkout over the other: {other / this:.2f}x faster")


if __name__ == "__main__":
    main()
