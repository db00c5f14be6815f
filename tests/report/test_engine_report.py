"""The per-engine balance section: from a fleet profile's stored per-engine summaries,
and absent for a single engine."""

from __future__ import annotations

import dataclasses
import pathlib
import re

from tests.profile.test_fleet_export import fleet_profile
from tuner.profile import save_profile
from tuner.report import study_report
from tuner.report.engines import engine_rows, imbalance


def _engines(counts: list[int]) -> list[dict]:
    return [{"engine": i, "replica": i, "dp_rank": 0, "num_requests": n, "num_finished": n,
             "prefix_cache_queries": 100 * n, "prefix_cache_hits": 40 * n + 10 * i,
             "prefix_cache_hit_rate": (40 * n + 10 * i) / (100 * n), "preemptions": i,
             "kv_usage_mean": 0.2 + 0.1 * i, "kv_usage_max": 0.5 + 0.1 * i, "num_steps": 900 + i,
             "num_dummy_steps": 0} for i, n in enumerate(counts)]


def test_rows_and_imbalance_line() -> None:
    engines = _engines([10, 30, 20, 20])
    rows = engine_rows(engines)
    assert [r[4] for r in rows] == ["12.5%", "37.5%", "25.0%", "25.0%"]
    assert imbalance(engines).startswith("busiest engine: 30 requests, 1.50x the mean of 20.0")


def test_fleet_profile_report_has_the_per_engine_table(tmp_path: pathlib.Path) -> None:
    prof = fleet_profile()
    predicted = {"train": {"baseline": {"p90_interactivity": 10.0},
                           "tuned": {"p90_interactivity": 12.0},
                           "engines": {"baseline": _engines([40, 10, 25, 25]),
                                       "tuned": _engines([26, 24, 25, 25])}},
                 "selection": {"rule": "r", "reason": "why", "is_baseline": False}}
    path = save_profile(dataclasses.replace(prof, predicted=predicted), tmp_path / "fleet.yaml")
    html = study_report(profile=path, replay=False, include_trace=False).render()
    m = re.search(r'<section id="per-engine-balance">(.*?)</section>', html, re.S)
    assert m, "no per-engine section"
    sec = m.group(1)
    assert "prefix-cache hit rate" in sec and "KV usage peak" in sec and "preemptions" in sec
    assert "baseline, train window: busiest engine: 40 requests, 1.60x" in sec
    assert "tuned, train window: busiest engine: 26 requests" in sec
    assert sec.count('<svg xmlns="http://www.w3.org/2000/svg"') == 1


def test_single_engine_profile_report_has_no_engine_section(tmp_path: pathlib.Path) -> None:
    prof = dataclasses.replace(fleet_profile(), router=None, target=dataclasses.replace(
        fleet_profile().target, replicas=1, tp=8, num_gpus=8))
    path = save_profile(dataclasses.replace(prof, predicted={"train": {
        "baseline": {"p90_interactivity": 1.0}, "tuned": {"p90_interactivity": 1.0}}}),
        tmp_path / "one.yaml")
    html = study_report(profile=path, replay=False, include_trace=False).render()
    assert 'id="per-engine-balance"' not in html


def test_lazy_report_ids_read_as_arrays() -> None:
    """The report's re-blocked ids are what the fleet's prefix-aware router reads with
    ``np.asarray`` (a 64-token trace replayed at KV block 16)."""
    import numpy as np

    from tuner.report.study_trace import LazyKvIds

    prompt = np.array([11, 12, 13], dtype=np.uint64)
    ids = LazyKvIds(prompt, np.array([], dtype=np.uint64), 64 * 3, 0, 64, 16, 0)
    arr = np.asarray(ids, dtype=np.int64)
    assert arr.dtype == np.int64 and arr.tolist() == ids.tolist() and len(arr) == 12


def test_fleet_study_report_replays_every_engine(tmp_path: pathlib.Path) -> None:
    """A real (tiny) fleet study: the report's replays give the per-engine table."""
    from tests.tune.tracegen import write_small_trace
    from tuner.perf.target import Target
    from tuner.profile.recommend import tune_to_profile
    from tuner.sim.fleet import RouterSettings
    from tuner.tune import DeploymentSearch, SearchOptions, TuneInputs

    trace = write_small_trace(tmp_path / "small.parquet")
    target = Target(hardware="mi355x", model="llama-3.1-70b", tp=4, replicas=2,
                    num_gpu_blocks=800)
    run = tune_to_profile(tmp_path / "two.yaml", TuneInputs(str(trace), target=target),
                          SearchOptions(n_trials=3, n_survivors=2),
                          DeploymentSearch(router=RouterSettings("session", load_metric="requests"),
                                           routers=["session"]))
    assert run.profile.router is not None and run.profile.router["policy"] == "session"
    html = study_report(profile=run.path, include_trace=False).render()
    m = re.search(r'<section id="per-engine-balance">(.*?)</section>', html, re.S)
    assert m and "replayed now on the study's windows" in m.group(1)
    assert m.group(1).count("<tr>") >= 3  # a header and two engines at least
