"""Dtype-dependent step times in replays, the benchmark replays on the unit clock, and
that ``tuner calibrate --from-benchmarks`` reproduces the shipped presets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.perf.fit.benchmark_rows import PUBLISHED_CSV, load_rows, record
from tuner.perf.fit.published import load_fitted
from tuner.perf.fit.to_benchmarks import changed, fit_all, fittable
from tuner.perf.hardware import load_hardware
from tuner.perf.presets import resolve_target
from tuner.perf.step_time import RooflineStepTimeModel
from tuner.perf.target import Target
from tuner.sim.batch import StepBatch


def _closed_loop_replay(quantization: str) -> dict[str, float]:
    """Llama-3.1-8B on one MI355X, 32 requests 2048 in / 256 out, 8 in flight."""
    from tuner.sim.engine import Simulator
    from tuner.sim.load import ClosedLoop
    from tuner.trace.request import TraceRequest

    target = resolve_target(Target(hardware="mi355x", model="llama-3.1-8b", tp=1,
                                   quantization=quantization, max_model_len=4096))
    bs = target.cache.block_size
    reqs = [TraceRequest(request_id=f"r{i}", arrival_s=0.0, input_len=2048, output_len=256,
                         block_hashes=tuple(range(i * 1000, i * 1000 + 2048 // bs)))
            for i in range(32)]
    result = Simulator(reqs, target.default_settings, target.cache, target.step_time.step_time_s,
                       load=ClosedLoop(8)).run()
    done = [r for r in result.requests if r.status == "finished"]
    ttft = float(np.mean([r.ttft_s for r in done]))
    tpot = float(np.mean([r.mean_itl_s for r in done]))
    return {"ttft": ttft, "tpot": tpot, "span": result.simulated_s}


def test_bf16_fp8_mxfp4_replays_differ_plausibly():
    """Quantized kernels do not reach the peak ratios: an old "FP8 = 2x, FP4 = 4x peak,
    weights 2x/4x smaller" clock makes MXFP4 decode ~3.5x and prefill 4x faster than
    BF16; measured MI355X kernels (and the fitted presets) give far less."""
    runs = {q: _closed_loop_replay(q) for q in ("none", "fp8", "mxfp4")}
    bf16, fp8, fp4 = runs["none"], runs["fp8"], runs["mxfp4"]
    assert len({round(r["tpot"], 9) for r in runs.values()}) == 3  # all different
    # decode (weight streaming) gets faster with smaller weights, but not by the byte ratio
    assert bf16["tpot"] > fp8["tpot"] and bf16["tpot"] > fp4["tpot"]
    assert bf16["tpot"] / fp8["tpot"] < 1.9
    assert bf16["tpot"] / fp4["tpot"] < 2.5  # bytes alone would give 3.8x
    # prefill: the MXFP4 kernels' compute efficiency is far below 4x BF16
    assert bf16["ttft"] / fp4["ttft"] < 2.0
    # and everything stays in a plausible band for an 8B model on one MI355X
    for r in runs.values():
        assert 2e-3 < r["tpot"] < 30e-3 and 0.02 < r["ttft"] < 3.0


def test_old_peak_rule_would_fail_these_bounds():
    """The same bounds on the clock with every kernel format at the bf16 efficiencies
    (the pre-issue-15 rule): the MXFP4 decode ratio breaks them, so the test above can fail."""
    hw = load_hardware("mi355x")
    g = hw.coefficients.gemm["bf16"]
    same = hw.coefficients.with_flat({f"gemm.{f}.{k}": getattr(g, k) for f in ("fp8", "fp4")
                                      for k in ("t0_s", "eta_mem", "eta_compute", "m_half")})
    spec = resolve_target(Target(hardware="mi355x", model="llama-3.1-8b")).model
    batch = StepBatch.from_requests([(2048, 1)] * 8)
    t = {q: RooflineStepTimeModel(hw, spec.with_dtypes(quantization=q), 1, same).breakdown(batch)["gemm"]
         for q in ("none", "mxfp4")}
    assert t["none"] / t["mxfp4"] > 2.5


@pytest.mark.parametrize("row_id", ["IX-L70-H100-FP8-1k1k", "IX-M3-H200-1k1k-c4"])
def test_unit_clock_recording_matches_a_timed_replay(row_id):
    """A closed loop's step order does not depend on step times: pricing the recorded
    batches equals running the twin with the real clock (the engine's figures, without
    the API server; this row ran async scheduling, whose GPU-bound steps follow each
    other back to back, so the step ends are the GPU parts' sums plus the first CPU part)."""
    from tuner.sim.engine import Simulator
    from tuner.sim.load import ClosedLoop
    from tuner.sim.settings import SimOptions

    rows, _ = load_rows()
    row = next(r for r in rows if r.id == row_id)
    small = type(row)(**{**{f: getattr(row, f) for f in row.__dataclass_fields__},
                         "num_prompts": 96, "concurrency": 16})
    run = record(small)
    res = run.resolved
    model = RooflineStepTimeModel(res.hardware, res.model, small.tp, res.step_time.coefficients)
    fig = run.figures(model, api=None)
    from tuner.perf.fit.benchmark_rows import row_requests
    reqs, nid = row_requests(small, res.cache.block_size)
    from dataclasses import replace
    cache = replace(res.cache, enable_prefix_caching=False, max_model_len=small.max_model_len)
    assert small.async_scheduling == (row_id == "IX-M3-H200-1k1k-c4")
    # the recording's clock: the replacement in the very next schedule (the fit prices the
    # step it misses itself, missed_step_s)
    timed = Simulator(reqs, res.default_settings, cache, model,
                      options=SimOptions(async_scheduling=small.async_scheduling),
                      load=ClosedLoop(16, replacement_misses_step=False), num_hash_ids=nid).run()
    done = [r for r in timed.requests if r.status == "finished"]
    span = max(r.finish_s for r in done)
    rel = 1e-3 if small.async_scheduling else 1e-9
    assert fig["total_tok_s"] == pytest.approx(
        sum(r.input_len + r.output_len for r in done) / span, rel=rel)
    assert fig["ttft_med"] == pytest.approx(1e3 * float(np.median([r.ttft_s for r in done])), rel=rel)
    # A replay's closed loop carries the missed step in its clock (docs/step-time-model.md
    # §1.4): its client TTFT (the API server layer) is the fit's, which adds the step
    # analytically, to the fit's approximation (the step priced as its neighbour, the
    # recorded batches kept); without the step the replay is a step short.
    from tuner.metrics import summarize
    from tuner.perf.api_server import api_server_cost

    client = run.figures(model)["ttft_med"]
    replayed = Simulator(reqs, res.default_settings, cache, model,
                         options=SimOptions(async_scheduling=small.async_scheduling),
                         load=ClosedLoop(16), num_hash_ids=nid).run()
    ttft = {name: 1e3 * summarize(result, api_server=api_server_cost(None)).ttft_p50_s
            for name, result in (("missed", replayed), ("old", timed))}
    assert ttft["missed"] == pytest.approx(client, rel=0.01)  # 0.2-0.4 % measured
    assert ttft["old"] < 0.95 * client


def test_rows_are_read_with_reasons_for_the_skipped():
    rows, skipped = load_rows(PUBLISHED_CSV)
    assert len(rows) + len(skipped) == 69
    assert {s.reason for s in skipped} >= {"TP size not stated"}
    s1 = next(r for r in rows if r.id == "K18-TP8-c64")
    assert (s1.kind, s1.tp, s1.quantization, s1.concurrency, s1.num_prompts) == ("closed", 8, "mxfp4", 64, 640)
    assert next(r for r in rows if r.id == "W4A6-offline-L8B-FP8").kind == "offline"
    assert next(r for r in rows if r.id == "ORA-L405-MI300X-bs8").kind == "batch"


def test_fit_reproduces_the_shipped_mi300x_presets():
    """Re-running the fit on the shipped CSV gives the shipped coefficients (MI300X: its
    rows replay in about a second; bench/calibration_fit.py checks every GPU)."""
    rows, _ = load_rows(PUBLISHED_CSV)
    runs = [record(r) for r in rows if r.hardware == "mi300x"]
    priors = {"mi300x": load_hardware("mi300x").coefficients}
    fitted, _ = fit_all(runs, priors)
    got = changed(fitted["mi300x"], priors["mi300x"])
    shipped = load_fitted()["hardware"]["mi300x"]["coefficients"]

    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
        return out

    a, b = flat(got), flat(shipped)
    assert set(a) == set(b)
    for k in a:
        assert math.isclose(a[k], b[k], rel_tol=1e-3), k
    assert all(fittable(r) is None for r in runs)


def test_calibrate_from_benchmarks_cli(tmp_path):
    """A user's own CSV (here: four MI300X rows) -> a fitted-presets file the twin loads."""
    import yaml
    from click.testing import CliRunner

    from tuner.cli import cli
    from tuner.perf.fit.published import default_coefficients

    lines = PUBLISHED_CSV.read_text().splitlines()
    keep = [lines[0]] + [ln for ln in lines[1:] if ln.startswith(("ORA-L405-MI300X-bs1,",
            "ORA-L405-MI300X-bs64,", "AMDP-L70-MI300X-lat-bs1,", "AMDP-L70-MI300X-lat-bs4,"))]
    csv = tmp_path / "mine.csv"
    csv.write_text("\n".join(keep) + "\n")
    out = tmp_path / "fitted.yaml"
    result = CliRunner().invoke(cli, ["calibrate", "--from-benchmarks", str(csv), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "4 rows replayed" in result.output and "median |error|" in result.output
    doc = yaml.safe_load(out.read_text())
    assert doc["hardware"]["mi300x"]["rows"] == sorted(
        ["ORA-L405-MI300X-bs1", "ORA-L405-MI300X-bs64", "AMDP-L70-MI300X-lat-bs1",
         "AMDP-L70-MI300X-lat-bs4"])
    hw = load_hardware("mi300x")
    assert default_coefficients(hw, path=str(out)) != hw.coefficients
    bad = tmp_path / "bad.csv"
    bad.write_text("id,hw\nx,mi300x\n")
    result = CliRunner().invoke(cli, ["calibrate", "--from-benchmarks", str(bad), "-o", str(out)])
    assert result.exit_code != 0 and "bad.csv:1: missing column(s)" in result.output
    assert "Traceback" not in result.output


def test_2024_rocm_rows_compute_fp8_as_bf16():
    """ROCm software of 2024 ran MI300X FP8 GEMMs at the BF16 rate (ROCm/TransformerEngine
    #73/#78; ``ROCM_FP8_FASTER_SINCE``): a row measured then prices its FP8 GEMMs' FLOPs
    with the BF16 ``eta_compute`` at the BF16 peak (so it informs the BF16 compute
    efficiency, not the FP8 one), with the FP8 bytes, ``eta_mem`` and tile terms; later
    rows, NVIDIA rows and rows without a date compute FP8 as FP8."""
    from tuner.perf.fit.benchmark_rows import gemm_compute_as

    assert gemm_compute_as("amd", "2024-10") == {"fp8": "bf16"}
    assert gemm_compute_as("amd", "2025-02") == gemm_compute_as("amd", "") == {}
    assert gemm_compute_as("nvidia", "2024-10") == {}
    rows, _ = load_rows(PUBLISHED_CSV)
    ora = next(r for r in rows if r.id == "ORA-L405-MI300X-bs1")
    amdp = next(r for r in rows if r.id == "AMDP-L70-MI300X-lat-bs1")
    assert (ora.measured, amdp.measured) == ("2024-10", "2025-10")
    old, new = record(ora).resolved.hardware, record(amdp).resolved.hardware
    assert old.gemm_compute_as == {"fp8": "bf16"} and new.gemm_compute_as == {}

    hw = load_hardware("mi300x")
    spec = resolve_target(Target(hardware="mi300x", model="llama-3.1-70b", tp=8,
                                 quantization="fp8")).model
    from dataclasses import replace
    now = RooflineStepTimeModel(hw, spec, 8)
    then = RooflineStepTimeModel(replace(hw, gemm_compute_as={"fp8": "bf16"}), spec, 8)
    c = hw.coefficients
    rate = {f: c.gemm_for(f).eta_compute * hw.peak(f) for f in ("bf16", "fp8")}
    # per dense kernel format: (memory s, compute s per token, compute s at M=0)
    for fmt, a, b in zip(sorted(now.shape["dense"]), now._dense, then._dense):
        assert b[0] == a[0]  # the FP8 weights stream as before
        ratio = rate["fp8"] / rate["bf16"] if fmt == "fp8" else 1.0
        assert b[1] == pytest.approx(a[1] * ratio) and b[2] == pytest.approx(a[2] * ratio)
    assert "fp8" in now.shape["dense"]
    # the FP8 rows' compute moves with the BF16 eta_compute, not the FP8 one
    slower = replace(c, gemm={**c.gemm, "bf16": replace(c.gemm_for("bf16"), eta_compute=0.27)})
    halved = RooflineStepTimeModel(replace(hw, gemm_compute_as={"fp8": "bf16"}), spec, 8, slower)
    fmt_i = sorted(now.shape["dense"]).index("fp8")
    assert halved._dense[fmt_i][1] == pytest.approx(
        then._dense[fmt_i][1] * c.gemm_for("bf16").eta_compute / 0.27)
    prefill = StepBatch.from_requests([(0, 8192)])  # compute-bound: FP8 GEMMs at BF16's rate
    assert then.breakdown(prefill)["gemm"] / now.breakdown(prefill)["gemm"] == pytest.approx(
        rate["fp8"] / rate["bf16"], rel=0.05)
