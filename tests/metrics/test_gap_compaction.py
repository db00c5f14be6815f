"""GapSamples.compact: a long replay's pooled gaps stay bounded and every figure stays exact.

Why these tests: the compaction merges equal gaps and reorders the pool; the metrics
must read the same token-weighted percentiles from it, and a replay shorter than the
threshold must keep its pairs in step order (the golden digests hash that order).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from tuner.metrics.percentiles import weighted_percentile
from tuner.records import GapSamples

_pairs = st.lists(st.tuples(st.sampled_from([0.01, 0.02, 0.0125, 0.5, 1e-4, 0.0]),
                            st.integers(min_value=0, max_value=9)), max_size=200)


@settings(max_examples=200, deadline=None)
@given(_pairs)
def test_compaction_keeps_every_percentile(pairs):
    plain = GapSamples()
    for pair in pairs:
        plain.append(pair)
    merged = GapSamples()
    for pair in pairs:
        merged.append(pair)
    merged.compact()
    for q in (0, 10, 50, 90, 99, 100):
        a, b = weighted_percentile(plain, q), weighted_percentile(merged, q)
        assert (np.isnan(a) and np.isnan(b)) or a == b
    assert sum(c for _, c in merged) == sum(c for _, c in plain)
    gaps = list(merged.gap_s)
    assert gaps == sorted(set(gaps))  # one pair per distinct gap, ascending
    assert all(c > 0 for c in merged.count)


def test_short_pool_keeps_step_order():
    samples = GapSamples()
    pairs = [(0.3, 1), (0.1, 2), (0.3, 1)]
    for pair in pairs:
        samples.append(pair)
        samples.maybe_compact()
    assert samples == pairs


def test_pool_stays_bounded_by_distinct_gaps(monkeypatch):
    monkeypatch.setattr(GapSamples, "COMPACT_PAIRS", 64)
    samples = GapSamples()
    rng = np.random.default_rng(0)
    gaps = rng.choice([0.010, 0.011, 0.012, 0.015, 0.020], size=10_000)
    for gap in gaps:
        samples.append((float(gap), 1))
        samples.maybe_compact()
    assert len(samples) <= 64 + 5  # never more than the threshold plus the merged pairs
    assert sum(samples.count) == 10_000
    assert weighted_percentile(samples, 90) == np.percentile(gaps, 90)


def test_a_replay_compacts_its_pool_and_keeps_its_summary(monkeypatch):
    """The engine compacts as it steps (GapSamples.maybe_compact once a step): with a low
    threshold the pool ends shorter (equal gaps merged), with the same ITL figures: the
    percentiles bit for bit, the means to 1e-12 (summed in another order)."""
    from tuner import replay
    from tuner.metrics import summarize
    from tuner.perf.target import Target
    from tuner.trace import synthesize

    trace = synthesize("chat", duration_s=120.0, rate=2.0, seed=3)
    target = Target(hardware="h200", model="llama-3.1-8b", tp=1)
    plain = replay.run(trace, target=target)
    monkeypatch.setattr(GapSamples, "COMPACT_PAIRS", 32)
    merged = replay.run(trace, target=target)
    steps = int(plain.counters["num_steps"])
    assert len(plain.itl_samples) > 200
    assert len(merged.itl_samples) < len(plain.itl_samples)  # equal gaps merged
    assert sum(merged.itl_samples.count) == sum(plain.itl_samples.count)
    a, b = summarize(plain).to_dict(), summarize(merged).to_dict()
    itl = {k: v for k, v in a.items() if k.startswith(("itl", "tpot", "intvty", "interactivity"))}
    assert itl, sorted(a)
    for key, value in itl.items():
        if value != value:  # NaN (no gaps of that kind)
            assert b[key] != b[key], key
        elif "mean" in key:
            # a mean sums the same (gap, count) pairs in another order: equal to the
            # last bits (the clock's step times decide which ulp), not bit for bit
            assert b[key] == pytest.approx(value, rel=1e-12, abs=0.0), key
        else:  # percentiles read the multiset: bit for bit
            assert b[key] == value, key
    assert steps == int(merged.counters["num_steps"])
