"""Decode attention's work items (issue 27, generation attention): one split-KV work item
per request and KV head. Each costs a latency on one SM/CU that KV bandwidth does not hide
(``attn_decode_item_s``: many short requests pay it), and few items read the KV cache
below full bandwidth (``attn_decode_half_items``: one long request on one KV head). Each
test fails if its term is dropped (the model before priced both as a flat KV read with
one occupancy floor per step, 23-27 % fast against aiconfigurator-core's tables)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tuner.perf.hardware import load_hardware
from tuner.perf.models import load_model
from tuner.perf.step_time import RooflineStepTimeModel
from tuner.sim.batch import StepBatch

H100 = load_hardware("h100")
MI355X = load_hardware("mi355x")
L8 = load_model("llama-3.1-8b")
L70 = load_model("llama-3.1-70b")


def _decode(reqs: int, ctx: int) -> StepBatch:
    return StepBatch(num_decode_reqs=reqs, decode_ctx_tokens=reqs * ctx)


def _attention(hw, model, tp, c, batch):  # type: ignore[no-untyped-def]
    return RooflineStepTimeModel(hw, model, tp, c).breakdown(batch)["attention"]


def _kv_write(hw, model, tp, c, reqs):  # type: ignore[no-untyped-def]
    return reqs * model.kv_bytes_per_token(tp) / (c.kv_bw_eff * hw.hbm_bandwidth)


def test_many_short_requests_pay_the_work_items_latency():
    """2,048 two-token requests on Llama-3.1-8B (8 KV heads, one H100): 16,384 work items
    per layer x 4.55 us / 132 SMs = 565 us a layer (aiconfigurator-core's h100_sxm table:
    443 us measured at 32 heads / 8 KV heads), where the KV read is 0.2 us."""
    c = H100.coefficients
    assert c.attn_decode_item_s > 0
    batch = _decode(2048, 2)
    got = _attention(H100, L8, 1, c, batch) - _kv_write(H100, L8, 1, c, 2048)
    items = 2048 * 8 * L8.num_layers
    assert got == pytest.approx(items * c.attn_decode_item_s / H100.compute_units, rel=1e-9)
    off = _attention(H100, L8, 1, dataclasses.replace(c, attn_decode_item_s=0.0), batch)
    assert got > 10 * (off - _kv_write(H100, L8, 1, c, 2048))


def test_few_work_items_read_the_kv_cache_below_full_bandwidth():
    """One 131k-token request on one KV head (Llama-3.1-70B at TP8): split-KV spreads it
    over the SMs but at a lower bandwidth per CTA (measured 51 us a layer on H100 against
    24 us at the full KV bandwidth): the read costs (1 + half_items / items) times more,
    and 64 requests almost nothing more."""
    c = H100.coefficients
    off = dataclasses.replace(c, attn_decode_half_items=0.0)
    for reqs, ratio in ((1, 1 + c.attn_decode_half_items), (64, 1 + c.attn_decode_half_items / 64)):
        batch = _decode(reqs, 131072)
        w = _kv_write(H100, L70, 8, c, reqs)
        assert (_attention(H100, L70, 8, c, batch) - w) == pytest.approx(
            ratio * (_attention(H100, L70, 8, off, batch) - w), rel=1e-9)
    assert c.attn_decode_half_items > 1.0


def test_hot_path_and_terms_agree_and_the_bench_prices_as_the_replay():
    """step_time_s folds the terms into constants; terms() prices arrays; the kernel bench
    (bench/aic_kernels.generation_attention_s) prices one layer: all three agree."""
    from bench.aic_kernels import generation_attention_s

    c = H100.coefficients
    model = RooflineStepTimeModel(H100, L70, 8, c)
    for reqs, ctx in ((1, 131072), (7, 3000), (512, 64), (2048, 2)):
        batch = _decode(reqs, ctx)
        t = model.terms(0.0, float(reqs), 0.0, 0.0, 0.0, float(reqs * ctx))
        assert model.step_time_s(batch) == pytest.approx(sum(t.values()), rel=1e-12)
        one = generation_attention_s(c, H100, np.array([reqs]), np.array([ctx]), 8.0, 1.0,
                                     128.0, 2 * 1 * 128 * 2.0)[0] - c.attn_floor_s
        assert model.breakdown(batch)["attention"] == pytest.approx(one * L70.num_layers,
                                                                    rel=1e-9)


def test_amd_prices_the_structure_with_its_own_compute_units_once_measured():
    """No AMD decode-attention measurement: the AMD presets leave both terms off (priced as
    before, docs/step-time-model.md §10). Given the H100 item latency, MI355X spreads the
    same 2,048 x 8 work items over its 256 CUs."""
    assert (MI355X.coefficients.attn_decode_item_s,
            MI355X.coefficients.attn_decode_half_items) == (0.0, 0.0)
    c = dataclasses.replace(MI355X.coefficients,
                            attn_decode_item_s=H100.coefficients.attn_decode_item_s)
    got = _attention(MI355X, L8, 1, c, _decode(2048, 2)) - _kv_write(MI355X, L8, 1, c, 2048)
    assert got == pytest.approx(2048 * 8 * L8.num_layers * c.attn_decode_item_s / 256,
                                rel=1e-9)


def test_an_fp8_kv_cache_is_read_at_its_own_bandwidth():
    """An fp8 KV cache halves the bytes but the decode kernel dequantises every element:
    aiconfigurator-core's H200 table reads bf16 KV at ~0.87-0.91 of HBM bandwidth, fp8 KV
    at ~0.51-0.63. The NVIDIA presets carry ``kv_fp8_bw_eff`` (fitted to the tables), so
    64 requests at 8k context on Llama-3.1-70B TP8 read their fp8 KV at that fraction, not
    at ``kv_bw_eff`` (which would price it 1.6x too fast on H200). Writes keep kv_bw_eff."""
    h200 = load_hardware("h200")
    c = h200.coefficients
    assert c.kv_fp8_bw_eff is not None and c.kv_fp8_bw_eff < 0.8 * c.kv_bw_eff
    fp8 = L70.with_dtypes(kv_cache_dtype="fp8")
    assert fp8.kv_dtype == "fp8"
    batch = _decode(64, 8192)
    read = 64 * 8192 * fp8.kv_bytes_per_token(8) * (1 + c.attn_decode_half_items / 64)
    got = _attention(h200, fp8, 8, c, batch) - _kv_write(h200, fp8, 8, c, 64)
    assert got == pytest.approx(read / (c.kv_fp8_bw_eff * h200.hbm_bandwidth), rel=1e-9)
    # the format's own efficiency, not the bf16 one, and bf16 KV is untouched by it
    same = dataclasses.replace(c, kv_fp8_bw_eff=None)
    assert got > 1.5 * (_attention(h200, fp8, 8, same, batch) - _kv_write(h200, fp8, 8, c, 64))
    assert _attention(h200, L70, 8, c, batch) == _attention(h200, L70, 8, same, batch)
    # AMD: no measurement, the presets leave it unset (fp8 KV read at kv_bw_eff)
    assert MI355X.coefficients.kv_fp8_bw_eff is None


def test_the_bench_reads_fp8_kv_as_the_replay_does():
    """bench/aic_kernels.generation_attention_s (what --fit-generation fits
    kv_fp8_bw_eff with) prices an fp8 row as the step-time model prices an fp8 cache."""
    from bench.aic_kernels import generation_attention_s

    h200 = load_hardware("h200")
    c = h200.coefficients
    fp8 = L70.with_dtypes(kv_cache_dtype="fp8")
    model = RooflineStepTimeModel(h200, fp8, 8, c)
    for reqs, ctx in ((1, 131072), (64, 8192), (2048, 2)):
        one = generation_attention_s(c, h200, np.array([reqs]), np.array([ctx]), 8.0, 1.0,
                                     128.0, 2 * 1 * 128 * 1.0, np.array([True]))[0]
        assert model.breakdown(_decode(reqs, ctx))["attention"] == pytest.approx(
            (one - c.attn_floor_s) * L70.num_layers, rel=1e-9)
