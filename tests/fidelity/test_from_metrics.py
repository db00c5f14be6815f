"""``calibrate --from-metrics``: the clock fitted to a server's /metrics over a trace window."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from tests.tune.tracegen import write_small_trace
from tuner import replay
from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.fidelity.from_metrics import (ITL, PREFILL, TTFT, VLLM_BUCKETS, calibrate_from_metrics,
                                         exposition_of, read_window_metrics,
                                         replay_metrics_text, twin_histograms)
from tuner.perf.clock_variant import ClockVariant
from tuner.perf.fit.calibration_file import load_calibration
from tuner.perf.target import Target
from tuner.serve.prometheus import Histogram

TARGET = Target(hardware="mi355x", model="llama-3.1-8b", tp=1)
#: The "real GPU": prefill 45 % slower and decode 30 % faster than the twin's clock.
TRUTH = ClockVariant(prefill=1.45, decode=0.7, cpu=0.7, transfer=0.7)


@pytest.fixture(scope="module")
def window(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A trace window and the /metrics a server with the TRUTH clock shows over it."""
    folder = tmp_path_factory.mktemp("window")
    trace = write_small_trace(folder / "window.parquet", duration_s=60.0, sessions=12)
    served = replay.run(trace, target=dataclasses.replace(TARGET, clock=TRUTH))
    metrics = folder / "after.txt"
    metrics.write_text(replay_metrics_text(served, model_name="meta-llama/Llama-3.1-8B",
                                           cache_config={"block_size": "16"}))
    return trace, metrics, served


def test_the_fit_recovers_the_clock_a_replay_with_perturbed_coefficients_made(window) -> None:
    trace, metrics, _served = window
    fit = calibrate_from_metrics(trace, TARGET, read_window_metrics([metrics]))
    assert fit.factors.prefill == pytest.approx(TRUTH.prefill, rel=0.03)
    assert fit.factors.decode == pytest.approx(TRUTH.decode, rel=0.03)
    by = {h.name: h for h in fit.histograms}
    assert set(by) >= {TTFT, ITL, PREFILL}
    # the nominal twin is off; the fitted clock reproduces the two means it was fitted to,
    # and the written calibration (the per-kernel coefficients) comes close to all three
    assert abs(by[ITL].error_pct("nominal")) > 20
    for name in (ITL, PREFILL):
        assert abs(by[name].error_pct("fitted")) < 1.5, (name, by[name].to_dict())
    for name in (ITL, PREFILL, TTFT):
        assert abs(by[name].error_pct("calibrated")) < 10, (name, by[name].to_dict())
    cal = fit.calibration
    assert cal.fit["clock_factors"]["prefill"] == pytest.approx(fit.factors.prefill, abs=1e-3)
    assert ITL in cal.fit["histograms"]


def _scrape(hists: dict[str, Histogram]) -> str:
    return exposition_of(hists, model_name="llama-3.1-8b")


def _sum(a: Histogram, b: Histogram) -> Histogram:
    prev = dict(b.buckets)
    return Histogram(tuple((le, c + prev.get(le, 0.0)) for le, c in a.buckets), a.sum + b.sum,
                     a.count + b.count)


def test_two_scrapes_and_a_range_export_give_the_window_between_them(window, tmp_path) -> None:
    _trace, _metrics, served = window
    like = {n: Histogram(tuple((b, 0.0) for b in bs), 0.0, 0.0) for n, bs in VLLM_BUCKETS.items()}
    win = twin_histograms(served, like)
    earlier = {n: Histogram(tuple((le, 3.0 * i) for i, (le, _) in enumerate(h.buckets)),
                            7.5, 3.0 * (len(h.buckets) - 1)) for n, h in win.items()}
    before, after = tmp_path / "before.txt", tmp_path / "after.txt"
    before.write_text(_scrape(earlier))
    after.write_text(_scrape({n: _sum(h, earlier[n]) for n, h in win.items()}))
    two = read_window_metrics([before, after])
    for name in (ITL, PREFILL, TTFT):
        assert two.histograms[name].count == pytest.approx(win[name].count)
        assert two.histograms[name].sum == pytest.approx(win[name].sum)
    # the same window as a Prometheus range-query export: last minus first per series
    result = []
    for name, h in win.items():
        e = earlier[name]
        for (le, c0), (_, c1) in zip(e.buckets, _sum(h, e).buckets):
            bound = "+Inf" if le == float("inf") else str(le)
            result.append({"metric": {"__name__": f"{name}_bucket", "le": bound,
                                      "model_name": "llama-3.1-8b"},
                           "values": [[1000.0, str(c0)], [1060.0, str(c1)]]})
        for suffix, v0, v1 in (("_sum", e.sum, e.sum + h.sum), ("_count", e.count, e.count + h.count)):
            result.append({"metric": {"__name__": name + suffix, "model_name": "llama-3.1-8b"},
                           "values": [[1000.0, str(v0)], [1060.0, str(v1)]]})
    export = tmp_path / "range.json"
    export.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix",
                                                                "result": result}}))
    ranged = read_window_metrics([export])
    assert ranged.span_s == 60.0
    for name in (ITL, PREFILL, TTFT):
        assert ranged.histograms[name].count == pytest.approx(win[name].count)
        assert ranged.histograms[name].mean == pytest.approx(win[name].mean)


def test_refuses_a_window_too_short(window, tmp_path) -> None:
    trace, _metrics, served = window
    short = dataclasses.replace(served, requests=list(served.requests)[:5],
                                itl_samples=list(served.itl_samples)[:50])
    path = tmp_path / "short.txt"
    path.write_text(replay_metrics_text(short, model_name="llama-3.1-8b"))
    with pytest.raises(ConfigError, match="too short: the metrics count 5 requests"):
        calibrate_from_metrics(trace, TARGET, read_window_metrics([path]))


def test_refuses_metrics_of_another_window(window, tmp_path) -> None:
    _trace, metrics, _served = window
    other = write_small_trace(tmp_path / "other.parquet", duration_s=20.0, sessions=3)
    with pytest.raises(ConfigError, match="not the same window"):
        calibrate_from_metrics(other, TARGET, read_window_metrics([metrics]))


def test_refuses_another_deployment(window, tmp_path) -> None:
    trace, metrics, served = window
    m = read_window_metrics([metrics])
    with pytest.raises(ConfigError, match="cache_config_info.block_size is 16 but the target's "
                                          "is 32"):
        calibrate_from_metrics(trace, dataclasses.replace(TARGET, block_size=32), m)
    with pytest.raises(ConfigError, match="model_name is 'meta-llama/Llama-3.1-8B' but the "
                                          "target model is 'llama-3.1-70b'"):
        calibrate_from_metrics(trace, Target(hardware="mi355x", model="llama-3.1-70b", tp=1), m)


def test_bad_metrics_files_name_file_line_and_field(tmp_path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("# TYPE x counter\nvllm:x_total{a=\"1\" 3\n")
    with pytest.raises(ConfigError, match=r"bad\.txt:2: sample: "):
        read_window_metrics([bad])
    js = tmp_path / "bad.json"
    js.write_text('{"data": {"result": [\n  {"metric": {}, "values": []}]}}')
    with pytest.raises(ConfigError, match=r"bad\.json: data\.result\[0\]\.metric: needs a "
                                          "__name__"):
        read_window_metrics([js])
    js.write_text('{"data":\n [,]}')
    with pytest.raises(ConfigError, match=r"bad\.json:2: JSON: "):
        read_window_metrics([js])
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    with pytest.raises(ConfigError, match="vllm:request_prefill_time_seconds: not in the metrics"):
        read_window_metrics([empty])


def test_cli_writes_the_calibration_and_reports_each_histogram(window, tmp_path) -> None:
    trace, metrics, _served = window
    out = tmp_path / "calib.yaml"
    args = ["calibrate", "--from-metrics", str(metrics), "--trace", str(trace),
            "--hardware", "mi355x", "--model", "llama-3.1-8b", "-o", str(out)]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["factors"]["prefill"] == pytest.approx(TRUTH.prefill, rel=0.03)
    assert set(doc["histograms"]) >= {TTFT, ITL, PREFILL}
    cal = load_calibration(out)
    assert cal.hardware == "mi355x" and cal.fit["from_metrics"] == str(metrics)
    # no --trace: one line, exit 2, nothing written
    out2 = tmp_path / "none.yaml"
    bad = CliRunner().invoke(cli, ["calibrate", "--from-metrics", str(metrics), "--hardware",
                                   "mi355x", "--model", "llama-3.1-8b", "-o", str(out2)])
    assert bad.exit_code == 2 and "needs --trace" in bad.output
    assert len(bad.output.strip().splitlines()) == 1 and not out2.exists()


def test_help_has_an_example() -> None:
    result = CliRunner().invoke(cli, ["calibrate", "--help"])
    assert "--from-metrics before.txt --from-metrics after.txt" in result.output
    assert "--json" in result.output

