"""``Summary``: the headline metrics of one replay, and :func:`summarize`, which computes them.

The definitions are in docs/metrics.md; the package docstring (:mod:`tuner.metrics`)
states them in short. Reads records only, never backend or twin objects.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.errors import ConfigError
from tuner.metrics.band_fields import likely_dict
from tuner.metrics.percentiles import PERCENTS, PooledSamples, itl_samples_from_steps, percentile
from tuner.metrics.record_columns import record_chunks
from tuner.metrics.request_stats import RequestStats
from tuner.perf.fit.bands import PredictionBands
from tuner.records import EngineSummary, ReplayResult

if TYPE_CHECKING:
    from tuner.perf.api_server import ApiServerCost

_NAN = math.nan


@dataclass(frozen=True, slots=True)
class Summary:
    """Headline metrics of one replay (all times in seconds, rates per second).

    Latency fields cover the requests counted by the measurement window (arrival in
    ``[measure_from_s, measure_to_s)``); see docs/metrics.md for every definition.
    """

    backend: str
    num_gpus: int
    measure_from_s: float | None  # window start (arrival time), None = from the first request
    measure_to_s: float | None  # window end (exclusive), None = to the last request
    num_requests: int  # requests whose arrival is in the window
    num_finished: int  # ... that produced all their tokens
    num_rejected: int  # ... refused by the engine (e.g. longer than max_model_len)
    num_unfinished: int  # ... still running or waiting when the replay ended (or aborted/error)
    # Latency percentiles (numpy 'linear' over requests; ITL pooled and weighted).
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_mean_s: float  # per request (finish - first token) / (output tokens - 1)
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    itl_mean_s: float  # over all pooled gaps
    itl_p50_s: float
    itl_p90_s: float
    itl_p99_s: float
    itl_scope: str  # "window" or "all" (pooled gaps of the whole replay; see docs/metrics.md)
    e2e_p50_s: float  # arrival -> last token
    e2e_p90_s: float
    e2e_p99_s: float
    # Interactivity: 1 / pXX over requests of the per-request mean ITL (tokens/s/user).
    p50_interactivity: float
    p90_interactivity: float  # AgentX definition: the speed the slowest 10% of users get
    p99_interactivity: float
    # Throughput over the span of token production of the counted requests.
    span_s: float  # earliest first admission -> latest finish of finished counted requests
    request_throughput: float  # finished requests / span_s
    goodput: float  # finished requests meeting every SLO / span_s (nan: no SLO given)
    output_throughput: float  # output tokens / span_s (whole deployment)
    total_throughput: float  # (input + output) tokens / span_s (whole deployment)
    output_throughput_per_gpu: float  # output tokens / span_s / num_gpus
    total_throughput_per_gpu: float  # (input + output) tokens / span_s / num_gpus
    # Cache and scheduler state.
    prefix_cache_queries: int  # prompt tokens queried at first admission (vLLM counter)
    prefix_cache_hits: int  # of which found in the local prefix cache
    prefix_cache_hit_rate: float  # hits / queries, in [0, 1]
    preemptions: int
    kv_usage_mean: float  # mean over executed steps of KV usage (vLLM definition), [0, 1]
    kv_usage_peak: float
    queue_depth_mean: float  # mean over executed steps of waiting requests
    queue_depth_peak: int
    num_running_mean: float  # mean over executed steps of running requests
    # Load against capacity (overload detection; see docs/metrics.md "Overload").
    arrival_rate: float  # counted requests / span of their arrivals (req/s)
    backlog_end: int  # counted requests not yet admitted when the last of them arrived
    queue_growth_per_s: float  # least-squares slope of waiting requests over the arrivals
    num_steps: int  # executed steps of the whole replay (backend counter; else samples)
    # Replay cost.
    simulated_s: float  # replay-clock span of the whole replay
    wall_s: float  # wall time of the backend's run() (the replay itself, not trace loading)
    speed_ratio: float  # simulated_s / wall_s (simulated seconds per wall second)
    #: the engine's scheduling mode (vLLM's resolved ``async_scheduling``; None: unknown)
    async_scheduling: bool | None = None
    #: Per engine (replica x DP rank), in engine order: requests, hit rate, KV usage,
    #: preemptions, steps (see ``EngineSummary``; windowed like the request figures).
    engines: tuple[EngineSummary, ...] = ()
    #: How sure the figures are (:func:`tuner.metrics.bands.with_bands`); None until a
    #: caller that knows the deployment attaches them. Reporting only.
    bands: PredictionBands | None = None
    #: The CPU KV tier's counters (``kv_offload_*`` of the replay, docs/kv-offloading.md)
    #: with ``cpu_hit_rate`` and ``combined_hit_rate`` over ``prefix_cache_queries``;
    #: None without a tier. Whole replay (not windowed).
    kv_offload: dict[str, float] | None = None
    #: The API server in front of the engine (``summarize(..., api_server=...)``,
    #: :func:`api_server_block`): processes, utilisation per process, queue wait, the
    #: stretch above saturation and the engine's own TTFT; None: left out (the figures
    #: above are then the engine's own). With it, TTFT, TPOT, ITL, E2E, goodput and the
    #: throughputs are client-side.
    api_server: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready apart from nan, which the CLI writes as null); ``bands``
        (with ``likely``: each banded field's ``[low, high]``) only when attached."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["engines"] = [e.to_dict() for e in self.engines]
        del out["bands"]
        if self.bands is not None:
            out["bands"] = {**self.bands.to_dict(), "likely": likely_dict(self.bands, self)}
        return out


def _in_window(t: float, lo: float | None, hi: float | None) -> bool:
    return (lo is None or t >= lo) and (hi is None or t < hi)


def _percentiles(values: np.ndarray, prefix: str) -> dict[str, float]:
    out = {f"{prefix}_p{p}_s": percentile(values, p) for p in PERCENTS}
    return out


def _safe_div(num: float, den: float) -> float:
    return num / den if den > 0 else _NAN


def _itl_pool(result: ReplayResult, lo: float | None, hi: float | None,
              windowed: bool) -> tuple[Any, str]:
    """The pooled gaps for ITL percentiles and whether they honour the window."""
    if not windowed:
        return result.itl_samples, "window"
    if result.steps is not None:  # step records: small replays (record_steps)
        counted = [r for r in result.requests if _in_window(r.arrival_s, lo, hi)]
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


def _load_stats(result: ReplayResult, stats: RequestStats) -> dict[str, Any]:
    """Demand and backlog of the counted requests (why: overload must be said, not hidden).

    ``backlog_end`` counts requests that arrived by the last counted arrival but had not been
    admitted by then; ``queue_growth_per_s`` fits a line to the waiting-queue samples
    between the first and the last counted arrival.
    """
    if not stats.num_live:
        return {"arrival_rate": _NAN, "backlog_end": 0, "queue_growth_per_s": _NAN}
    first, last = stats.first_live, stats.last_live
    ts = result.timeseries
    t = np.asarray(ts.get("t_s", []), dtype=np.float64)
    waiting = np.asarray(ts.get("num_waiting", []), dtype=np.float64)
    slope = _NAN
    if t.size and waiting.size == t.size:
        mask = (t >= first) & (t <= last)
        if int(mask.sum()) >= 2 and float(np.ptp(t[mask])) > 0:
            slope = _least_squares_slope(t[mask], waiting[mask])
    return {"arrival_rate": _safe_div(stats.num_live - 1, last - first),
            "backlog_end": stats.backlog, "queue_growth_per_s": slope}


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


#: Rejected share of the requests above which a replay's summary warns.
REJECTED_WARN_FRACTION = 0.01


def rejection_warning(metrics: dict[str, Any], max_model_len: int | None = None, *,
                      kv_capacity_tokens: int | None = None) -> str | None:
    """A warning when more than 1 % of the requests are rejected (e.g. too long): the
    metrics silently cover only the rest otherwise.

    It names the limit that binds: a KV cache smaller than ``max_model_len`` (``--num-gpu-
    blocks 2`` holds 16 tokens) rejects every longer request, and blaming
    ``--max-model-len`` then sent the user to the wrong flag.
    """
    n = metrics.get("num_requests") or 0
    rejected = metrics.get("num_rejected") or 0
    if not n or rejected <= REJECTED_WARN_FRACTION * n:
        return None
    if kv_capacity_tokens is not None and (max_model_len is None
                                           or kv_capacity_tokens < max_model_len):
        limit = (f" (longer than the KV cache holds: {kv_capacity_tokens:,} tokens)",
                 "Raise --num-gpu-blocks (or --gpu-memory-utilization) if the deployment "
                 "serves them")
    else:
        limit = (f" (longer than max_model_len={max_model_len:,})" if max_model_len else "",
                 "Raise --max-model-len if the deployment serves them")
    every = "every request is" if rejected >= n else (
        f"{int(rejected):,} of {int(n):,} requests ({rejected / n:.0%}) are")
    rest = ("there is nothing to measure" if rejected >= n
            else "the metrics cover only the rest")
    return f"WARNING: {every} rejected{limit[0]} under every setting; {rest}. {limit[1]}"


def kv_capacity_tokens(cache: Any) -> int:
    """Tokens the longest request may reach in ``cache``: vLLM keeps one block back."""
    return max(0, (int(cache.num_gpu_blocks) - 1) * int(cache.block_size))


def summarize(result: ReplayResult, *, measure_from_s: float | None = None,
              measure_to_s: float | None = None,
              slo_ms: dict[str, float] | None = None,
              api_server: "ApiServerCost | None" = None) -> Summary:
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
        api_server: vLLM's API server in front of the engine
            (``tuner.perf.api_server.api_server_cost``): the latency and throughput
            figures become the client's (the engine's records stay as replayed) and
            ``Summary.api_server`` says how loaded it was; None = the engine's figures.

    Raises:
        ConfigError: the window is empty or inverted.
    """
    lo, hi = measure_from_s, measure_to_s
    if lo is not None and hi is not None and hi <= lo:
        raise ConfigError(f"measure window is empty: measure_to_s={hi} <= measure_from_s={lo}")
    windowed = lo is not None or hi is not None
    stats = RequestStats(lo, hi, slo_ms=slo_ms,
                         engines=[e.engine for e in result.engines] if windowed else ())
    for chunk in record_chunks(result.requests):
        stats.add(chunk)
    if windowed and not stats.num_counted and stats.num_records:
        raise ConfigError(f"no request arrives in the measure window [{lo}, {hi}); "
                          f"arrivals span [{stats.arrival_min:.3f}, "
                          f"{stats.arrival_max:.3f}] s")
    server: dict[str, float] | None = None
    stretch = 1.0
    if api_server is not None and stats.num_finished:
        stats, server = _client_stats(result, stats, api_server, slo_ms, windowed)
        stretch = server["stretch"]
    num_finished = stats.num_finished
    ttft, tpot, e2e = stats.ttft, stats.tpot, stats.e2e
    pool_pairs, itl_scope = _itl_pool(result, lo, hi, windowed)
    if stretch > 1.0:  # a saturated server spaces the tokens out by its own pace
        pool_pairs = [(g * stretch, c) for g, c in pool_pairs]
    pool = PooledSamples(pool_pairs)

    if num_finished:
        t0, t1 = stats.t0, stats.t1
    else:
        t0 = t1 = _NAN
    span = t1 - t0 if num_finished else _NAN
    out_tokens, in_tokens = stats.out_tokens, stats.in_tokens
    gpus = max(int(result.num_gpus), 1)

    if windowed:
        queries, hits, preemptions = stats.queries, stats.hits, stats.preemptions
    else:
        c = result.counters
        queries = int(c.get("prefix_cache_queries", stats.queries))
        hits = int(c.get("prefix_cache_hits", stats.hits))
        preemptions = int(c.get("preemptions", stats.preemptions))
    steps = _step_stats(result, t0 if windowed else -math.inf, t1 if windowed else math.inf)
    steps["num_steps"] = int(result.counters.get("num_steps", steps["num_steps"]))
    load = _load_stats(result, stats)

    p = {q: percentile(tpot, q) for q in PERCENTS}
    engines = _engine_summaries(result, stats, windowed, queries, hits, preemptions, steps)
    return Summary(
        backend=result.backend, num_gpus=gpus, measure_from_s=lo, measure_to_s=hi,
        num_requests=stats.num_counted, num_finished=num_finished,
        num_rejected=stats.num_rejected,
        num_unfinished=stats.num_counted - num_finished - stats.num_rejected,
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
        request_throughput=_safe_div(num_finished, span),
        goodput=_safe_div(stats.num_good, span) if slo_ms else _NAN,
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
        api_server=server,
    )


def _client_stats(result: ReplayResult, engine: RequestStats, cost: "ApiServerCost",
                  slo_ms: dict[str, float] | None, windowed: bool
                  ) -> tuple[RequestStats, dict[str, float]]:
    """The request figures as the client sees them through the API server, and the
    server's block of the summary.

    The server's load is the counted requests' work (intake of every live one, the tokens
    of the finished ones) over the span from their first arrival to the last finish, with
    one output batch per engine step in that span (``tuner.perf.api_server.server_load``,
    the benchmark fit's model); the records are then read a second time through the
    :class:`~tuner.perf.api_server.ClientClock` it implies.
    """
    from tuner.perf.api_server import ClientClock, server_load_totals

    start = min(engine.first_live, engine.t0)
    span = engine.t1 - start
    steps = _step_stats(result, start, engine.t1)["num_steps"] if windowed else int(
        result.counters.get("num_steps", 0))
    load = server_load_totals(cost, engine.num_live, engine.in_tokens, engine.out_tokens,
                              span, steps)
    client = RequestStats(engine.lo, engine.hi, slo_ms=slo_ms,
                          engines=engine.per_engine.keys(),
                          client=ClientClock(cost, load, start))
    for chunk in record_chunks(result.requests):
        client.add(chunk)
    e_ttft, c_ttft = engine.ttft, client.ttft
    added = c_ttft - e_ttft if c_ttft.size == e_ttft.size else np.zeros(0)
    block = {
        "servers": cost.servers,  # processes (--api-server-count x replicas)
        "utilisation": load.utilisation,  # CPU s per s of one process (rho; > 1: saturated)
        "wait_s": load.wait_s,  # mean queueing delay of one item (M/D/1)
        "stretch": load.stretch,  # client span / engine span (rho above 1, else 1)
        "intake_mean_s": cost.request_s + cost.prompt_token_s * _safe_div(
            engine.in_tokens, engine.num_finished),  # parse + tokenise, finished requests
        # TTFT the server adds (client - engine), mean and p90 over requests: the intake
        # queue (a burst waits for the tokeniser), the way out and the stretch
        "added_ttft_mean_s": float(added.mean()) if added.size else _NAN,
        "added_ttft_p90_s": percentile(added, 90),
        "work_s": load.utilisation * span,  # CPU seconds of one process over the span
        "engine_ttft_mean_s": float(e_ttft.mean()) if e_ttft.size else _NAN,
        "engine_ttft_p90_s": percentile(e_ttft, 90),
        "request_s": cost.request_s, "prompt_token_s": cost.prompt_token_s,
        "output_token_s": cost.output_token_s,
    }
    return client, block


def kv_offload_counters(counters: dict[str, float]) -> dict[str, float] | None:
    """The tier's counters without their prefix, plus its hit rates (None: no tier)."""
    if "kv_offload_loads" not in counters:
        return None
    out = {k[len("kv_offload_"):]: v for k, v in counters.items() if k.startswith("kv_offload_")}
    queries = counters.get("prefix_cache_queries", 0)
    gpu = counters.get("prefix_cache_hits", 0)
    out["cpu_hit_rate"] = _safe_div(out["external_hits"], queries)
    out["combined_hit_rate"] = _safe_div(gpu + out["external_hits"], queries)
    return out


def _engine_summaries(result: ReplayResult, stats: RequestStats, windowed: bool,
                      queries: int, hits: int, preemptions: int,
                      steps: dict[str, Any]) -> tuple[EngineSummary, ...]:
    """Per-engine figures: the backend's ``ReplayResult.engines`` (whole replay), with
    the request-derived ones (requests, hits, preemptions) recounted over the window
    from the table's ``engine`` column; KV usage and steps stay whole-replay. A single
    engine without backend entries gets one entry from the deployment figures."""
    if not result.engines:
        return (EngineSummary(
            engine=0, replica=0, dp_rank=0, num_requests=stats.num_counted,
            num_finished=stats.num_finished, prefix_cache_queries=queries,
            prefix_cache_hits=hits, preemptions=preemptions,
            kv_usage_mean=steps["kv_usage_mean"], kv_usage_max=steps["kv_usage_peak"],
            num_steps=steps["num_steps"]),)
    if not windowed:
        return tuple(result.engines)
    if getattr(result.requests, "engine", None) is None:  # no column: nothing recounted
        count = {e.engine: [0, 0, 0, 0, 0] for e in result.engines}
    else:
        count = stats.per_engine
    return tuple(dataclasses.replace(
        e, num_requests=c[0], num_finished=c[1], prefix_cache_queries=c[2],
        prefix_cache_hits=c[3], preemptions=c[4])
        for e, c in ((e, count[e.engine]) for e in result.engines))
