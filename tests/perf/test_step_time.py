"""Step-time model: limiting regimes from hand formulas, monotonicity, TP, MoE, MLA,
the features/from_linear identity, and the worked example in docs/step-time-model.md.

Run ``python tests/sim/test_step_time.py`` to print the doc's worked-example block.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.errors import ConfigError
from tuner.sim.batch import StepBatch
from tuner.perf.hardware import load_hardware
from tuner.perf.models import list_models, load_model
from tuner.perf.step_time import FEATURE_NAMES, Coefficients, RooflineStepTimeModel, StepTimeModel

DOC = Path(__file__).resolve().parents[2] / "docs" / "step-time-model.md"

MI355X = load_hardware("mi355x")
H100 = load_hardware("h100")
L70 = load_model("llama-3.1-70b")
L8 = load_model("llama-3.1-8b")
DSV3 = load_model("deepseek-v3")
GPTOSS = load_model("gpt-oss-120b")


def decode(n: int, ctx: int) -> StepBatch:
    """``n`` decode requests, each with ``ctx`` tokens already computed."""
    return StepBatch.from_requests([(ctx, 1)] * n)


def prefill(tokens: int, ctx: int = 0) -> StepBatch:
    return StepBatch.from_requests([(ctx, tokens)])


def test_is_a_step_time_model_and_empty_batch_costs_nothing():
    model = RooflineStepTimeModel(MI355X, L70, 8)
    assert isinstance(model, StepTimeModel)
    assert model.step_time_s(StepBatch()) == 0.0


def test_small_batch_decode_is_bandwidth_bound():
    """One decode token: weights / (BW x 0.8) + all-reduce latency + overheads."""
    c = Coefficients()
    model = RooflineStepTimeModel(MI355X, L70, 8, c)
    g = L70.param_groups()
    # every weight but the input embedding is streamed once; bf16, split 8 ways
    weight_s = (L70.total_params - g["embed"]) * 2 / 8 / (8.0e12 * c.weight_bw_eff)
    # KV: read the context token and itself, write itself (8 kv heads over 8 ranks: 1 each)
    kv_s = 3 * (2 * 80 * 1 * 128 * 2) / (8.0e12 * c.kv_bw_eff)
    calls = 2 * 80 + 1
    ar_s = calls * 10e-6 + calls * (2 * 7 / 8) * 8192 * 2 / (537.6e9 * c.allreduce_bw_eff)
    overhead = c.step_overhead_s + c.request_overhead_s + 80 * c.layer_overhead_decode_s
    expected = weight_s + kv_s + ar_s + overhead
    got = model.step_time_s(decode(1, 1))
    assert got == pytest.approx(expected, rel=1e-3)
    b = model.breakdown(decode(1, 1))
    assert b["bounds"]["dense"] == "memory" and b["bounds"]["attention"] == "memory"


def test_big_prefill_is_compute_bound():
    """A 16k-token prefill on one H100: 2 x params x tokens / (peak x MFU) dominates."""
    c = Coefficients()
    model = RooflineStepTimeModel(H100, L8, 1, c)
    tokens = 16384
    g = L8.param_groups()
    matmul_params = L8.active_params - g["lm_head"] - g["norms"]
    dense_s = (2 * matmul_params * tokens + 2 * g["lm_head"]) / (989e12 * c.mfu_prefill)
    b = model.breakdown(prefill(tokens))
    assert b["bounds"]["dense"] == "compute"
    assert b["dense"] == pytest.approx(dense_s, rel=1e-6)
    pairs = tokens * (tokens + 1) / 2
    attn_s = pairs * 4 * 32 * 128 * 32 / (989e12 * c.attn_prefill_eff)
    assert b["attention"] == pytest.approx(attn_s, rel=1e-6)
    assert b["allreduce"] == 0.0  # TP1: no collective
    total = model.step_time_s(prefill(tokens))
    assert dense_s + attn_s < total < (dense_s + attn_s) * 1.02


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 512), ctx=st.integers(0, 60000), extra=st.integers(1, 4096))
def test_more_tokens_and_longer_context_never_cost_less(n, ctx, extra):
    for model in (RooflineStepTimeModel(MI355X, L70, 8), RooflineStepTimeModel(H100, DSV3, 8),
                  RooflineStepTimeModel(MI355X, GPTOSS, 2)):
        base = model.step_time_s(decode(n, ctx))
        assert model.step_time_s(decode(n + extra, ctx)) >= base
        assert model.step_time_s(decode(n, ctx + extra)) >= base
        p = model.step_time_s(prefill(n, ctx))
        assert model.step_time_s(prefill(n + extra, ctx)) >= p
        assert model.step_time_s(prefill(n, ctx + extra)) >= p


def test_longer_context_costs_strictly_more_when_kv_dominates():
    model = RooflineStepTimeModel(MI355X, L70, 8)
    assert model.step_time_s(decode(128, 16384)) > model.step_time_s(decode(128, 8192)) * 1.2


def test_tensor_parallel_scaling():
    times = {tp: RooflineStepTimeModel(MI355X, L70, tp) for tp in (1, 2, 4, 8)}
    small = decode(1, 1024)
    dense = {tp: m.breakdown(small)["dense"] for tp, m in times.items()}
    for tp in (2, 4, 8):
        assert dense[tp] == pytest.approx(dense[1] / tp, rel=0.01)  # weights split tp ways
    t = {tp: m.step_time_s(small) for tp, m in times.items()}
    assert t[1] > t[2] > t[4] > t[8]
    assert times[1].breakdown(small)["allreduce"] == 0.0
    assert times[8].breakdown(small)["allreduce"] > times[2].breakdown(small)["allreduce"]
    with pytest.raises(ConfigError, match="must divide"):
        RooflineStepTimeModel(MI355X, L70, 3)


def test_moe_reads_only_touched_experts():
    model = RooflineStepTimeModel(MI355X, DSV3, 8)
    per_expert = DSV3.weight_bytes_per_gpu(8)["experts"] / 256
    bw = 8.0e12 * Coefficients().weight_bw_eff
    one = model.breakdown(decode(1, 100))["experts_mem_s"]
    assert one == pytest.approx(8 * per_expert / bw, rel=1e-9)  # top-8 of 256
    for n in (4, 32, 128, 4096):
        mem = model.breakdown(decode(n, 100))["experts_mem_s"]
        assert mem <= min(256, 8 * n) * per_expert / bw * (1 + 1e-9)
    assert model.breakdown(decode(4096, 100))["experts_mem_s"] == pytest.approx(
        256 * per_expert / bw, rel=1e-3)
    # active, not total, parameters drive compute
    big = model.breakdown(prefill(8192))
    assert big["bounds"]["experts"] == "compute"


def test_mla_decode_attention_uses_the_latent_dims():
    c = Coefficients()
    model = RooflineStepTimeModel(MI355X, DSV3, 8, c)
    b = model.breakdown(decode(64, 4095))
    ctx = 64 * 4096
    per_pair = 2 * (128 / 8) * (2 * 512 + 64) * 61  # absorbed QK (latent + rope) and PV
    assert b["attention_compute_s"] == pytest.approx(ctx * per_pair / (2500e12 * c.attn_decode_eff))
    kv = (ctx + 64) * 576 * 2 * 61  # latent + rope per layer, bf16, replicated per rank
    assert b["attention_mem_s"] == pytest.approx(kv / (8.0e12 * c.kv_bw_eff))


def test_sliding_window_layers_read_at_most_the_window():
    model = RooflineStepTimeModel(MI355X, GPTOSS, 1)
    short = model.breakdown(decode(1, 1000))["attention_mem_s"]
    long_ = model.breakdown(decode(1, 100_900))["attention_mem_s"]
    per_layer = 2 * 8 * 64 * 2
    # only the 18 full layers grow with context
    assert long_ - short == pytest.approx(99_900 * 18 * per_layer / (8.0e12 * 0.8), rel=1e-9)


@settings(max_examples=80, deadline=None)
@given(items=st.lists(st.tuples(st.integers(0, 40000), st.integers(1, 3000)), min_size=1,
                      max_size=40),
       name=st.sampled_from(list_models()), tp=st.sampled_from([1, 2, 8]),
       hw=st.sampled_from(["mi355x", "h100", "b200"]))
def test_fast_path_equals_breakdown_and_feature_dot(items, name, tp, hw):
    """The hot path, the explained breakdown and theta.features agree on any batch."""
    hardware = load_hardware(hw)
    model = RooflineStepTimeModel(hardware, load_model(name), tp)
    batch = StepBatch.from_requests(items)
    t = model.step_time_s(batch)
    b = model.breakdown(batch)
    parts = b["dense"] + b["experts"] + b["attention"] + b["allreduce"] + b["overhead"]
    assert t == pytest.approx(parts, rel=1e-9)
    f = model.features(batch)
    theta = model.coefficients.theta(hardware)
    assert len(f) == len(theta) == len(FEATURE_NAMES)
    assert t == pytest.approx(sum(a * x for a, x in zip(theta, f)), rel=1e-9)


def test_from_linear_round_trip_and_zero_weights_keep_base():
    c = Coefficients(weight_bw_eff=0.7, mfu_prefill=0.55, step_overhead_s=3e-4,
                     allreduce_latency_s=7e-6)
    theta = c.theta(MI355X)
    rebuilt = RooflineStepTimeModel.from_linear(MI355X, L70, 8, theta)
    assert rebuilt.coefficients == c
    batch = StepBatch.from_requests([(4000, 1)] * 50 + [(0, 2000)])
    assert rebuilt.step_time_s(batch) == RooflineStepTimeModel(MI355X, L70, 8, c).step_time_s(batch)
    zeros = list(theta)
    zeros[6] = 0.0  # no prefill data in a fit: mfu_prefill keeps the base value
    assert Coefficients.from_theta(zeros, base=c).mfu_prefill == 0.55
    with pytest.raises(ConfigError, match="non-negative"):
        Coefficients.from_theta([-1.0] + list(theta[1:]))
    with pytest.raises(ConfigError, match="expected 12"):
        Coefficients.from_theta(theta[:3])


@pytest.mark.parametrize("field,value", [("mfu_prefill", 0.0), ("weight_bw_eff", 2.0),
                                         ("step_overhead_s", -1e-3), ("kv_bw_eff", "fast")])
def test_bad_coefficients_are_refused(field, value):
    with pytest.raises(ConfigError, match=field):
        Coefficients(**{field: value})


def test_calibrated_coefficients_change_the_time():
    slow = Coefficients(weight_bw_eff=0.4)
    b = decode(8, 1000)
    assert (RooflineStepTimeModel(MI355X, L70, 8, slow).step_time_s(b)
            > RooflineStepTimeModel(MI355X, L70, 8).step_time_s(b))


# ---------------------------------------------------------- worked example
def worked_example_markdown() -> str:
    """The block between the markers in docs/step-time-model.md, computed now."""
    from tuner.perf.capacity import kv_capacity

    model = RooflineStepTimeModel(MI355X, L70, 8)
    block = MI355X.block_size_for(L70.backend_kind)
    cap = kv_capacity(MI355X, L70, 8, block, 0.92, max_num_batched_tokens=16384,
                      max_num_seqs=1024)
    lines = ["| quantity | decode: 128 requests at 8k context | prefill: one 8192-token prompt |",
             "|---|---|---|"]
    d = model.breakdown(decode(128, 8191))
    p = model.breakdown(prefill(8192))
    rows = [("dense weights, memory (ms)", "dense_mem_s"), ("dense matmul, compute (ms)", "dense_compute_s"),
            ("dense = max (ms)", "dense"), ("attention KV, memory (ms)", "attention_mem_s"),
            ("attention FLOPs, compute (ms)", "attention_compute_s"), ("attention = max (ms)", "attention"),
            ("TP all-reduce (ms)", "allreduce"), ("overheads (ms)", "overhead")]
    for label, key in rows:
        lines.append(f"| {label} | {d[key] * 1e3:.3f} | {p[key] * 1e3:.3f} |")
    td, tp_ = model.step_time_s(decode(128, 8191)), model.step_time_s(prefill(8192))
    lines.append(f"| **step time (ms)** | **{td * 1e3:.3f}** | **{tp_ * 1e3:.3f}** |")
    lines.append(f"| bound (dense / attention) | {d['bounds']['dense']} / {d['bounds']['attention']} "
                 f"| {p['bounds']['dense']} / {p['bounds']['attention']} |")
    lines.append(f"| tokens/s per engine | {128 / td:,.0f} (output) | {8192 / tp_:,.0f} (prompt) |")
    lines.append("")
    lines.append(f"KV capacity (block {block}, gpu_memory_utilization 0.92, 16384/1024 batch defaults): "
                 f"requested {cap.requested_bytes / 2**30:.2f} GiB, weights "
                 f"{cap.weight_bytes / 2**30:.2f} GiB, activations {cap.activation_bytes / 2**30:.2f} GiB, "
                 f"non-torch {cap.non_torch_bytes / 2**30:.2f} GiB, graphs {cap.cudagraph_bytes / 2**30:.2f} GiB, "
                 f"KV {cap.kv_bytes / 2**30:.2f} GiB "
                 f"/ {cap.bytes_per_block / 2**10:.0f} KiB per block = **{cap.num_gpu_blocks:,} blocks "
                 f"= {cap.num_tokens:,} tokens** per GPU (and per TP8 engine).")
    return "\n".join(lines)


def test_doc_worked_example_matches_the_code():
    text = DOC.read_text()
    m = re.search(r"<!-- worked-example:start -->\n(.*?)\n<!-- worked-example:end -->", text, re.S)
    assert m, "docs/step-time-model.md lost its worked-example markers"
    assert m.group(1).strip() == worked_example_markdown().strip(), (
        "docs/step-time-model.md worked example is stale; regenerate it with "
        "`python tests/sim/test_step_time.py`")


def test_doc_lists_every_coefficient_with_its_default():
    text = DOC.read_text()
    for name, value in Coefficients().to_dict().items():
        assert f"`{name}`" in text, name
        if value is not None:
            assert re.search(rf"`{name}`[^\n]*\b{re.escape(_fmt(value))}\b", text), (name, value)


def _fmt(value: float) -> str:
    return f"{value:g}"


if __name__ == "__main__":
    print(worked_example_markdown())
