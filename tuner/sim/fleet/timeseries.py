"""One deployment-level time series from its engines' own (``merge_timeseries``).

Each engine samples itself at every step: ``t_s``, ``kv_usage``, ``num_running``,
``num_waiting``, ``num_scheduled_tokens``. The deployment's series has one sample per
engine sample, in time order (ties: the lower engine first, then the engine's own
order, as ``heapq.merge`` of ``(t, engine, i)`` gives), where waiting and running are
summed over every engine's latest sample, KV usage is their mean, and scheduled tokens
are that step's own. An engine that has not sampled yet counts ``0.0``: so the queue sums
are floats until every engine has reported and ints after (when the engines' values are
ints), and the records keep those types (their digests read them).

Two ways to the same numbers: ``_merge_heap`` walks the samples one by one, any input;
``_merge_sorted`` does it with array passes (a stable sort and a cumulative count per
engine) for inputs of the shape every engine produces (each ``t_s`` non-decreasing,
times and KV usage floats, counts ints), and takes the heap path otherwise. Why: the
P/D replay merges its two engines' ~64,500 samples on the agentic hour, work its
single-engine replays do not have (issue 26's replay-cost goal, docs/disaggregation.md);
the walk cost ~0.07 s there (profiled 0.9 s, the largest P/D-only function), the array
passes a few ms.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["merge_timeseries"]

_KEYS = ("t_s", "kv_usage", "num_running", "num_waiting", "num_scheduled_tokens")


def merge_timeseries(series: list[dict[str, list[float]]], *,
                     compact: bool = False) -> dict[str, Any]:
    """One deployment-level series from per-engine ones (module doc); a single engine's
    series is returned as it is (copied).

    ``compact``: the merged columns of several engines as ``array('d')`` (8 bytes a
    sample) instead of lists of Python numbers (~40-70 bytes): a fleet samples every
    engine's steps, 1.6 M samples for 8 engines at the per-engine cap. The values are the
    same numbers (the queue sums as floats; the metrics read them as float64 anyway).
    """
    if len(series) == 1:
        return {key: list(values) for key, values in series[0].items()}
    columns = _columns(series)
    if columns is None:
        return _merge_heap(series, compact)
    return _merge_sorted(columns, compact)


def _columns(series: list[dict[str, list[float]]]) -> list[dict[str, np.ndarray]] | None:
    """Each engine's columns as arrays, or None where ``_merge_sorted`` would not give
    exactly ``_merge_heap``'s output: the times and KV usage must be Python floats (an
    array of mixed ints and floats is float64 too, so their types are read), the counts
    ints (an int64 array: a float among them would make it float64), and each engine's
    times non-decreasing and not NaN (``heapq.merge`` of sorted inputs is then a stable
    sort of their concatenation)."""
    if not series:
        return None
    out = []
    for s in series:
        for key in ("t_s", "kv_usage"):
            if s[key] and set(map(type, s[key])) != {float}:
                return None
        arrays = {key: np.asarray(s[key], dtype=np.float64) for key in ("t_s", "kv_usage")}
        for key in ("num_running", "num_waiting", "num_scheduled_tokens"):
            values = np.asarray(s[key]) if s[key] else np.empty(0, dtype=np.int64)
            if values.dtype != np.int64:
                return None
            arrays[key] = values
        t = arrays["t_s"]
        if len(t) and not bool((t[1:] >= t[:-1]).all() and t[0] == t[0]):  # NaN: False
            return None
        out.append(arrays)
    return out


def _merge_sorted(series: list[dict[str, np.ndarray]], compact: bool) -> dict[str, Any]:
    """``_merge_heap``'s output by array passes (the columns ``_columns`` accepted)."""
    n = len(series)
    sizes = [len(s["t_s"]) for s in series]
    total = sum(sizes)
    times = np.concatenate([s["t_s"] for s in series])
    order = np.argsort(times, kind="stable")  # ties: engine order, then the engine's own
    owner = np.repeat(np.arange(n), sizes).take(order)
    kv = np.zeros(total)
    running = np.zeros(total, dtype=np.int64)
    waiting = np.zeros(total, dtype=np.int64)
    everyone = 0  # the first merged sample at which every engine has reported
    for e, s in enumerate(series):
        if not sizes[e]:
            everyone = total  # never reports: its 0.0 stays in every sum
            continue
        mine = owner == e
        everyone = max(everyone, int(mine.argmax()))
        seen = np.cumsum(mine)  # engine e's samples up to each merged one
        latest = np.maximum(seen - 1, 0)
        reported = seen > 0
        # engine by engine, as the walk's ``sum`` adds them (the same float rounding)
        kv += np.where(reported, s["kv_usage"].take(latest), 0.0)
        running += np.where(reported, s["num_running"].take(latest), 0)
        waiting += np.where(reported, s["num_waiting"].take(latest), 0)
    kv /= n
    tokens = np.concatenate([s["num_scheduled_tokens"] for s in series]).take(order)
    merged = {"t_s": times.take(order), "kv_usage": kv}
    if compact:
        out: dict[str, Any] = {key: array("d", values.tobytes()) for key, values in merged.items()}
        for key, values in (("num_running", running), ("num_waiting", waiting),
                            ("num_scheduled_tokens", tokens)):
            out[key] = array("d", values.astype(np.float64).tobytes())
        return out
    out = {key: values.tolist() for key, values in merged.items()}
    for key, values in (("num_running", running), ("num_waiting", waiting)):
        # floats while an engine had not reported (its 0.0 in the sum), ints after
        out[key] = values[:everyone].astype(np.float64).tolist() + values[everyone:].tolist()
    out["num_scheduled_tokens"] = tokens.tolist()
    return out


def _merge_heap(series: list[dict[str, list[float]]], compact: bool) -> dict[str, Any]:
    """The merge sample by sample (any input; ``merge_timeseries``'s reference)."""
    n = len(series)
    kv_latest = [0.0] * n
    running_latest = [0.0] * n
    waiting_latest = [0.0] * n
    out: dict[str, Any] = {k: array("d") if compact else [] for k in _KEYS}

    def samples(e: int) -> Iterable[tuple[float, int, int]]:
        return ((t, e, i) for i, t in enumerate(series[e]["t_s"]))

    for t, e, i in heapq.merge(*(samples(e) for e in range(n))):
        s = series[e]
        kv_latest[e] = s["kv_usage"][i]
        running_latest[e] = s["num_running"][i]
        waiting_latest[e] = s["num_waiting"][i]
        out["t_s"].append(t)
        out["kv_usage"].append(sum(kv_latest) / n)
        out["num_running"].append(sum(running_latest))
        out["num_waiting"].append(sum(waiting_latest))
        out["num_scheduled_tokens"].append(s["num_scheduled_tokens"][i])
    return out
