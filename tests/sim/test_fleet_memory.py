"""A fleet's pooled results: compact, and the same numbers as the per-engine ones."""

from __future__ import annotations

from array import array

import numpy as np

from tuner.records import GapSamples
from tuner.sim.fleet.simulator import merge_timeseries, pool_gaps


def _series(rng: np.random.Generator, n: int) -> dict[str, list[float]]:
    return {"t_s": np.sort(rng.uniform(0, 10, n)).tolist(),
            "kv_usage": rng.uniform(0, 1, n).tolist(),
            "num_running": rng.integers(0, 9, n).tolist(),
            "num_waiting": rng.integers(0, 9, n).tolist(),
            "num_scheduled_tokens": rng.integers(0, 900, n).tolist()}


def test_compact_merge_holds_the_listed_values() -> None:
    rng = np.random.default_rng(1)
    series = [_series(rng, n) for n in (50, 0, 80, 33)]
    listed = merge_timeseries(series)
    compact = merge_timeseries(series, compact=True)
    for key, values in listed.items():
        assert isinstance(compact[key], array)
        assert repr([float(v) for v in values]) == repr(compact[key].tolist())
    assert merge_timeseries(series[:1], compact=True) == series[0]  # one engine: as is


class _Engine:
    def __init__(self, pairs: list[tuple[float, int]]) -> None:
        self.itl_samples = GapSamples()
        for pair in pairs:
            self.itl_samples.append(pair)


def test_pooled_gaps_are_every_engine_in_order_and_moved() -> None:
    engines = [_Engine([(0.1, 1), (0.2, 3)]), _Engine([]), _Engine([(0.3, 2)])]
    first = engines[0].itl_samples.gap_s
    gaps = pool_gaps(engines)
    assert list(gaps) == [(0.1, 1), (0.2, 3), (0.3, 2)]
    assert gaps.gap_s is first  # moved, not copied
    assert all(len(e.itl_samples) == 0 for e in engines)
