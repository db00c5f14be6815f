"""`tuner report REPLAY.parquet`: a replay's records with their per-engine balance."""

from __future__ import annotations

import pathlib
import re

from click.testing import CliRunner

from tests.tune.tracegen import write_small_trace
from tuner import replay
from tuner.cli import cli
from tuner.metrics import summarize, write_requests_parquet
from tuner.perf.target import Target
from tuner.report.replay_report import engine_summaries, load_records, replay_report
from tuner.sim.fleet import RouterSettings


def _records(tmp_path: pathlib.Path, **target: object) -> tuple[pathlib.Path, object]:
    trace = write_small_trace(tmp_path / "small.parquet")
    t = Target(hardware="mi355x", model="llama-3.1-70b", num_gpu_blocks=800, **target)
    extra = {"router": RouterSettings("session")} if t.replicas > 1 else {}
    result = replay.run(trace, target=t, **extra)
    return write_requests_parquet(result, tmp_path / "records.parquet"), result


def test_engine_summaries_from_the_rows_match_the_replays(tmp_path: pathlib.Path) -> None:
    path, result = _records(tmp_path, tp=2, replicas=3)
    cols, meta = load_records(path)
    engines = engine_summaries(cols, meta["engines"])
    want = summarize(result).engines
    assert [e["num_requests"] for e in engines] == [e.num_requests for e in want]
    assert [e["prefix_cache_hits"] for e in engines] == [e.prefix_cache_hits for e in want]
    assert [e["kv_usage_max"] for e in engines] == [e.kv_usage_max for e in want]


def test_replay_report_shows_the_per_engine_table(tmp_path: pathlib.Path) -> None:
    path, _ = _records(tmp_path, tp=2, replicas=3)
    html = replay_report(path).render()
    sec = re.search(r'<section id="per-engine-balance">(.*?)</section>', html, re.S).group(1)
    assert "busiest engine" in sec and sec.count("<tr>") == 4  # header + 3 engines
    assert sec.count('<svg xmlns="http://www.w3.org/2000/svg"') == 2  # TTFT and ITL CDFs


def test_single_engine_and_cli(tmp_path: pathlib.Path) -> None:
    path, _ = _records(tmp_path, tp=8)
    assert "One engine: nothing to balance" in replay_report(path).render()
    out = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["report", str(path), "-o", str(out)])
    assert res.exit_code == 0 and out.exists(), res.output
    trace = tmp_path / "small.parquet"
    bad = CliRunner().invoke(cli, ["report", str(trace), "-o", str(tmp_path / "x.html")])
    assert bad.exit_code != 0 and "not a replay's records" in bad.output
    assert len(bad.output.strip().splitlines()) == 1
