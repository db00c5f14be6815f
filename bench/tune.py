"""Wall time of N stage-1 tuning trials with 1 and 2 workers, and the speed-up ratio.

    .venv/bin/python bench/tune.py                       # 100 trials on traces/agentic_1h.parquet
    .venv/bin/python bench/tune.py --trials 8 --duration 600   # shorter: first 10 minutes

It times exactly the search phase (stage 1: ``--trials`` trials of the admission space,
baseline first, on the first quarter of the training window), through the same code path
``tuner tune --workers N`` uses, each worker count in a fresh journal study. Stages 2 and
3 (a fixed number of replays) are left out so the ratio is the parallel search's.
The speed-up is bounded by the free cores: ``os.cpu_count()`` is printed beside it.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tuner.perf.target import Target  # noqa: E402
from tuner.progress import Reporter  # noqa: E402
from tuner.tune import ReplayEvaluator, StudyConfig, load_space, parse_objectives  # noqa: E402
from tuner.tune.storage import open_storage  # noqa: E402
from tuner.tune.study import _create_or_load, _enqueue_start_points, _run_stage1  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="traces/agentic_1h.parquet")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--duration", type=float, default=None,
                        help="use only the first S seconds of the trace")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--stage1-fraction", type=float, default=0.25)
    args = parser.parse_args()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    trace: object = args.trace
    if args.duration is not None:
        from tuner.trace import read_trace, slice_trace

        trace = slice_trace(read_trace(args.trace), end_s=args.duration)
    target = Target(hardware="mi355x", model="llama-3.1-70b", tp=8, block_size=args.block_size)
    t = time.perf_counter()
    evaluator = ReplayEvaluator(trace, target=target, stage1_fraction=args.stage1_fraction)
    print(f"trace {args.trace}{f' (first {args.duration:g} s)' if args.duration else ''}: "
          f"{len(evaluator._all or [])} requests, loaded in {time.perf_counter() - t:.1f} s; "
          f"stage-1 window {evaluator.windows.t_stage1 - evaluator.windows.t0:.0f} s; "
          f"cpu_count={os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    config = StudyConfig(space=load_space("admission"), objectives=parse_objectives(None),
                         constraints=(), n_trials=args.trials, seed=0,
                         evaluator=evaluator.spec())
    walls: dict[int, float] = {}
    for workers in (int(w) for w in args.workers.split(",")):
        with tempfile.TemporaryDirectory(prefix="tuner-bench-") as tmp:
            url = os.path.join(tmp, "bench.optuna-journal")
            study = _create_or_load(open_storage(url), f"bench-{workers}", config)
            _enqueue_start_points(study, config, evaluator, None)
            t = time.perf_counter()
            _run_stage1(study, url, config, evaluator, workers, Reporter(None, unit="trials"))
            walls[workers] = time.perf_counter() - t
            done = len(study.get_trials(deepcopy=False))
        print(f"workers={workers}: {done} trials in {walls[workers]:.1f} s "
              f"({walls[workers] / max(done, 1):.2f} s/trial)")
    if 1 in walls and 2 in walls:
        print(f"speed-up 2 workers vs 1: {walls[1] / walls[2]:.2f}x "
              f"(ideal 2.00x; cpu_count={os.cpu_count()}, load average now "
              f"{os.getloadavg()[0]:.1f}: other processes share the cores)")


if __name__ == "__main__":
    main()
