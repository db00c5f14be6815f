"""The per-object summary (tuner.metrics.summarize before it read record chunks): the
oracle the streamed summary is compared with. A verbatim copy of the functions that read
``result.requests`` as ``RequestResult`` objects; do not edit except to follow a change
of the definitions in docs/metrics.md."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tuner.errors import ConfigError
from tuner.metrics.percentiles import PERCENTS, itl_samples_from_steps, percentile
from tuner.metrics.slo import good_requests
from tuner.metrics.summary import Summary, kv_offload_counters
from tuner.records import EngineSummary, ReplayResult, RequestResult
import dataclasses
import os
from pathlib import Path
from typing import Iterable

from tuner.outputs import AtomicOutput

_NAN = math.nan


class PooledSamples:
    """The pooled-gap percentiles as they read a list of ``(gap, count)`` tuples."""

    def __init__(self, samples: Any) -> None:
        arr = np.asarray(list(samples), dtype=np.float64).reshape(-1, 2)
        keep = arr[:, 1] > 0
        values, counts = arr[keep, 0], arr[keep, 1].astype(np.int64)
        order = np.argsort(values, kind="stable")
        self.values = values[order]
        self.cum = np.cumsum(counts[order])
        self.n = int(self.cum[-1]) if self.cum.size else 0
        self.total = float(np.dot(values, counts)) if self.n else 0.0

    def mean(self) -> float:
        return self.total / self.n if self.n else _NAN

    def percentile(self, q: float) -> float:
        if self.n == 0:
            return _NAN
        h = (self.n - 1) * (q / 100.0)
        lo = int(math.floor(h))
        hi = min(lo + 1, self.n - 1)
        v_lo = self.values[int(np.searchsorted(self.cum, lo, side="right"))]
        v_hi = self.values[int(np.searchsorted(self.cum, hi, side="right"))]
        frac = h - lo
        diff = v_hi - v_lo
        return float(v_hi - diff * (1 - frac)) if frac >= 0.5 else float(v_lo + diff * frac)

def _in_window(t: float, lo: float | None, hi: float | None) -> bool:
    return (lo is None or t >= lo) and (hi is None or t < hi)


def _percentiles(values: np.ndarray, prefix: str) -> dict[str, float]:
    out = {f"{prefix}_p{p}_s": percentile(values, p) for p in PERCENTS}
    return out


def _safe_div(num: float, den: float) -> float:
    return num / den if den > 0 else _NAN


def _itl_pool(result: ReplayResult, counted: list[RequestResult],
              windowed: bool) -> tuple[list[tuple[float, int]], str]:
    """The pooled gaps for ITL percentiles and whether they honour the window."""
    if not windowed:
        return result.itl_samples, "window"
    if result.steps is not None:
        per_request = itl_samples_from_steps(result.steps, counted)
        return [g for gaps in per_request.values() for g in gaps], "window"
    # Without step records the pool cannot be split by request: report it whole and say so.
    return result.itl_samples, "all"


def _step_stats(result: ReplayResult, t0: float, t1: float) -> dict[str, float]:
    """Means and peaks over the steps whose time falls in ``[t0, t1]``."""
    ts = result.timeseries
    t = np.asarray(ts.get("t_s", []), dtype=np.float64)
    mask = (t >= t0) & (t <= t1) if t.size else np.zeros(0, dtype=bool)

    def col(name: str) -> np.ndarray:
        arr = np.asarray(ts.get(name, []), dtype=np.float64)
        return arr[mask] if arr.size == t.size else np.zeros(0)

    kv, waiting, running = col("kv_usage"), col("num_waiting"), col("num_running")
    return {
        "kv_usage_mean": float(kv.mean()) if kv.size else _NAN,
        "kv_usage_peak": float(kv.max()) if kv.size else _NAN,
        "queue_depth_mean": float(waiting.mean()) if waiting.size else _NAN,
        "queue_depth_peak": int(waiting.max()) if waiting.size else 0,
        "num_running_mean": float(running.mean()) if running.size else _NAN,
        "num_steps": int(mask.sum()),
    }


def _load_stats(result: ReplayResult, counted: list[RequestResult]) -> dict[str, Any]:
    """Demand and backlog of the counted requests (why: overload must be said, not hidden).

    ``backlog_end`` counts requests that arrived by the last counted arrival but had not been
    admitted by then; ``queue_growth_per_s`` fits a line to the waiting-queue samples
    between the first and the last counted arrival.
    """
    live = [r for r in counted if r.status != "rejected"]
    if not live:
        return {"arrival_rate": _NAN, "backlog_end": 0, "queue_growth_per_s": _NAN}
    first = min(r.arrival_s for r in live)
    last = max(r.arrival_s for r in live)
    backlog = sum(1 for r in live
                  if not (math.isfinite(r.first_scheduled_s) and r.first_scheduled_s <= last))
    ts = result.timeseries
    t = np.asarray(ts.get("t_s", []), dtype=np.float64)
    waiting = np.asarray(ts.get("num_waiting", []), dtype=np.float64)
    slope = _NAN
    if t.size and waiting.size == t.size:
        mask = (t >= first) & (t <= last)
        if int(mask.sum()) >= 2 and float(np.ptp(t[mask])) > 0:
            slope = _least_squares_slope(t[mask], waiting[mask])
    return {"arrival_rate": _safe_div(len(live) - 1, last - first), "backlog_end": backlog,
            "queue_growth_per_s": slope}


def _least_squares_slope(x: np.ndarray, y: np.ndarray) -> float:
    """The least-squares slope of ``y`` over ``x``, NaN when it is not a finite number.

    Closed form on centred values rather than ``np.polyfit``, which warned on stderr (and
    spoiled ``--json`` output) for arrival times stretched to astronomic values.
    """
    with np.errstate(all="ignore"):
        dx = x - x.mean()
        den = float(np.dot(dx, dx))
        slope = float(np.dot(dx, y - y.mean())) / den if den > 0 else _NAN
    return slope if math.isfinite(slope) else _NAN


def loaded_summarize(result: ReplayResult, *, measure_from_s: float | None = None,
              measure_to_s: float | None = None,
              slo_ms: dict[str, float] | None = None) -> Summary:
    """Summarise a replay, optionally over a measurement window.

    The window excludes warm-up (an empty cache, an empty batch) and drain (the tail
    where the arrival rate falls to zero) from the figures. A request counts when its
    arrival is in ``[measure_from_s, measure_to_s)``; all its tokens count, even those
    produced after ``measure_to_s``. Throughput divides the counted requests' tokens by
    the span from the earliest first admission to the latest finish among them.
    Step-sampled figures (KV usage, queue depth) use the steps inside that span.

    Args:
        result: a backend's output.
        measure_from_s: window start on the replay clock (inclusive); None = no bound.
        measure_to_s: window end (exclusive); None = no bound.
        slo_ms: ``{"ttft": ms, "tpot": ms, "e2el": ms}`` (any subset, :func:`parse_slo`)
            for ``goodput``; None or empty = goodput is nan.

    Raises:
        ConfigError: the window is empty or inverted.
    """
    lo, hi = measure_from_s, measure_to_s
    if lo is not None and hi is not None and hi <= lo:
        raise ConfigError(f"measure window is empty: measure_to_s={hi} <= measure_from_s={lo}")
    windowed = lo is not None or hi is not None
    counted = [r for r in result.requests if _in_window(r.arrival_s, lo, hi)]
    if windowed and not counted and result.requests:
        first = min(r.arrival_s for r in result.requests)
        last = max(r.arrival_s for r in result.requests)
        raise ConfigError(f"no request arrives in the measure window [{lo}, {hi}); "
                          f"arrivals span [{first:.3f}, {last:.3f}] s")
    finished = [r for r in counted if r.status == "finished"]

    ttft = np.array([r.ttft_s for r in counted if math.isfinite(r.first_token_s)])
    tpot = np.array([r.mean_itl_s for r in finished if r.output_len >= 2])
    e2e = np.array([r.finish_s - r.arrival_s for r in finished])
    pool_pairs, itl_scope = _itl_pool(result, counted, windowed)
    pool = PooledSamples(pool_pairs)

    if finished:
        t0 = min(r.first_scheduled_s for r in finished)
        t1 = max(r.finish_s for r in finished)
    else:
        t0 = t1 = _NAN
    span = t1 - t0 if finished else _NAN
    out_tokens = sum(r.output_len for r in finished)
    in_tokens = sum(r.input_len for r in finished)
    gpus = max(int(result.num_gpus), 1)

    if windowed:
        admitted = [r for r in counted if math.isfinite(r.first_scheduled_s)]
        queries = sum(r.input_len for r in admitted)
        hits = sum(r.num_cached_tokens for r in admitted)
        preemptions = sum(r.num_preemptions for r in counted)
    else:
        c = result.counters
        queries = int(c.get("prefix_cache_queries", sum(r.input_len for r in counted)))
        hits = int(c.get("prefix_cache_hits", sum(r.num_cached_tokens for r in counted)))
        preemptions = int(c.get("preemptions", sum(r.num_preemptions for r in counted)))
    steps = _step_stats(result, t0 if windowed else -math.inf, t1 if windowed else math.inf)
    steps["num_steps"] = int(result.counters.get("num_steps", steps["num_steps"]))
    load = _load_stats(result, counted)

    p = {q: percentile(tpot, q) for q in PERCENTS}
    engines = _engine_summaries(result, lo, hi, windowed, queries, hits, preemptions, steps,
                                len(counted), len(finished))
    return Summary(
        backend=result.backend, num_gpus=gpus, measure_from_s=lo, measure_to_s=hi,
        num_requests=len(counted), num_finished=len(finished),
        num_rejected=sum(r.status == "rejected" for r in counted),
        num_unfinished=sum(r.status not in ("finished", "rejected") for r in counted),
        ttft_mean_s=float(ttft.mean()) if ttft.size else _NAN,
        **_percentiles(ttft, "ttft"),
        tpot_mean_s=float(tpot.mean()) if tpot.size else _NAN,
        tpot_p50_s=p[50], tpot_p90_s=p[90], tpot_p99_s=p[99],
        itl_mean_s=pool.mean(),
        itl_p50_s=pool.percentile(50), itl_p90_s=pool.percentile(90),
        itl_p99_s=pool.percentile(99), itl_scope=itl_scope,
        **_percentiles(e2e, "e2e"),
        p50_interactivity=_safe_div(1.0, p[50]), p90_interactivity=_safe_div(1.0, p[90]),
        p99_interactivity=_safe_div(1.0, p[99]),
        span_s=span,
        request_throughput=_safe_div(len(finished), span),
        goodput=_safe_div(good_requests(finished, slo_ms), span) if slo_ms else _NAN,
        output_throughput=_safe_div(out_tokens, span),
        total_throughput=_safe_div(in_tokens + out_tokens, span),
        output_throughput_per_gpu=_safe_div(out_tokens, span) / gpus,
        total_throughput_per_gpu=_safe_div(in_tokens + out_tokens, span) / gpus,
        prefix_cache_queries=queries, prefix_cache_hits=hits,
        prefix_cache_hit_rate=_safe_div(hits, queries),
        preemptions=preemptions,
        **steps, **load,
        simulated_s=float(result.simulated_s), wall_s=float(result.wall_s),
        speed_ratio=_safe_div(result.simulated_s, result.wall_s),
        async_scheduling=result.async_scheduling,
        engines=engines,
        kv_offload=kv_offload_counters(result.counters),
    )


def _engine_summaries(result: ReplayResult, lo: float | None, hi: float | None,
                      windowed: bool, queries: int, hits: int, preemptions: int,
                      steps: dict[str, Any], num_counted: int,
                      num_finished: int) -> tuple[EngineSummary, ...]:
    """Per-engine figures: the backend's ``ReplayResult.engines`` (whole replay), with
    the request-derived ones (requests, hits, preemptions) recounted over the window
    from the table's ``engine`` column; KV usage and steps stay whole-replay. A single
    engine without backend entries gets one entry from the deployment figures."""
    if not result.engines:
        return (EngineSummary(
            engine=0, replica=0, dp_rank=0, num_requests=num_counted,
            num_finished=num_finished, prefix_cache_queries=queries,
            prefix_cache_hits=hits, preemptions=preemptions,
            kv_usage_mean=steps["kv_usage_mean"], kv_usage_max=steps["kv_usage_peak"],
            num_steps=steps["num_steps"]),)
    if not windowed:
        return tuple(result.engines)
    column = getattr(result.requests, "engine", None)
    count = {e.engine: [0, 0, 0, 0, 0] for e in result.engines}
    for i, r in enumerate(result.requests):
        if not _in_window(r.arrival_s, lo, hi) or column is None:
            continue
        acc = count.get(int(column[i]))
        if acc is None:  # refused before routing (-1)
            continue
        acc[0] += 1
        acc[1] += r.status == "finished"
        if math.isfinite(r.first_scheduled_s):
            acc[2] += r.input_len
            acc[3] += r.num_cached_tokens
        acc[4] += r.num_preemptions
    return tuple(dataclasses.replace(
        e, num_requests=c[0], num_finished=c[1], prefix_cache_queries=c[2],
        prefix_cache_hits=c[3], preemptions=c[4])
        for e, c in ((e, count[e.engine]) for e in result.engines))


def loaded_write_requests_parquet(result: ReplayResult, path: str | os.PathLike[str], *,
                           inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Write one row per request (``RequestResult`` fields + engine, ttft_s, mean_itl_s).

    ``engine`` is the engine the request ran on (``replica * dp + dp_rank``, -1 if a
    fleet's front end refused it). Written to a temporary file beside ``path`` and
    renamed, so a crash never leaves a half-written table. File metadata records the
    backend, GPU count, simulated and wall seconds, the counters and the per-engine
    summaries (``engines``, JSON).
    """
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    reqs = result.requests
    cols: dict[str, list[Any]] = {f.name: [getattr(r, f.name) for r in reqs]
                                  for f in dataclasses.fields(RequestResult)}
    engine = getattr(reqs, "engine", None)
    cols["engine"] = list(engine) if engine is not None else [0] * len(reqs)
    cols["ttft_s"] = [r.ttft_s for r in reqs]
    cols["mean_itl_s"] = [r.mean_itl_s for r in reqs]
    schema = pa.schema([
        ("request_id", pa.string()), ("arrival_s", pa.float64()), ("input_len", pa.int32()),
        ("output_len", pa.int32()), ("first_scheduled_s", pa.float64()),
        ("first_token_s", pa.float64()), ("finish_s", pa.float64()),
        ("num_cached_tokens", pa.int32()), ("num_preemptions", pa.int32()),
        ("status", pa.string()), ("session_id", pa.string()), ("engine", pa.int32()),
        ("ttft_s", pa.float64()), ("mean_itl_s", pa.float64()),
    ])
    meta = {"backend": result.backend, "num_gpus": str(result.num_gpus),
            "simulated_s": repr(result.simulated_s), "wall_s": repr(result.wall_s),
            "counters": json.dumps(result.counters), "notes": json.dumps(result.notes),
            "async_scheduling": json.dumps(result.async_scheduling),
            "engines": json.dumps([e.to_dict() for e in result.engines])}
    table = pa.table({name: cols[name] for name in schema.names}, schema=schema)
    table = table.replace_schema_metadata({k.encode(): v.encode() for k, v in meta.items()})
    with AtomicOutput(path, inputs=inputs) as out:
        pq.write_table(table, out.tmp_path, compression="zstd")
    return out.path
