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


def _tied_series(rng: np.random.Generator, n: int) -> dict[str, list[float]]:
    """Times on a coarse grid, so engines tie with each other and with themselves."""
    series = _series(rng, n)
    series["t_s"] = np.sort(rng.integers(0, 12, n)).astype(float).tolist()
    return series


def test_array_merge_is_the_walk_exactly() -> None:
    """The array path gives the walk's numbers and types: floats in the queue sums
    until every engine has reported, ints after; ties ordered engine first."""
    from tuner.sim.fleet.timeseries import _columns, _merge_heap

    rng = np.random.default_rng(5)
    cases = [[_tied_series(rng, n) for n in sizes]
             for sizes in ((40, 60), (50, 0, 80, 33), (1, 1, 1), (0, 0), (30, 5, 70))]
    for series in cases:
        assert _columns(series) is not None  # the array path runs
        for compact in (False, True):
            merged = merge_timeseries(series, compact=compact)
            walked = _merge_heap(series, compact)
            assert repr(merged) == repr(walked)
    merged = merge_timeseries(cases[0])
    assert {type(v) for v in merged["num_running"]} == {float, int}  # both kinds occur


def test_merge_outside_the_array_path_walks() -> None:
    """Inputs the array path cannot rebuild exactly (times out of order, an int time, a
    float count) take the walk, with its output."""
    from tuner.sim.fleet.timeseries import _columns, _merge_heap

    rng = np.random.default_rng(6)
    base = [_series(rng, 20), _series(rng, 30)]
    unsorted = [dict(base[0], t_s=base[0]["t_s"][::-1]), base[1]]
    int_time = [dict(base[0], t_s=[0] + base[0]["t_s"][1:]), base[1]]
    float_count = [dict(base[0], num_running=[0.5] + base[0]["num_running"][1:]), base[1]]
    for series in (unsorted, int_time, float_count):
        assert _columns(series) is None
        assert repr(merge_timeseries(series)) == repr(_merge_heap(series, False))
