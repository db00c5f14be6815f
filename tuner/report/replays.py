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
import pathlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tuner.records import ReplayResult
from tuner.sim.settings import SchedulerSettings
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
    """The study's trace, read and checked: the ``Trace`` (for the trace charts) and its
    requests in arrival order (for the replays), read once."""

    trace: Any
    requests: list[Any]
    hash_block_size: int | None
    source: str


def trace_for_spec(spec: dict[str, Any], trace: Any = None) -> tuple[StudyTrace | None, str]:
    """The study's trace if it can be read and matches the stored fingerprint.

    The fingerprint is :func:`tuner.tune.evaluate.requests_fingerprint` of the requests
    (what ``tuner tune`` stores); studies written before it stored ``Trace.fingerprint()``,
    which is accepted too.

    Returns:
        ``(StudyTrace or None, why)``: ``why`` names the trace or says why it is unusable.
    """
    from tuner import replay
    from tuner.trace import read_trace
    from tuner.tune.evaluate import requests_fingerprint

    path = trace if trace is not None else spec.get("trace_path")
    if path is None:
        return None, "the study does not record a trace path"
    if not hasattr(path, "lazy"):
        if not pathlib.Path(str(path)).exists():
            return None, f"the study's trace {path} is not available here"
        path = read_trace(str(path))
    source = str(getattr(path, "source", None) or spec.get("trace_path"))
    requests, size = replay.load_requests(path)
    want = spec.get("trace_fingerprint")
    got = requests_fingerprint(requests, size)
    if want is not None and want != got and want != str(path.fingerprint()):
        return None, (f"the trace's fingerprint {got[:12]} differs from the study's "
                      f"{str(want)[:12]}")
    return StudyTrace(path, requests, size, source), f"trace {source}"


def replay_windows(spec: dict[str, Any], trace: StudyTrace,
                   settings: dict[str, SchedulerSettings],
                   *, on_step: Callable[[str], None] | None = None) -> list[WindowReplay]:
    """Replay each ``settings`` (label -> settings) on the training and held-out windows.

    ``spec`` is the study's evaluator spec (``tuner tune`` stores target, backend and
    windows in it).
    """
    from tuner import metrics, replay
    from tuner.perf.presets import resolve_target

    target = target_from_dict(spec["target"])
    backend = spec.get("backend") or "sim"
    w = spec["windows"]
    windows = Windows(float(w["t0"]), float(w["t_stage1"]), float(w["t_split"]), float(w["t1"]))
    block_size = int(resolve_target(target).cache.block_size)
    requests, size = trace.requests, trace.hash_block_size
    if size is not None and size != block_size:
        requests = [replay.reblock_request(r, size, block_size) for r in requests]
    arrivals = [r.arrival_s for r in requests]
    jobs: list[tuple[str, list[Any], float | None]] = [
        ("train", requests[:bisect.bisect_left(arrivals, windows.t_split)]
         if windows.has_holdout else requests, None)]
    if windows.has_holdout:
        warmup = min((windows.t1 - windows.t_split) * HOLDOUT_WARMUP, windows.t_split - windows.t0)
        jobs.append(("holdout", requests[bisect.bisect_left(arrivals, windows.t_split - warmup):],
                     windows.t_split))
    out: list[WindowReplay] = []
    for window, reqs, lo in jobs:
        done: dict[str, WindowReplay] = {}  # the twin is deterministic: equal settings, one run
        for label, s in settings.items():
            key = repr(s.to_dict())
            if key in done:
                out.append(dataclasses.replace(done[key], label=label))
                continue
            if on_step is not None:
                on_step(f"replaying {label} on the {window} window ({len(reqs)} requests)")
            result = replay.run(reqs, s, backend=backend, target=target,
                                hash_block_size=block_size)
            summary = metrics.summarize(result, measure_from_s=lo).to_dict()
            done[key] = WindowReplay(label, window, result, lo, summary)
            out.append(done[key])
    return out


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
