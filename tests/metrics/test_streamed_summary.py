"""summarize() reads records a chunk at a time and gives the per-object code's figures.

The oracle is the summary as it was computed from ``RequestResult`` objects
(loaded_metrics_reference.py, a verbatim copy); every field must be bit-identical
(compared by repr, so nan equals nan), over random tables with every status, windows,
SLOs and a fleet's engine column, and over real twin replays.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.metrics.loaded_metrics_reference import loaded_summarize
from tests.metrics.record_tables import random_result
from tuner.metrics import summarize
from tuner.metrics.record_columns import record_chunks
from tuner.records import RequestTable

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
