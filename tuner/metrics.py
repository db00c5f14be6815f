"""Replay metrics: one ``Summary`` from a backend's ``ReplayResult``.

Every backend (the twin, vLLM's own ``Scheduler``, a live server) hands over the same
records (``tuner.records``), so every backend is measured by the same code. The
definitions follow vLLM's own metrics and the SemiAnalysis InferenceX/AgentX pipelines;
docs/metrics.md states each one with its formula. In short:

* percentiles over requests (TTFT, TPOT, E2E, per-request mean ITL) are numpy's
  ``linear`` percentiles of the per-request values;
* ITL percentiles pool every inter-token gap of every counted request, as
  ``vllm bench serve`` does; the pooled ``(gap_s, count)`` pairs give the *exact* value
  numpy's ``linear`` method would give on the expanded list (:func:`weighted_percentile`);
* ``pXX_interactivity = 1 / pXX over requests of the per-request mean ITL`` (AgentX:
  ``p90_intvty = 1 / p90_itl``), so p90 interactivity is the speed the slowest 10% of
  users get;
* throughput per GPU divides by ``ReplayResult.num_gpus`` (tp * dp * replicas: every GPU
  of the deployment);
* ``engines``: one :class:`~tuner.records.EngineSummary` per engine (a DP rank of a
  replica), the balance behind the deployment's figures.

This module reads records only, never backend or twin objects.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from tuner.errors import ConfigError
from tuner.outputs import AtomicOutput
from tuner.records import EngineSummary, ReplayResult, RequestResult, StepRecord
from tuner.units import duration

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "PooledSamples",
    "SLO_KEYS",
    "Summary",
    "good_requests",
    "itl_samples_from_steps",
    "parse_slo",
    "rejection_warning",
    "kv_capacity_tokens",
    "summarize",
    "engine_table",
    "summary_table",
    "weighted_percentile",
    "write_requests_parquet",
]

_NAN = float("nan")
#: Quantiles reported for every latency distribution (percent).
PERCENTS = (50, 90, 99)


# --------------------------------------------------------------------------- percentiles


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """numpy ``linear`` percentile ``q`` (0-100) of ``values``; nan when empty."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return _NAN
    return float(np.percentile(arr, q, method="linear"))


class PooledSamples:
    """A multiset of values given as ``(value, count)`` pairs, sorted once for percentiles.

    A replay of a busy hour has hundreds of millions of token gaps but only one pair per
    step; sorting the pairs once serves every percentile and the mean.
    """

    __slots__ = ("values", "cum", "n", "total")

    def __init__(self, samples: Iterable[tuple[float, int]]) -> None:
        arr = np.asarray(list(samples), dtype=np.float64).reshape(-1, 2)
        keep = arr[:, 1] > 0
        values, counts = arr[keep, 0], arr[keep, 1].astype(np.int64)
        order = np.argsort(values, kind="stable")
        self.values = values[order]
        self.cum = np.cumsum(counts[order])  # cum[i] - 1 = highest rank held by values[i]
        self.n = int(self.cum[-1]) if self.cum.size else 0
        self.total = float(np.dot(values, counts)) if self.n else 0.0

    def mean(self) -> float:
        return self.total / self.n if self.n else _NAN

    def percentile(self, q: float) -> float:
        """Exactly ``np.percentile(np.repeat(values, counts), q, method="linear")``.

        numpy's linear method reads rank ``h = (N - 1) * q / 100`` of the N sorted samples
        and interpolates between ranks ``floor(h)`` and ``floor(h) + 1``; the value at a
        rank is found by a binary search on the cumulative counts.
        """
        if self.n == 0:
            return _NAN
        h = (self.n - 1) * (q / 100.0)
        lo = int(math.floor(h))
        hi = min(lo + 1, self.n - 1)
        v_lo = self.values[int(np.searchsorted(self.cum, lo, side="right"))]
        v_hi = self.values[int(np.searchsorted(self.cum, hi, side="right"))]
        frac = h - lo
        # numpy's _lerp: a + (b - a) * t, switching to b - (b - a) * (1 - t) for t >= 0.5
        diff = v_hi - v_lo
        return float(v_hi - diff * (1 - frac)) if frac >= 0.5 else float(v_lo + diff * frac)


def weighted_percentile(samples: Iterable[tuple[float, int]], q: float) -> float:
    """Exact numpy-``linear`` percentile ``q`` (0-100) of ``(value, count)`` pairs.

    Equal to ``np.percentile(np.repeat(values, counts), q)`` without materialising one
    float per token; counts <= 0 are ignored; nan when there are no samples.
    """
    return PooledSamples(samples).percentile(q)


def itl_samples_from_steps(
    steps: Sequence[StepRecord], requests: Sequence[RequestResult]
) -> dict[str, list[tuple[float, int]]]:
    """Per-request inter-token gaps rebuilt from per-step records.

    Used when a measurement window must restrict the pooled ITL to some requests: the
    pooled ``ReplayResult.itl_samples`` carry no request ids. Token production follows
    vLLM's model (``NOTE(woosuk)`` in ``schedule()``): a request's computed tokens catch
    up with its token count (prompt + generated so far); a step after which they have
    caught up emits one token at the step's end. An admission starts computed tokens at
    its prefix-cache hit (``StepRecord.cached_tokens``); a preemption resets them to 0
    (recompute), so the next emission waits for the whole sequence again.

    Returns:
        request id -> list of ``(gap_s, 1)`` pairs in emission order.
    """
    prompt = {r.request_id: r.input_len for r in requests}
    computed: dict[str, int] = {}
    generated: dict[str, int] = {}
    last_emit: dict[str, float] = {}
    gaps: dict[str, list[tuple[float, int]]] = {rid: [] for rid in prompt}
    for step in steps:
        for rid in step.preempted:
            computed[rid] = 0
        for rid, hit in step.cached_tokens.items():  # (re-)admitted this step
            computed[rid] = hit
        end_s = step.start_s + step.duration_s
        for rid, num_new in step.num_scheduled_tokens.items():
            if rid not in prompt:
                continue
            done = computed.get(rid, 0) + num_new
            computed[rid] = done
            if done >= prompt[rid] + generated.get(rid, 0):
                generated[rid] = generated.get(rid, 0) + 1
                if rid in last_emit:
                    gaps[rid].append((end_s - last_emit[rid], 1))
                last_emit[rid] = end_s
    return gaps


# --------------------------------------------------------------------------- summary


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

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready apart from nan, which the CLI writes as null)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["engines"] = [e.to_dict() for e in self.engines]
        return out


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
            slope = float(np.polyfit(t[mask], waiting[mask], 1)[0])
    return {"arrival_rate": _safe_div(len(live) - 1, last - first), "backlog_end": backlog,
            "queue_growth_per_s": slope}


#: SLO keys of ``vllm bench serve --goodput`` (values in milliseconds).
SLO_KEYS = ("ttft", "tpot", "e2el")


def parse_slo(text: "str | dict[str, float] | None") -> dict[str, float]:
    """``"ttft:2000,tpot:50"`` (or ``vllm bench serve``'s space-separated form) -> ms by key.

    Raises:
        ConfigError: an unknown key, a missing or negative value, a key given twice.
    """
    if text is None:
        return {}
    if isinstance(text, dict):
        items = [(str(k), v) for k, v in text.items()]
    else:
        items = []
        for part in str(text).replace(",", " ").split():
            key, sep, value = part.partition(":")
            if not sep:
                raise ConfigError(f"SLO {part!r}: write KEY:MILLISECONDS, e.g. ttft:2000")
            items.append((key.strip(), value.strip()))
    out: dict[str, float] = {}
    for key, value in items:
        if key not in SLO_KEYS:
            raise ConfigError(f"SLO {key!r}: use {', '.join(SLO_KEYS)} (as vllm bench serve "
                              "--goodput)")
        if key in out:
            raise ConfigError(f"SLO {key!r} given twice")
        try:
            ms = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"SLO {key}:{value}: {value!r} is not a number of "
                              "milliseconds") from None
        if not (math.isfinite(ms) and ms >= 0):
            raise ConfigError(f"SLO {key}:{value}: must be a number of milliseconds >= 0")
        out[key] = ms
    return out


def good_requests(requests: Sequence[RequestResult], slo_ms: dict[str, float]) -> int:
    """Finished requests meeting every SLO, as ``vllm bench serve --goodput`` counts them:
    TTFT and E2E latency from arrival, TPOT = (E2E - TTFT) / (output tokens - 1), taken as
    0 for a one-token output; a request is good when each value <= its SLO."""
    good = 0
    for r in requests:
        if r.status != "finished":
            continue
        ttft = r.first_token_s - r.arrival_s
        e2el = r.finish_s - r.arrival_s
        tpot = (e2el - ttft) / (r.output_len - 1) if r.output_len > 1 else 0.0
        values = {"ttft": ttft, "tpot": tpot, "e2el": e2el}
        if all(values[k] * 1e3 <= bound for k, bound in slo_ms.items()):
            good += 1
    return good


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


# --------------------------------------------------------------------------- outputs


def write_requests_parquet(result: ReplayResult, path: str | os.PathLike[str], *,
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


def _fmt(value: float, unit: str = "", scale: float = 1.0, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value * scale:,.{digits}f}{unit}"


def summary_table(summary: Summary) -> "Table":
    """A rich table of the headline metrics (what ``tuner replay`` prints)."""
    from rich.table import Table

    s = summary
    window = ("all requests" if s.measure_from_s is None and s.measure_to_s is None
              else f"arrivals in [{s.measure_from_s or 0:g}, "
                   f"{'end' if s.measure_to_s is None else f'{s.measure_to_s:g}'}) s")
    mode = {True: "async scheduling", False: "no async scheduling"}.get(
        s.async_scheduling, "scheduling mode unknown")
    latency = Table(title=f"Replay summary ({s.backend}, {s.num_gpus} GPU, {mode}, {window})",
                    header_style="bold")
    latency.add_column("latency")
    for p in PERCENTS:
        latency.add_column(f"p{p}", justify="right")
    # Each latency with its own unit (ms below a second, s above): "17.4 s", not
    # "17,357.53 ms".
    latency.add_row("TTFT", *(duration(getattr(s, f"ttft_p{p}_s")) for p in PERCENTS))
    latency.add_row("TPOT", *(duration(getattr(s, f"tpot_p{p}_s")) for p in PERCENTS))
    itl_label = "ITL" if s.itl_scope == "window" else "ITL (whole replay)"
    latency.add_row(itl_label, *(duration(getattr(s, f"itl_p{p}_s")) for p in PERCENTS))
    latency.add_row("E2E latency", *(duration(getattr(s, f"e2e_p{p}_s")) for p in PERCENTS))
    latency.add_row("interactivity (tok/s/user)",
                    *(_fmt(getattr(s, f"p{p}_interactivity"), digits=1) for p in PERCENTS))
    totals = Table(header_style="bold")
    totals.add_column("throughput, cache and state")
    totals.add_column("value", justify="right")
    rows = [
        ("async_scheduling", "-" if s.async_scheduling is None
         else str(s.async_scheduling).lower()),
        ("output throughput (tok/s/GPU)", _fmt(s.output_throughput_per_gpu, digits=1)),
        ("total throughput, input+output (tok/s/GPU)", _fmt(s.total_throughput_per_gpu, digits=1)),
        ("request throughput (req/s)", _fmt(s.request_throughput, digits=3)),
        ("prefix-cache hit rate", _fmt(s.prefix_cache_hit_rate, digits=4)),
        ("preemptions", f"{s.preemptions:,}"),
        ("KV usage mean / peak", f"{_fmt(s.kv_usage_mean, digits=3)} / {_fmt(s.kv_usage_peak, digits=3)}"),
        ("queue depth mean / peak", f"{_fmt(s.queue_depth_mean, digits=1)} / {s.queue_depth_peak}"),
        ("requests counted / finished / rejected / unfinished",
         f"{s.num_requests:,} / {s.num_finished:,} / {s.num_rejected:,} / {s.num_unfinished:,}"),
        ("simulated / wall (s)", f"{_fmt(s.simulated_s, digits=1)} / {_fmt(s.wall_s, digits=2)}"),
        ("speed (simulated s per wall s)", _fmt(s.speed_ratio, "x", digits=0)),
    ]
    for name, value in rows:
        totals.add_row(name, value)
    table = Table.grid(padding=(1, 0))
    table.add_row(latency)
    table.add_row(totals)
    return table


def engine_table(summary: Summary) -> "Table":
    """A rich table of the per-engine balance (what ``tuner replay`` prints for a
    data-parallel deployment or a fleet)."""
    from rich.table import Table

    table = Table(title="Per engine (replica x DP rank)", header_style="bold")
    for name in ("engine", "replica", "rank", "requests", "finished", "hit rate",
                 "KV mean / max", "preemptions", "steps", "dummy steps"):
        table.add_column(name, justify="right")
    for e in summary.engines:
        table.add_row(str(e.engine), str(e.replica), str(e.dp_rank), f"{e.num_requests:,}",
                      f"{e.num_finished:,}", _fmt(e.prefix_cache_hit_rate, digits=4),
                      f"{_fmt(e.kv_usage_mean, digits=3)} / {_fmt(e.kv_usage_max, digits=3)}",
                      f"{e.preemptions:,}", f"{e.num_steps:,}", f"{e.num_dummy_steps:,}")
    return table
