"""The M-tile staircase of a GEMM family that dispatches on M to fixed tiles (issue 27,
kernels33): vLLM's per-tensor FP8 GEMM on Hopper (CUTLASS ``scaled_mm_sm90_fp8``) computes
M rounded up to its bucket's tile, so its time jumps where M crosses 64, 128, 256 and each
multiple of 256. Each test fails if the padding is dropped or leaks into formats without
it (the previous model priced M as it is, the tile terms' smooth ``m_half`` alone)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tuner.errors import ConfigError
from tuner.perf.fit.coefficients import GemmCoefficients, tile_rows, tile_rows_array
from tuner.perf.hardware import load_hardware
from tuner.perf.models import load_model
from tuner.perf.step_time import RooflineStepTimeModel
from tuner.sim.batch import StepBatch

H100 = load_hardware("h100")
L70 = load_model("llama-3.1-70b")
FP8_70B = dataclasses.replace(L70, weight_dtype="fp8", attn_weight_dtype="fp8")


def test_tile_rows_follow_the_sm90_fp8_dispatch():
    """M <= 16 -> 16 rows, (16, 64] -> 64 (32 for 17-32), (64, 128] -> two 64-row tiles,
    (128, 256] -> one 2 x 1 cluster of 128-row tiles, then whole 256-row clusters."""
    cases = {1: 16, 16: 16, 17: 32, 33: 64, 64: 64, 65: 128, 128: 128, 129: 256, 256: 256,
             257: 512, 512: 512, 513: 768, 1025: 1280, 8192: 8192}
    for m, rows in cases.items():
        assert tile_rows(m, 256.0) == rows, m
        assert tile_rows(float(m), 256.0) == rows, m
    ms = np.arange(1, 5000, dtype=np.float64)
    vec = tile_rows_array(ms, 256.0)
    assert np.array_equal(vec, [tile_rows(float(m), 256.0) for m in ms])
    assert tile_rows_array(np.array([0.0, 3.0]), 256.0).tolist() == [0.0, 16.0]


def test_only_powers_of_two_from_the_narrowest_tile_are_tiles():
    for bad in (100.0, 8.0, -256.0):
        with pytest.raises(ConfigError, match="m_tile"):
            GemmCoefficients(m_tile=bad)
    assert GemmCoefficients(m_tile=0.0).m_tile == 0.0
    assert GemmCoefficients(m_tile=128.0).m_tile == 128.0


def test_hopper_fp8_prefill_pays_whole_tiles():
    """A compute-bound FP8 prefill of 257 tokens costs the GEMM time of 512 on H100 (one
    more 256-row cluster), 256 tokens that of 256; the bf16 model (no M tiles) and an
    FP8 model with the staircase removed price the tokens as they are."""
    c = H100.coefficients
    assert c.gemm_for("fp8").m_tile == 256.0 and c.gemm_for("bf16").m_tile == 0.0
    model = RooflineStepTimeModel(H100, FP8_70B, 8, c)
    gemm = {n: model.breakdown(StepBatch.from_requests([(0, n)]))["gemm"]
            for n in (256, 257, 512)}
    assert gemm[257] == pytest.approx(gemm[512], rel=1e-12)
    assert gemm[257] > 1.5 * gemm[256]
    smooth = dataclasses.replace(c, gemm={**c.gemm, "fp8": dataclasses.replace(
        c.gemm_for("fp8"), m_tile=0.0)})
    flat = RooflineStepTimeModel(H100, FP8_70B, 8, smooth)
    g256, g257 = (flat.breakdown(StepBatch.from_requests([(0, n)]))["gemm"] for n in (256, 257))
    assert g257 / g256 < 1.01
    # a multiple of the tile prices exactly as without the staircase
    assert gemm[512] == pytest.approx(flat.breakdown(StepBatch.from_requests([(0, 512)]))["gemm"])
    bf16 = RooflineStepTimeModel(H100, L70, 8, c)
    b256, b257 = (bf16.breakdown(StepBatch.from_requests([(0, n)]))["gemm"] for n in (256, 257))
    assert b257 / b256 < 1.01


@pytest.mark.parametrize("n", [1, 17, 100, 257, 700, 3000])
def test_hot_path_and_explained_terms_agree_on_padded_tokens(n):
    model = RooflineStepTimeModel(H100, FP8_70B, 8)
    batch = StepBatch.from_requests([(0, n)])
    assert model.step_time_s(batch) == pytest.approx(sum(model.breakdown(batch).values()),
                                                     rel=1e-12)
    arrays = model.terms(np.array([1.0]), np.array([0.0]), np.array([float(n)]),
                         np.array([0.0]), np.array([n * (n + 1) / 2]), np.array([0.0]),
                         maximum=np.maximum, minimum=np.minimum)
    assert float(arrays["gemm"][0]) == pytest.approx(model.breakdown(batch)["gemm"], rel=1e-12)


def test_the_kernel_bench_prices_fp8_gemms_with_the_same_tiles():
    """bench/aic_kernels.py's per-kernel formula pads M as the step-time model does."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "aic_kernels.py"
    spec = importlib.util.spec_from_file_location("aic_kernels_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # type: ignore[union-attr]
    g = H100.coefficients.gemm_for("fp8")
    m = np.array([256.0, 257.0, 512.0])
    t = bench.gemm_s(g, H100, "fp8", m, np.full(3, 28672.0), np.full(3, 8192.0))
    assert t[1] == pytest.approx(t[2]) and t[1] > 1.5 * t[0]


def test_the_staircase_is_what_the_measured_fp8_table_shows():
    """Against aiconfigurator-core's H100 per-tensor FP8 table (CUTLASS scaled-mm, one
    kernel per shape), the preset's prior with its M tiles is closer than the same prior
    with M as it is, and the error no longer jumps across a tile edge (M = 512 / 513: the
    smooth form is ~+30 % / ~-4 % there)."""
    import importlib.util

    if importlib.util.find_spec("aiconfigurator_core") is None:
        pytest.skip("aiconfigurator-core not installed (pip install -e '.[aic]')")
    pl = pytest.importorskip("polars")
    from tuner.perf.models import aic_model_dir

    files = sorted((aic_model_dir().parent / "systems" / "data" / "h100_sxm" / "gemm"
                    / "vllm").glob("*/gemm_perf.parquet"))
    d = pl.read_parquet(files[-1]).filter(pl.col("gemm_dtype") == "fp8").group_by(
        ["m", "n", "k"]).agg(pl.col("latency").min())
    m, n, k = (d[x].to_numpy().astype(float) for x in ("m", "n", "k"))
    y = d["latency"].to_numpy() * 1e-3
    serving = (n >= 512) & (k >= 512)

    def error(g: GemmCoefficients) -> np.ndarray:
        rows = tile_rows_array(m, g.m_tile) if g.m_tile else m
        mem = n * k / (g.eta_mem * H100.hbm_bandwidth)
        cmp = 2 * g.flop_elems(n * k, n, k, 1.0) * (rows + g.m_half) / (
            g.eta_compute * H100.peak("fp8"))
        return (g.t0_s + np.maximum(mem, cmp)) / y - 1.0

    g = H100.coefficients.gemm_for("fp8")
    tiled, smooth = error(g), error(dataclasses.replace(g, m_tile=0.0))
    assert np.median(np.abs(tiled[serving])) < np.median(np.abs(smooth[serving])) - 0.005
    jump = [np.median(e[m == 512]) - np.median(e[m == 513]) for e in (tiled, smooth)]
    assert abs(jump[0]) < 0.1 < jump[1]
