"""Baseline and tuned settings replayed on the study's windows, for distributions.

A study stores summary numbers only (percentiles, rates); CDFs and time series need the
per-request records and per-step samples of a replay. When the study's trace is still
available (same fingerprint), :func:`replay_windows` replays the baseline and the chosen
settings through :func:`tuner.replay.run` on the same windows the study used: the
training window from its first arrival, and the held-out window from its warm-up start
(``tuner.tune.evaluate.HOLDOUT_WARMUP``) measured from ``t_split`` on.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import os
import pathlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tuner.processes import forked_pool
from tuner.records import ReplayResult
from tuner.report.study_trace import CompactTrace, load_compact
from tuner.sim.settings import SchedulerSettings
from tuner.perf.deployment import Deployment, router_settings
from tuner.tune.deployment_space import split_settings
from tuner.tune.evaluate import HOLDOUT_WARMUP, Windows, target_from_dict

#: Time-series bins per chart: enough for the eye, small enough for the page.
SERIES_BINS = 300


@dataclass(slots=True)
class WindowReplay:
    """One settings x one window: the records and what is measured from them."""

    label: str  # "baseline" or "tuned"
    window: str  # "train" or "holdout"
    result: ReplayResult
    measure_from_s: float | None  # None = the whole replay is measured
    summary: dict[str, Any]  # tuner.metrics.Summary.to_dict()

    def counted(self) -> list[Any]:
        lo = self.measure_from_s
        return [r for r in self.result.requests
                if r.status == "finished" and (lo is None or r.arrival_s >= lo)]

    def ttft_s(self) -> list[float]:
        return [r.ttft_s for r in self.counted() if math.isfinite(r.ttft_s)]

    def mean_itl_s(self) -> list[float]:
        """Per-request mean inter-token latency (the quantity p90 interactivity uses)."""
        return [r.mean_itl_s for r in self.counted() if math.isfinite(r.mean_itl_s)]


@dataclass(slots=True)
class StudyTrace:
    """The study's trace, read and checked: the ``Trace`` (for its statistics table) and
    its compact form (:mod:`tuner.report.study_trace`: interned requests for the replays,
    chart columns), read once."""

    trace: Any
    compact: CompactTrace
    source: str
    stats: Any = None  # tuner.trace.TraceStats, computed before the compact load (lower peak)

    @property
    def requests(self) -> Any:
        return self.compact.requests


def trace_candidates(spec: dict[str, Any], near: Sequence[pathlib.Path] = ()) -> list[pathlib.Path]:
    """Where the study's trace may be, in order: the path as ``tune`` was given it (it is
    relative to the folder tune ran in), the absolute path tune resolved it to, and the
    relative path under each folder in ``near`` (the profile's folder and its parents,
    for a repository moved or reported from elsewhere)."""
    out: list[pathlib.Path] = []
    given = spec.get("trace_path")
    for p in (given, spec.get("trace_resolved")):
        if p:
            out.append(pathlib.Path(str(p)))
    if given and not pathlib.Path(str(given)).is_absolute():
        for folder in near:
            out.append(folder / str(given))
    unique: list[pathlib.Path] = []
    for p in out:
        if p not in unique:
            unique.append(p)
    return unique


def trace_for_spec(spec: dict[str, Any], trace: Any = None, *,
                   near: Sequence[pathlib.Path] = ()) -> tuple[StudyTrace | None, str]:
    """The study's trace if it can be read and matches the stored fingerprint.

    The fingerprint is :func:`tuner.tune.evaluate.requests_fingerprint` of the requests
    (what ``tuner tune`` stores); studies written before it stored ``Trace.fingerprint()``,
    which is accepted too. Without ``trace``, the first of :func:`trace_candidates` that
    exists is used.

    Returns:
        ``(StudyTrace or None, why)``: ``why`` names the trace or says why it is unusable.
    """
    from tuner.perf.presets import resolve_target
    from tuner.trace import read_trace

    path = trace
    if path is None:
        candidates = trace_candidates(spec, near)
        if not candidates:
            return None, "the study does not record a trace path"
        found = next((p for p in candidates if p.exists()), None)
        if found is None:
            return None, (f"the study's trace {spec.get('trace_path')} is not available here "
                          f"(looked at {', '.join(str(p) for p in candidates)})")
        path = found
    if not hasattr(path, "lazy"):
        if not pathlib.Path(str(path)).exists():
            return None, f"the trace {path} does not exist"
        path = read_trace(str(path))
    source = str(getattr(path, "source", None) or spec.get("trace_path"))
    block_size = int(resolve_target(target_from_dict(spec["target"])).cache.block_size) \
        if spec.get("target") else int(path.metadata.hash_block_size)
    stats = _trace_stats_apart(path)
    compact = load_compact(path, block_size)
    want = spec.get("trace_fingerprint")
    if want is not None and want != compact.fingerprint and want != str(path.fingerprint()):
        return None, (f"the trace's fingerprint {compact.fingerprint[:12]} differs from the "
                      f"study's {str(want)[:12]}")
    return StudyTrace(path, compact, source, stats), f"trace {source}"


_STATS_CHILD = ("import pickle, sys\n"
                "from tuner.trace import read_trace, trace_stats\n"
                "sys.stdout.buffer.write(pickle.dumps(trace_stats(read_trace(sys.argv[1]))))\n")


def _trace_stats_apart(trace: Any) -> Any:
    """``trace_stats`` in a child Python when the trace is a file.

    Why: its transient arrays (about 0.5 GB on the bundled agentic hour) are freed into
    polars' and Arrow's own allocators, which keep them, so in this process they would
    stay resident under the replays' data and raise the report's peak by that much. A
    plain child interpreter (not multiprocessing: no re-import of a caller's script, no
    fork of polars' thread pool); in-process when the trace is not a file or the child fails.
    """
    import pickle
    import subprocess
    import sys

    from tuner.trace import trace_stats

    source = getattr(trace, "source", None)
    if source is None or not pathlib.Path(str(source)).exists():
        return trace_stats(trace)
    package_root = str(pathlib.Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-c", _STATS_CHILD, str(source)],
                          capture_output=True, env=env)
    if done.returncode != 0:
        return trace_stats(trace)
    return pickle.loads(done.stdout)


def replay_windows(spec: dict[str, Any], trace: StudyTrace,
                   settings: dict[str, SchedulerSettings | dict[str, Any]],
                   *, on_step: Callable[[str], None] | None = None,
                   workers: int | None = None) -> list[WindowReplay]:
    """Replay each ``settings`` (label -> settings) on the training and held-out windows.

    ``spec`` is the study's evaluator spec (``tuner tune`` stores target, backend and
    windows in it). A label's settings are ``SchedulerSettings`` or a study point's
    settings dict, whose deployment (a searched GPU split or router,
    ``tuner.tune.deployment_space``) then replaces the study target's layout for that label.
    ``workers``: processes for the replays (default: the CPUs this process may use, at
    most one per replay); the results do not depend on it.
    """
    from tuner.perf.presets import resolve_target

    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    if workers > 1 and not fork_is_safe():
        workers = 1

    target = target_from_dict(spec["target"])
    backend = spec.get("backend") or "sim"
    router = spec.get("router")  # the study's record form
    base = Deployment.of_target(target, None if router is None else router_settings(router))
    layouts: dict[str, tuple[SchedulerSettings, Deployment]] = {}
    for label, value in settings.items():
        sched, own = (value, None) if isinstance(value, SchedulerSettings) else \
            split_settings(value)
        layouts[label] = (sched, own or base)
    w = spec["windows"]
    windows = Windows(float(w["t0"]), float(w["t_stage1"]), float(w["t_split"]), float(w["t1"]))
    block_size = int(resolve_target(target).cache.block_size)
    requests = trace.requests  # interned at block_size, sliced per window without copies
    assert requests.block_size == block_size, "trace_for_spec loads at the target's block size"
    if backend != "sim":  # backends that want plain hashes get them materialised
        requests = [dataclasses.replace(r, block_hashes=tuple(r.block_hashes.tolist()),
                                        output_block_hashes=tuple(r.output_block_hashes.tolist()))
                    for r in requests]
    arrivals = trace.compact.columns.arrival_s.tolist()

    def window(start: int | None, stop: int | None) -> Any:
        return requests.window(start, stop) if hasattr(requests, "window") else requests[start:stop]

    jobs: list[tuple[str, Any, float | None]] = [
        ("train", window(None, bisect.bisect_left(arrivals, windows.t_split))
         if windows.has_holdout else requests, None)]
    if windows.has_holdout:
        warmup = min((windows.t1 - windows.t_split) * HOLDOUT_WARMUP, windows.t_split - windows.t0)
        jobs.append(("holdout", window(bisect.bisect_left(arrivals, windows.t_split - warmup),
                                       None), windows.t_split))
    # The twin is deterministic: equal settings on one window run once.
    runs: list[tuple[str, str, Any, float | None, SchedulerSettings, Deployment]] = []
    plan: list[tuple[str, str, int]] = []  # (label, window, index into runs)
    for window_name, reqs, lo in jobs:
        first: dict[str, int] = {}
        for label, (s, d) in layouts.items():
            key = repr((s.to_dict(), d.to_dict()))
            if key not in first:
                first[key] = len(runs)
                runs.append((label, window_name, reqs, lo, s, d))
            plan.append((label, window_name, first[key]))
    if on_step is not None:
        on_step(f"replaying {', '.join(f'{r[0]} on the {r[1]} window ({len(r[2]):,} requests)' for r in runs)}"
                f"{f' in {min(workers, len(runs))} processes' if workers > 1 else ''}")
    results = _replay_all([(reqs, s, lo, d.apply(target), d.router)
                           for _, _, reqs, lo, s, d in runs], backend, block_size, workers)
    out: list[WindowReplay] = []
    for label, window_name, i in plan:
        result, summary = results[i]
        out.append(WindowReplay(label, window_name, result, runs[i][3], summary))
    return out


#: (requests, settings, measure_from_s, target, RouterSettings or None), set before forking
_POOL_JOBS: list[tuple[Any, SchedulerSettings, float | None, Any, Any]] = []
_POOL_ARGS: tuple[str, int] = ("sim", 0)


def _replay_one(i: int) -> tuple[ReplayResult, dict[str, Any]]:
    from tuner import metrics, replay

    reqs, settings, lo, target, router = _POOL_JOBS[i]
    backend, block_size = _POOL_ARGS
    extra = {} if router is None else {"router": router}
    result = replay.run(reqs, settings, backend=backend, target=target,
                        hash_block_size=block_size, **extra)
    from tuner.perf.api_server import replay_api_server

    summary = metrics.summarize(result, measure_from_s=lo,  # client-side, as the trials
                                api_server=replay_api_server(target, backend))
    return result, summary.to_dict()


def fork_is_safe() -> bool:
    """Whether this process may fork its replay pool: only while it runs one Python thread.

    Why: ``fork`` copies every lock as it stands but only the calling thread, so a lock
    another thread held at that moment (an I/O thread of a notebook kernel or of a test
    worker, a logging handler) is never released in the child, and the pool's child waits
    on it forever (seen as a report replay stuck in a futex under pytest-xdist). The
    ``tuner report`` command has one Python thread and keeps its pool; an embedding
    process with others replays in-process, which gives the same results.
    """
    import threading

    return threading.active_count() == 1


def _replay_all(jobs: list[tuple[Any, SchedulerSettings, float | None, Any, Any]],
                backend: str, block_size: int, workers: int
                ) -> list[tuple[ReplayResult, dict[str, Any]]]:
    """Each job's replay and summary; in a forked pool when ``workers > 1``.

    Forked, not spawned: the children inherit the interned trace (its id arrays are
    shared copy-on-write, not pickled), as tune's stage-2 pool does. Only the sim backend
    runs in a pool: a live server or a vLLM subprocess is not shared among processes.
    """
    global _POOL_JOBS, _POOL_ARGS
    _POOL_JOBS, _POOL_ARGS = jobs, (backend, block_size)
    try:
        if workers <= 1 or len(jobs) <= 1 or backend != "sim":
            return [_replay_one(i) for i in range(len(jobs))]
        with forked_pool(min(workers, len(jobs))) as pool:
            return pool.map(_replay_one, range(len(jobs)), chunksize=1)
    finally:
        _POOL_JOBS, _POOL_ARGS = [], ("sim", 0)


def binned_series(result: ReplayResult, column: str, *, bins: int = SERIES_BINS,
                  rate: bool = False) -> tuple[list[float], list[float]]:
    """A per-step time-series column averaged into ``bins`` time bins (bin centres).

    ``rate``: sum the column per bin and divide by the bin width (e.g. scheduled tokens
    -> tokens/s); otherwise the mean of the steps in the bin. Empty bins are dropped.
    """
    ts = result.timeseries
    t = np.asarray(ts.get("t_s", []), dtype=np.float64)
    v = np.asarray(ts.get(column, []), dtype=np.float64)
    if t.size == 0 or v.size != t.size:
        return [], []
    t0, t1 = float(t.min()), float(t.max())
    width = (t1 - t0) / bins if t1 > t0 else 1.0
    idx = np.minimum(((t - t0) / width).astype(np.int64), bins - 1)
    total = np.bincount(idx, weights=v, minlength=bins)
    count = np.bincount(idx, minlength=bins)
    keep = count > 0
    centre = t0 + (np.arange(bins) + 0.5) * width
    values = total / width if rate else np.divide(total, np.maximum(count, 1))
    return centre[keep].tolist(), values[keep].tolist()
