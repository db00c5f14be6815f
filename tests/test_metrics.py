"""tuner.metrics on hand-built ReplayResults (values computed by hand in comments)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.errors import ConfigError
from tuner.metrics import (
    itl_samples_from_steps,
    summarize,
    summary_table,
    weighted_percentile,
    write_requests_parquet,
)
from tuner.records import ReplayResult, RequestResult, StepRecord


def req(rid: str, arrival: float, first_token: float, finish: float, out: int, *,
        inp: int = 100, cached: int = 0, sched: float | None = None, preempt: int = 0,
        status: str = "finished") -> RequestResult:
    return RequestResult(
        request_id=rid, arrival_s=arrival, input_len=inp, output_len=out,
        first_scheduled_s=arrival if sched is None else sched, first_token_s=first_token,
        finish_s=finish, num_cached_tokens=cached, num_preemptions=preempt, status=status)


def result(requests, *, itl=(), counters=None, timeseries=None, num_gpus=1,
           simulated_s=100.0, wall_s=0.5, steps=None) -> ReplayResult:
    return ReplayResult(
        backend="hand", requests=list(requests), itl_samples=list(itl),
        timeseries=timeseries or {}, counters=counters or {}, simulated_s=simulated_s,
        wall_s=wall_s, num_gpus=num_gpus, steps=steps)


# ----------------------------------------------------------------- weighted percentiles


def test_weighted_percentile_hand_values():
    # expanded: [1, 1, 1, 2, 10]; n=5; p50 -> rank 2 -> 1; p90 -> rank 3.6 -> 2 + 0.6*8 = 6.8
    samples = [(10.0, 1), (1.0, 3), (2.0, 1)]
    assert weighted_percentile(samples, 50) == 1.0
    assert weighted_percentile(samples, 90) == pytest.approx(6.8)
    assert weighted_percentile(samples, 0) == 1.0
    assert weighted_percentile(samples, 100) == 10.0
    assert math.isnan(weighted_percentile([], 50))
    assert math.isnan(weighted_percentile([(1.0, 0)], 50))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10, allow_nan=False), st.integers(0, 6)), min_size=1,
                max_size=20),
       st.sampled_from([0, 1, 10, 25, 50, 75, 90, 99, 99.9, 100]))
def test_weighted_percentile_equals_numpy_on_expanded(samples, q):
    expanded = np.repeat([v for v, _ in samples], [c for _, c in samples])
    got = weighted_percentile(samples, q)
    if expanded.size == 0:
        assert math.isnan(got)
    else:
        assert got == float(np.percentile(expanded, q, method="linear"))


# ----------------------------------------------------------------- summary definitions


def three_requests() -> ReplayResult:
    # TTFTs: 1, 2, 4.  Mean ITLs: (11-1)/10 = 1.0, (4-2)/4 = 0.5, (9-5)/2 = 2.0
    r = [req("a", 0.0, 1.0, 11.0, 11, inp=100, cached=0),
         req("b", 0.0, 2.0, 4.0, 5, inp=200, cached=100, sched=0.5),
         req("c", 1.0, 5.0, 9.0, 3, inp=50, cached=32, preempt=1)]
    itl = [(1.0, 10), (0.5, 4), (2.0, 2)]
    counters = {"prefix_cache_queries": 350, "prefix_cache_hits": 132, "preemptions": 1}
    ts = {"t_s": [0.0, 1.0, 2.0, 3.0], "kv_usage": [0.1, 0.5, 0.9, 0.3],
          "num_running": [2, 3, 3, 1], "num_waiting": [1, 0, 4, 0],
          "num_scheduled_tokens": [300, 3, 3, 1]}
    return result(r, itl=itl, counters=counters, timeseries=ts, num_gpus=2,
                  simulated_s=11.0, wall_s=0.01)


def test_latency_percentiles_and_interactivity():
    s = summarize(three_requests())
    assert s.ttft_p50_s == 2.0
    assert s.ttft_p90_s == pytest.approx(np.percentile([1, 2, 4], 90))  # 3.6
    assert s.ttft_p90_s == pytest.approx(3.6)
    # TPOT per request = [1.0, 0.5, 2.0]; p90 = 1.0 + 0.8 * 1.0 = 1.8
    assert s.tpot_p50_s == 1.0
    assert s.tpot_p90_s == pytest.approx(1.8)
    # AgentX: p90 interactivity = 1 / p90 of per-request mean ITL (NOT the mean of 1/itl)
    assert s.p90_interactivity == pytest.approx(1 / 1.8)
    assert s.p50_interactivity == pytest.approx(1.0)
    assert s.p99_interactivity == pytest.approx(1 / np.percentile([1.0, 0.5, 2.0], 99))
    assert s.p90_interactivity != pytest.approx(np.percentile([1.0, 2.0, 0.5], 10))
    # pooled ITL: 10x1.0, 4x0.5, 2x2.0 -> 16 gaps; mean = (10 + 2 + 4)/16 = 1.0
    assert s.itl_mean_s == pytest.approx(1.0)
    assert s.itl_p50_s == 1.0
    assert s.itl_p99_s == pytest.approx(np.percentile([0.5] * 4 + [1.0] * 10 + [2.0] * 2, 99))
    assert s.e2e_p50_s == 8.0  # e2e = 11, 4, 8


def test_throughput_cache_and_state():
    s = summarize(three_requests())
    # span: first admission 0.0 -> last finish 11.0; output 19 tokens, input 350
    assert s.span_s == 11.0
    assert s.output_throughput == pytest.approx(19 / 11)
    assert s.output_throughput_per_gpu == pytest.approx(19 / 11 / 2)
    assert s.total_throughput_per_gpu == pytest.approx(369 / 11 / 2)
    assert s.request_throughput == pytest.approx(3 / 11)
    assert s.prefix_cache_hit_rate == pytest.approx(132 / 350)
    assert s.preemptions == 1
    assert s.kv_usage_mean == pytest.approx(0.45)
    assert s.kv_usage_peak == 0.9
    assert s.queue_depth_mean == pytest.approx(1.25)
    assert s.queue_depth_peak == 4
    assert s.num_steps == 4
    assert s.speed_ratio == pytest.approx(1100.0)
    assert (s.num_requests, s.num_finished, s.num_rejected, s.num_unfinished) == (3, 3, 0, 0)


def test_json_keys_present():
    d = summarize(three_requests()).to_dict()
    for key in ("p90_interactivity", "output_throughput_per_gpu", "total_throughput_per_gpu",
                "prefix_cache_hit_rate", "ttft_p90_s", "preemptions", "simulated_s", "wall_s",
                "speed_ratio", "itl_p99_s", "tpot_p90_s", "kv_usage_peak", "queue_depth_mean"):
        assert key in d


def test_window_counts_requests_by_arrival():
    # window [0.5, 10): only "c" (arrival 1.0) counts
    s = summarize(three_requests(), measure_from_s=0.5, measure_to_s=10)
    assert s.num_requests == 1
    assert s.ttft_p50_s == 4.0
    assert s.tpot_p90_s == 2.0
    assert s.p90_interactivity == 0.5
    # throughput over c's span: admitted 1.0 -> finished 9.0 = 8 s; 3 output tokens
    assert s.span_s == 8.0
    assert s.output_throughput_per_gpu == pytest.approx(3 / 8 / 2)
    # hit rate from c's own admission: 32 / 50, not the whole-run counters
    assert s.prefix_cache_hit_rate == pytest.approx(32 / 50)
    assert s.preemptions == 1
    # steps in [1, 9]: t = 1, 2, 3
    assert s.num_steps == 3
    assert s.kv_usage_peak == 0.9
    # no step records: the pooled ITL cannot be split, and the summary says so
    assert s.itl_scope == "all"


def test_window_edges_inclusive_exclusive():
    r = result([req("a", 0.0, 1.0, 2.0, 2), req("b", 5.0, 6.0, 8.0, 2)])
    assert summarize(r, measure_from_s=5.0).num_requests == 1
    assert summarize(r, measure_to_s=5.0).num_requests == 1
    assert summarize(r, measure_from_s=0.0, measure_to_s=5.0001).num_requests == 2


def test_bad_windows():
    r = three_requests()
    with pytest.raises(ConfigError, match="empty"):
        summarize(r, measure_from_s=5, measure_to_s=5)
    with pytest.raises(ConfigError, match="no request arrives"):
        summarize(r, measure_from_s=100)


def test_rejected_and_unfinished_excluded_from_latency():
    nan = float("nan")
    r = result([req("a", 0.0, 1.0, 3.0, 3),
                req("r", 0.0, nan, nan, 0, sched=nan, status="rejected"),
                req("u", 0.0, 2.0, nan, 1, status="unfinished")])
    s = summarize(r)
    assert (s.num_requests, s.num_finished, s.num_rejected, s.num_unfinished) == (3, 1, 1, 1)
    assert s.ttft_p50_s == 1.5  # a (1.0) and u (2.0) have a first token
    assert s.tpot_p50_s == 1.0
    assert s.output_throughput == pytest.approx(3 / 3)


def test_empty_result_gives_nans_not_errors():
    s = summarize(result([]))
    assert s.num_requests == 0
    assert math.isnan(s.p90_interactivity)
    assert math.isnan(s.output_throughput_per_gpu)


# ----------------------------------------------------------------- ITL from steps


def test_itl_from_steps_with_chunked_prefill_and_preemption():
    # a: prompt 4, chunks 3 + 1, then decode x2 -> tokens at the end of steps 1, 2, 3
    # b: prompt 2 in step 0 (token at 1.0), decode in step 1 (token at 2.0), preempted while
    #    scheduling step 2 (computed -> 0), recomputes its 4 tokens (2 prompt + 2 generated)
    #    in step 3 -> third token at 5.0
    steps = [
        StepRecord(0, 0.0, 1.0, {"a": 3, "b": 2}, (), 2, 0, 0.5),
        StepRecord(1, 1.0, 1.0, {"a": 1, "b": 1}, (), 2, 0, 0.5),
        StepRecord(2, 2.0, 1.5, {"a": 1}, ("b",), 1, 1, 0.5),
        StepRecord(3, 3.5, 1.5, {"a": 1, "b": 4}, (), 2, 0, 0.5),
    ]
    reqs = [req("a", 0.0, 2.0, 5.0, 3, inp=4), req("b", 0.0, 1.0, 5.0, 3, inp=2)]
    gaps = itl_samples_from_steps(steps, reqs)
    assert gaps["a"] == [(1.5, 1), (1.5, 1)]  # tokens at 2.0, 3.5, 5.0
    assert gaps["b"] == [(1.0, 1), (3.0, 1)]  # tokens at 1.0, 2.0, 5.0
    # an admission with a prefix hit starts from the hit: c has 7 prompt tokens, 6 cached
    hit = [StepRecord(0, 0.0, 1.0, {"c": 1}, (), 1, 0, 0.1, {"c": 6}),
           StepRecord(1, 1.0, 2.0, {"c": 1}, (), 1, 0, 0.1)]
    assert itl_samples_from_steps(hit, [req("c", 0.0, 1.0, 3.0, 2, inp=7)])["c"] == [(2.0, 1)]
    # a recompute that has not caught up emits nothing
    partial = steps[:3] + [StepRecord(3, 3.5, 1.5, {"b": 3}, (), 1, 0, 0.5)]
    assert itl_samples_from_steps(partial, reqs)["b"] == [(1.0, 1)]


def test_window_uses_step_records_for_itl():
    steps = [
        StepRecord(0, 0.0, 1.0, {"a": 4}, (), 1, 0, 0.1),
        StepRecord(1, 1.0, 1.0, {"a": 1}, (), 1, 0, 0.1),
        StepRecord(2, 2.0, 1.0, {"b": 2}, (), 1, 0, 0.1),
        StepRecord(3, 3.0, 3.0, {"b": 1}, (), 1, 0, 0.1),
    ]
    reqs = [req("a", 0.0, 1.0, 2.0, 2, inp=4), req("b", 2.0, 3.0, 6.0, 2, inp=2)]
    r = result(reqs, itl=[(1.0, 1), (3.0, 1)], steps=steps)
    s = summarize(r, measure_from_s=1.5)
    assert s.itl_scope == "window"
    assert s.itl_p50_s == 3.0 and s.itl_mean_s == 3.0


# ----------------------------------------------------------------- outputs


def test_write_requests_parquet_roundtrip(tmp_path):
    import pyarrow.parquet as pq

    path = write_requests_parquet(three_requests(), tmp_path / "sub" / "out.parquet")
    table = pq.read_table(path)
    assert table.num_rows == 3
    assert table.column("ttft_s").to_pylist() == [1.0, 2.0, 4.0]
    assert table.schema.metadata[b"backend"] == b"hand"
    assert not list(tmp_path.glob("sub/*.tuner-tmp"))


def test_summary_table_renders():
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(summary_table(summarize(three_requests())))
    text = console.export_text()
    assert "interactivity" in text and "prefix-cache hit rate" in text
    assert "0.3771" in text  # 132 / 350


def test_queue_growth_slope_matches_polyfit_and_stays_quiet_at_huge_times() -> None:
    """The backlog slope is np.polyfit's on ordinary times, and a finite number without a
    RuntimeWarning on arrival times stretched past 1e200 s (--speedup 1e-201 printed numpy
    warnings after the --json summary)."""
    import warnings

    import numpy as np

    from tuner.metrics.summary import _least_squares_slope

    rng = np.random.default_rng(7)
    t = np.sort(rng.uniform(0, 3600, 500))
    w = 0.3 * t + rng.normal(0, 5, 500)
    assert abs(_least_squares_slope(t, w) - np.polyfit(t, w, 1)[0]) < 1e-9
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _least_squares_slope(t * 1e200, w) == pytest.approx(0.0, abs=1e-150)
