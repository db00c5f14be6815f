"""Gated DeltaNet layers in the step-time model (tuner/perf/linear_attention.py)."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

from tuner.perf import linear_attention as gdn
from tuner.perf.hardware import load_hardware
from tuner.perf.models import load_model
from tuner.perf.step_time import RooflineStepTimeModel
from tuner.sim.batch import StepBatch

QWEN36 = load_model("tuner/perf/data/models/Qwen--Qwen3.6-27B.json")
MI355X = load_hardware("mi355x")


def test_qwen36_config_gives_the_gdn_shape_and_an_fp32_state():
    m = QWEN36
    assert (m.num_linear_layers, m.num_full_layers) == (48, 16)
    assert (m.linear_num_key_heads, m.linear_num_value_heads) == (16, 48)
    assert (m.linear_key_head_dim, m.linear_value_head_dim) == (128, 128)
    assert m.linear_state_bytes == 4.0  # mamba_ssm_dtype: float32


def test_decode_pays_the_state_read_and_write_of_every_request():
    step = RooflineStepTimeModel(MI355X, QWEN36, 2)
    bw = MI355X.hbm_bandwidth
    state_rw = 2 * 24 * 128 * 128 * 4.0  # 24 value heads per rank at TP2
    conv = 2 * (2 * 8 * 128 + 24 * 128) * 2.0
    per_req = 48 * (state_rw / (gdn.DECODE_STATE_EFF * bw) + conv / (gdn.DECODE_CONV_EFF * bw))
    k = gdn.linear_constants(MI355X, QWEN36, 2)
    base = StepBatch(num_decode_reqs=1, decode_ctx_tokens=1000)
    many = StepBatch(num_decode_reqs=65, decode_ctx_tokens=65 * 1000)
    assert gdn.linear_attention_s(k, many) - gdn.linear_attention_s(k, base) == \
        pytest.approx(64 * per_req, rel=1e-9)
    assert k[0] == pytest.approx(48 * gdn.DECODE_FLOOR_S)
    # the step's attention term is the 16 full layers plus the 48 GDN layers
    assert step.breakdown(many)["attention"] > gdn.linear_attention_s(k, many)
    assert sum(step.breakdown(many).values()) == pytest.approx(step.step_time_s(many), rel=1e-12)


def test_prefill_runs_the_chunked_scan_and_a_mixed_step_both_kernels():
    step = RooflineStepTimeModel(MI355X, QWEN36, 1)
    k = gdn.linear_constants(MI355X, QWEN36, 1)
    flops = 48 * (4 * 128 * 128 + 2 * 64 * 256 + 2 * 64 * 128)
    assert k[4] > 48 * flops / (gdn.PREFILL_FLOP_EFF * MI355X.peak("bf16"))
    mixed = StepBatch(num_prefill_reqs=1, num_prefill_tokens=2048,
                      prefill_attn_pairs=2048 * 2049 / 2, num_decode_reqs=8,
                      decode_ctx_tokens=8000)
    assert gdn.linear_attention_s(k, mixed) == pytest.approx(
        k[0] + 8 * k[1] + k[2] + k[3] + 2048 * k[4])
    # at decode the 48 layers' fp32 states (6.3 MB read + written per request and layer)
    # outweigh the 16 full layers' KV reads of a 1000-token context
    dec = StepBatch(num_decode_reqs=256, decode_ctx_tokens=256 * 1000)
    full_attention = step.breakdown(dec)["attention"] - gdn.linear_attention_s(k, dec)
    assert gdn.linear_attention_s(k, dec) > 2 * full_attention


@pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None,
                    reason="aiconfigurator-core not installed (pip install -e '.[aic]')")
def test_constants_reproduce_the_measured_h200_gdn_kernels():
    pl = pytest.importorskip("polars")
    from tuner.perf.models import aic_model_dir

    path = (aic_model_dir().parent / "systems" / "data" / "h200_sxm" / "linear_attention"
            / "vllm" / "0.24.0" / "gdn_perf.parquet")
    d = (pl.read_parquet(path).filter(pl.col("model_name") == "Qwen/Qwen3.5-27B")
         .group_by(["phase", "batch_size", "seq_len", "num_k_heads", "num_v_heads"])
         .agg(pl.col("latency").sum()))  # conv + scan kernels of one layer
    h200 = load_hardware("h200")
    for phase, limit in (("generation", 0.08), ("context", 0.25)):
        errs = []
        for row in d.filter(pl.col("phase") == phase).iter_rows(named=True):
            m = dataclasses.replace(QWEN36, num_linear_layers=1,
                                    linear_num_key_heads=row["num_k_heads"],
                                    linear_num_value_heads=row["num_v_heads"])
            k = gdn.linear_constants(h200, m, 1)
            b, s = row["batch_size"], row["seq_len"]
            batch = (StepBatch(num_decode_reqs=b, decode_ctx_tokens=b * 100)
                     if phase == "generation" else
                     StepBatch(num_prefill_reqs=b, num_prefill_tokens=b * s))
            errs.append(abs(gdn.linear_attention_s(k, batch) / (row["latency"] * 1e-3) - 1))
        assert np.median(errs) < limit, (phase, np.median(errs))
