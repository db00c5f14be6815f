"""summarize() reads records a chunk at a time and gives the per-object code's figures.

The oracle is the summary as it was computed from ``RequestResult`` objects
(loaded_metrics_reference.py, a verbatim copy); every field must be bit-identical
(compared by repr, so nan equals nan), over random tables with every status, windows,
SLOs and a fleet's engine column, and over real twin replays.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from loaded_metrics_reference import loaded_summarize

from tuner.metrics import summarize
from tuner.metrics.record_columns import record_chunks
from tuner.records import EngineSummary, GapSamples, ReplayResult, RequestTable

STATUSES = ("finished", "rejected", "aborted", "unfinished", "error")


def random_result(seed: int, n: int = 3000, engines: int = 3, *,
                  table: bool = True) -> ReplayResult:
    rng = np.random.default_rng(seed)
    t = RequestTable([f"r{i}" for i in range(n)], rng.integers(1, 5000, n).tolist(),
                     [None if i % 7 == 0 else f"s{i % 50}" for i in range(n)])
    arrival = np.sort(rng.uniform(0, 600, n))
    for i in range(n):
        status = STATUSES[int(rng.choice(5, p=[0.7, 0.1, 0.05, 0.1, 0.05]))]
        a = float(arrival[i])
        if status == "rejected":
            t.record(i, "rejected", a)
            t.engine[i] = -1 if engines > 1 else 0
            continue
        sched = a + float(rng.exponential(2.0)) if rng.random() > 0.05 else math.nan
        first = sched + float(rng.exponential(0.5)) if sched == sched and rng.random() > 0.1 \
            else math.nan
        out = int(rng.integers(0, 400))
        finish = first + out * float(rng.uniform(0.01, 0.05)) if status == "finished" \
            and first == first else math.nan
        t.record(i, status if finish == finish or status != "finished" else "unfinished", a,
                 output_len=out, first_scheduled_s=sched, first_token_s=first,
                 finish_s=finish, num_cached_tokens=int(rng.integers(0, 2000)),
                 num_preemptions=int(rng.integers(0, 3)))
        t.engine[i] = int(rng.integers(0, engines))
    gaps = GapSamples()
    for g, c in zip(rng.exponential(0.03, 5000), rng.integers(0, 9, 5000)):
        gaps.append((float(g), int(c)))
    steps = 4000
    ts = {"t_s": np.sort(rng.uniform(0, 700, steps)).tolist(),
          "kv_usage": rng.uniform(0, 1, steps).tolist(),
          "num_running": rng.integers(0, 300, steps).tolist(),
          "num_waiting": rng.integers(0, 80, steps).tolist(),
          "num_scheduled_tokens": rng.integers(0, 8192, steps).tolist()}
    summaries = [EngineSummary(engine=e, replica=e, dp_rank=0, num_requests=0,
                               num_finished=0, prefix_cache_queries=1, prefix_cache_hits=0,
                               preemptions=0, kv_usage_mean=0.5, kv_usage_max=0.9,
                               num_steps=10) for e in range(engines)] if engines > 1 else []
    return ReplayResult(backend="sim", requests=t if table else list(t), itl_samples=gaps,
                        timeseries=ts, counters={"prefix_cache_queries": 10.0,
                                                 "prefix_cache_hits": 3.0, "num_steps": 4000},
                        simulated_s=700.0, wall_s=1.5, num_gpus=8, engines=summaries)


WINDOWS = [(None, None), (100.0, None), (None, 400.0), (50.0, 450.0)]
SLOS = [None, {"ttft": 3000.0}, {"ttft": 4000.0, "tpot": 40.0, "e2el": 12000.0}]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("window", WINDOWS)
def test_streamed_summary_equals_the_per_object_one(seed: int, window: tuple) -> None:
    result = random_result(seed, engines=1 + 2 * seed)
    for slo in SLOS:
        kw = dict(measure_from_s=window[0], measure_to_s=window[1], slo_ms=slo)
        assert repr(summarize(result, **kw)) == repr(loaded_summarize(result, **kw))


def test_streamed_summary_of_a_plain_list_equals_the_table_one() -> None:
    table, rows = random_result(5, engines=1), random_result(5, engines=1, table=False)
    for lo, hi in WINDOWS:
        assert repr(summarize(rows, measure_from_s=lo, measure_to_s=hi)) == repr(
            summarize(table, measure_from_s=lo, measure_to_s=hi))


def test_chunks_cover_the_table_in_order() -> None:
    result = random_result(3, n=1000)
    chunks = list(record_chunks(result.requests, rows=300))
    assert [c.start for c in chunks] == [0, 300, 600, 900]
    ttft = np.concatenate([c.ttft_s for c in chunks])
    itl = np.concatenate([c.mean_itl_s for c in chunks])
    assert repr(ttft.tolist()) == repr([r.ttft_s for r in result.requests])
    assert repr(itl.tolist()) == repr([r.mean_itl_s for r in result.requests])
    assert np.concatenate([c.engine for c in chunks]).tolist() == list(result.requests.engine)


def test_summarize_builds_no_request_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails on the per-object code: it read the table row by row."""
    result = random_result(4)

    def refuse(self: RequestTable, i: int) -> None:
        raise AssertionError("summarize built a RequestResult")

    expected = repr(loaded_summarize(result, measure_from_s=10.0))
    monkeypatch.setattr(RequestTable, "_row", refuse)
    assert repr(summarize(result, measure_from_s=10.0)) == expected
    summarize(result)


def test_streamed_summary_of_twin_replays(mooncake_head_trace: object) -> None:
    from tuner import replay
    from tuner.perf.target import Target
    from tuner.sim.fleet import RouterSettings

    for target, router in ((Target(hardware="mi355x", model="llama-3.1-8b"), None),
                           (Target(hardware="mi355x", model="llama-3.1-8b", replicas=3),
                            RouterSettings(policy="least-loaded"))):
        kw = {} if router is None else {"router": router}
        result = replay.run(mooncake_head_trace, target=target, **kw)
        for lo, hi in [(None, None), (2.0, None), (None, 8.0), (1.0, 9.0)]:
            got = summarize(result, measure_from_s=lo, measure_to_s=hi,
                            slo_ms={"ttft": 500.0})
            assert repr(got) == repr(loaded_summarize(
                result, measure_from_s=lo, measure_to_s=hi, slo_ms={"ttft": 500.0}))
