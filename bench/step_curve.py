#!/usr/bin/env python3
"""Microseconds per scheduler step against the number of running requests (steady decode).

Not a test: prints a curve. ``N`` requests (1,024-token prompts, no shared prefix,
4,096 output tokens, 16-token blocks, a KV cache large enough for all of them) arrive
at once; after every one of them runs and has its first token, ``--steps`` steps of
``schedule()``, the step-time model's pricing (Llama-3.1-70B on 8x MI355X) and
``update_from_output`` are timed (CPU seconds of the child), in sync and in async mode (a batch queue of 2:
schedule(N+1) before update(N)). In steady decode nothing starts or finishes; a step
only touches the requests crossing a block boundary (one in 16 per step), so the cost
per step should grow with ``N / 16`` at most, far below a Python pass over the batch.

Each point runs in a fresh child process; ``--compare DIR`` runs every point a second
time with ``DIR`` (another checkout) first on ``PYTHONPATH``, at the same time as this
checkout's child, and prints the ratio (the other checkout's time over this one's).

Usage:  .venv/bin/python bench/step_curve.py [--running 8 64 256 1024] [--compare DIR]
bench/replay.py --curve prints the same table after its speed table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNNING = (8, 32, 128, 256, 512, 1024)
PROMPT, OUTPUT, BLOCK = 1024, 4096, 16


def _child(n: int, async_scheduling: bool, steps: int) -> dict[str, Any]:
    """Time ``steps`` steady-decode steps with ``n`` running in this process."""
    from collections import deque

    from tuner.perf.presets import resolve_target
    from tuner.perf.target import Target
    from tuner.sim.request import SimRequest
    from tuner.sim.scheduler import Scheduler
    from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

    model = resolve_target(Target(hardware="mi355x", model="llama-3.1-70b", tp=8,
                                  block_size=BLOCK)).step_time
    price = getattr(model, "step_time_s", model)
    per = PROMPT // BLOCK
    blocks = n * ((PROMPT + OUTPUT) // BLOCK + 2) + 16
    sched = Scheduler(SchedulerSettings(max_num_batched_tokens=16384, max_num_seqs=max(n, 1)),
                      CacheSettings(block_size=BLOCK, num_gpu_blocks=blocks),
                      SimOptions(async_scheduling=async_scheduling),
                      num_hash_ids=n * per + 16)
    for i in range(n):
        sched.add_request(SimRequest(
            request_id=str(i), index=i, arrival_s=0.0, num_prompt_tokens=PROMPT,
            max_tokens=OUTPUT, block_size=BLOCK,
            prompt_block_hashes=list(range(i * per, (i + 1) * per))))
    depth = 2 if async_scheduling else 1
    queue: deque = deque()
    now = [0.0]

    def step() -> None:
        out = sched.schedule()
        now[0] += price(out.batch)
        queue.append(out)
        if len(queue) >= depth:
            sched.update_from_output(queue.popleft(), now[0], {})

    while sched.waiting or any(r.num_output_tokens == 0 for r in sched.running):
        step()
    for _ in range(2 * BLOCK):  # every request decode-ready, block phases spread
        step()
    assert len(sched.running) == n, (len(sched.running), n)
    # CPU seconds of this process: on a shared machine, time spent descheduled is not
    # the twin's (wall time swings several-fold there).
    t0 = time.process_time()
    for _ in range(steps):
        step()
    wall = time.process_time() - t0
    assert len(sched.running) == n, "a request finished inside the timed steps"
    return {"running": n, "us_per_step": 1e6 * wall / steps}


def _points(pythonpaths: list[Path], n: int, async_scheduling: bool, steps: int
            ) -> list[float]:
    """One point per checkout, their children run at the same time (so a busy machine
    slows both alike), each timing its own CPU seconds."""
    spec = json.dumps({"n": n, "async": async_scheduling, "steps": steps})
    procs = []
    for pythonpath in pythonpaths:
        env = dict(os.environ, PYTHONPATH=str(pythonpath), OMP_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", spec],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            cwd=pythonpath))
    values = []
    for pythonpath, proc in zip(pythonpaths, procs):
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"step curve child failed ({pythonpath}, {spec}):\n{err[-3000:]}")
        values.append(float(json.loads(out.strip().splitlines()[-1])["us_per_step"]))
    return values


def curve(running: list[int], steps: int, compare: Path | None) -> list[dict[str, Any]]:
    """Print the table; return its rows."""
    head = f"{'mode':>5} {'running':>8} {'us/step':>9} {'us/step/req':>12}"
    if compare is not None:
        head += f" {'other us/step':>14} {'other/this':>11}"
    print(head)
    rows = []
    for mode in ("sync", "async"):
        for n in running:
            both = _points([ROOT] + ([compare] if compare is not None else []), n,
                           mode == "async", steps)
            ours = both[0]
            row = {"mode": mode, "running": n, "us_per_step": ours}
            line = f"{mode:>5} {n:>8,} {ours:>9.1f} {ours / n:>12.3f}"
            if compare is not None:
                other = both[1]
                row.update(other_us_per_step=other, other_over_this=other / ours)
                line += f" {other:>14.1f} {other / ours:>10.2f}x"
            print(line, flush=True)
            rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--running", type=int, nargs="+", default=list(RUNNING))
    ap.add_argument("--steps", type=int, default=512, help="timed steps per point")
    ap.add_argument("--compare", type=Path, help="another checkout, timed alternately")
    args = ap.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(_child(spec["n"], spec["async"], spec["steps"])))
        return 0
    curve(args.running, args.steps, args.compare)
    return 0


if __name__ == "__main__":
    sys.exit(main())
