"""Error bands (tuner/perf/fit/bands.py): lookup per GPU family and regime, the knee,
coverage on a small fixture, the shipped file, and a calibration narrowing a band."""

from __future__ import annotations

import json
import math

import pytest

from tuner.errors import ConfigError
from tuner.perf.fit import bands as B
from tuner.perf.fit.bands import Band, Sample


def _sample(metric: str, family: str, regime: str, ratio: float, series: str = "S") -> Sample:
    return Sample(f"{series}-{metric}-{ratio}", series, metric, family, regime, ratio)


def _fixture() -> list[Sample]:
    """AMD TTFT off by up to x2.5, NVIDIA TTFT by up to 10 %; a thin TPOT cell that pools."""
    out = [_sample("ttft", "amd", "above", r, f"A{i % 3}") for i, r in
           enumerate((0.5, 0.6, 0.8, 1.2, 1.6, 2.5))]
    out += [_sample("ttft", "nvidia", "above", r, f"N{i % 3}") for i, r in
            enumerate((0.9, 0.95, 1.0, 1.05, 1.08, 1.1))]
    out += [_sample("tpot", "amd", "below", 1.3), _sample("tpot", "amd", "above", 0.8)]
    out += [_sample("throughput", "nvidia", "below", 1.0 / 1.3)]
    return out


def test_lookup_per_family_and_regime():
    cells = B.derive_cells(_fixture(), cover=1.0, min_rows=6)
    amd = B.bands_for("AMD", "above", knee=64, running_per_engine=80.0, cells=cells)
    nv = B.bands_for("nvidia", "above", knee=64, running_per_engine=80.0, cells=cells)
    assert amd.family == "amd" and nv.family == "nvidia" and amd.regime == "above"
    assert amd.bands["ttft"].cell == "ttft/amd/above"
    # symmetric in log space: the larger side sets both
    a, n = amd.bands["ttft"], nv.bands["ttft"]
    assert a.low == pytest.approx(0.4) and a.high == pytest.approx(2.5)
    assert n.low == pytest.approx(0.9) and n.high == pytest.approx(1 / 0.9)
    # a thin cell borrows: TPOT AMD below has 1 sample < 6 -> (tpot, amd) pool of 2
    tpot = B.derive_cells(_fixture(), cover=1.0, min_rows=2)["tpot/amd/below"]
    assert tpot.cell == "tpot/amd/*" and tpot.rows == 2 and tpot.high == pytest.approx(1.3)
    # NVIDIA below has no TTFT row: it borrows the family's, or with a higher bar the metric's
    assert cells["ttft/nvidia/below"].cell == "ttft/nvidia/*"
    assert cells["ttft/nvidia/below"].high == pytest.approx(1 / 0.9)
    strict = B.derive_cells(_fixture(), cover=1.0, min_rows=7)["ttft/nvidia/below"]
    assert strict.cell == "ttft/*/*" and strict.rows == 12 and strict.high == pytest.approx(2.5)
    with pytest.raises(ConfigError, match="vendor 'tpu'"):
        B.family_of("tpu")


def test_shipped_file_has_every_cell_and_is_loaded():
    cells = B.load_bands()
    assert set(cells) == {f"{m}/{f}/{r}" for m in B.METRICS for f in B.FAMILIES
                          for r in B.REGIMES}
    for band in cells.values():
        assert 0 < band.low < 1 < band.high and band.rows >= 1
    pb = B.bands_for("amd", "below", knee=100, running_per_engine=3.0)
    assert pb.bands["tpot"] == cells["tpot/amd/below"] and not pb.calibrated


def test_knee_and_regime():
    from tuner.perf.presets import resolve_target
    from tuner.perf.target import Target

    model = resolve_target(Target(hardware="mi355x", model="llama-3.1-70b", tp=8)).step_time
    short, long = B.knee_batch(model, 200), B.knee_batch(model, 20000)
    assert 1 < long < short < 4096  # longer contexts make each request's KV read dearer
    from tuner.sim.batch import StepBatch

    def cost(b: int) -> float:
        return model.step_time_s(StepBatch(num_decode_reqs=b, decode_ctx_tokens=b * 20000))
    assert cost(long) >= 2 * cost(1) > cost(long - 1)
    assert B.regime_of(long - 1, 0.0, long) == "below"
    assert B.regime_of(long, 0.0, long) == "above"
    assert B.regime_of(1.0, 1.0, long) == "above"  # requests wait: saturated


def test_coverage_on_a_small_fixture():
    samples = _fixture()
    cells = B.derive_cells(samples, cover=0.5, min_rows=6)
    hit, total = B.coverage(samples, cells)
    assert total == len(samples)
    # cover=0.5: half of each 6-sample TTFT cell (plus the ties at the median) is inside
    amd = [s for s in samples if s.metric == "ttft" and s.family == "amd"]
    a = cells["ttft/amd/above"]
    assert sum(a.low <= s.ratio <= a.high for s in amd) == 3
    assert hit < total
    full = B.derive_cells(samples, cover=1.0, min_rows=6)
    assert B.coverage(samples, full) == (total, total)
    # held out by series: each series judged by bands derived without it. The bands of
    # the rest, pooled over (ttft, above), cover every TTFT row except A2's 2.5 (the rest
    # reach only x2); series S owns every TPOT and throughput sample, so it is not judged.
    assert B.held_out_coverage(samples, cover=1.0, min_rows=6) == (11, 12)


def test_shipped_coverage_matches_its_samples_and_meets_the_target():
    doc = json.loads(B.BANDS_PATH.read_text())
    samples = [Sample(**s) for s in doc["samples"]]
    cells = B.load_bands()
    hit, total = B.coverage(samples, cells)
    assert doc["coverage"]["in_sample"] == f"{hit}/{total}"
    h, t = B.held_out_coverage(samples)
    assert doc["coverage"]["held_out_series"] == f"{h}/{t}"
    assert hit / total >= 0.8 and h / t >= 0.8
    fresh = B.derive_cells(samples)  # the file's cells follow from its samples
    assert set(fresh) == set(cells)
    for key, band in fresh.items():
        assert (band.cell, band.rows) == (cells[key].cell, cells[key].rows)
        assert band.low == pytest.approx(cells[key].low, rel=1e-5)
        assert band.high == pytest.approx(cells[key].high, rel=1e-5)


def _probe(kind: str, measured: float, predicted: float) -> dict:
    return {"kind": kind, "probe": kind, "measured_ms": measured, "predicted_ms": predicted}


def test_calibration_narrows_the_bands():
    wide = Band("ttft", math.exp(-1.0), math.exp(1.0), 10, "ttft/*/*")
    fit = {"probes": [_probe("prefill", 10.0, 9.0), _probe("prefill", 10.0, 11.0),
                      _probe("decode", 5.0, 5.0), _probe("decode", 4.0, 4.01)]}
    narrow = B.narrowed(wide, fit, "cal.yaml")
    assert narrow is not None and narrow.source == "calibration cal.yaml"
    assert wide.low < narrow.low < 1 < narrow.high < wide.high
    lo_err, hi_err = math.log(11 / 10), math.log(10 / 9)  # the two prefill probes' |log|
    a = lo_err + B.COVER * (hi_err - lo_err)  # their COVER quantile (linear)
    assert narrow.high == pytest.approx(math.exp(a)) and narrow.low == pytest.approx(math.exp(-a))
    # a perfect decode fit still keeps the floor
    tpot = B.narrowed(Band("tpot", 0.5, 2.0, 10, "x"), fit, "cal.yaml")
    assert tpot.high == pytest.approx(math.exp(B.CALIBRATED_FLOOR))
    # never wider than the published band
    tight = Band("ttft", 0.99, 1.01, 10, "x")
    assert B.narrowed(tight, fit, "c").high == pytest.approx(1.01)
    assert B.narrowed(wide, {"rms_rel_error_pct": 8.0}, "c").high == pytest.approx(1.16)
    assert B.narrowed(wide, {}, "c") is None


def test_bands_for_says_whether_a_calibration_narrowed_them():
    class Cal:
        fit = {"probes": [_probe(k, 10.0, 10.5) for k in ("prefill", "decode", "mixed")]}

    class Bare:
        fit = {"vllm_version": "0.33.0"}

    plain = B.bands_for("nvidia", "above", knee=50, running_per_engine=60.0)
    cal = B.bands_for("nvidia", "above", knee=50, running_per_engine=60.0, calibration=Cal(),
                      calibration_path="cal.yaml")
    bare = B.bands_for("nvidia", "above", knee=50, running_per_engine=60.0, calibration=Bare(),
                       calibration_path="bare.yaml")
    assert cal.calibrated and "narrowed by the calibration cal.yaml" in cal.note
    for m in B.METRICS:
        assert cal.bands[m].high < plain.bands[m].high
        assert bare.bands[m] == plain.bands[m]
    assert not bare.calibrated and "not narrowed" in bare.note
