"""Step-time model: limiting regimes from hand formulas, monotonicity, TP, MoE, MLA,
the scalar/terms/vectorised identity, and the worked example in docs/step-time-model.md.

Run ``python tests/perf/test_step_time.py`` to print the doc's worked-example block.
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
from tuner.perf.fit.coefficients import Coefficients, GemmCoefficients
from tuner.perf.fit.parameters import batch_arrays, step_times
from tuner.perf.step_time import RooflineStepTimeModel, StepTimeModel

DOC = Path(__file__).resolve().parents[2] / "docs" / "step-time-model.md"
DATA = Path(__file__).resolve().parents[2] / "tuner" / "perf" / "data" / "models"

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


def test_small_batch_decode_is_floors_plus_weight_streaming():
    """One decode token: CPU + floors + weights / (eta_mem BW) + KV + all-reduce."""
    c = MI355X.coefficients
    model = RooflineStepTimeModel(MI355X, L70, 8, c)
    g = L70.param_groups()
    bf16 = c.gemm["bf16"]
    # every weight but the input embedding is streamed once; bf16, split 8 ways
    weight_s = (L70.total_params - g["embed"]) * 2 / 8 / (8.0e12 * bf16.eta_mem)
    kv_read = 1 * (2 * 80 * 1 * 128 * 2) / (8.0e12 * c.kv_bw_eff)
    occupancy = c.attn_chunk_tokens * 256 / 1 * (2 * 80 * 128 * 2) / (8.0e12 * c.kv_bw_eff)
    kv_write = (2 * 80 * 1 * 128 * 2) / (8.0e12 * c.kv_bw_eff)
    calls = 2 * 80 + 1
    link = 537.6e9 * c.allreduce_bw_eff
    ar_s = calls * (10e-6 + (2 * 7 / 8) * (8192 * 2 + c.allreduce_half_bytes) / link)
    floors = (80 * 4 + 1) * bf16.t0_s + 80 * c.attn_floor_s + 80 * c.layer_overhead_decode_s
    cpu = c.step_overhead_s + c.request_overhead_s
    sampling = 4 * 128256 * 4 / 8.0e12
    expected = cpu + floors + weight_s + max(kv_read, occupancy) + kv_write + ar_s + sampling
    got = model.step_time_s(decode(1, 1))
    assert got == pytest.approx(expected, rel=1e-3)
    assert model.cpu_s(decode(1, 1)) == pytest.approx(cpu)
    assert model.gpu_s(decode(1, 1)) == pytest.approx(expected - cpu, rel=1e-3)


def test_big_prefill_is_compute_bound_with_efficiency_rising_with_tokens():
    """A 16k-token prefill on one H100: 2 (N + n_half)(K + k_half)(M + m_half) / (eta peak)
    summed over each layer's qkv, o, gate_up and down GEMMs."""
    c = H100.coefficients
    model = RooflineStepTimeModel(H100, L8, 1, c)
    tokens = 16384
    bf16 = c.gemm["bf16"]
    assert bf16.k_half > 0 and bf16.n_half > 0  # the measured tile terms (h100.yaml)
    # Llama-3.1-8B: hidden 4096, 32 query and 8 KV heads of 128, intermediate 14336
    shapes = ((6144, 4096), (4096, 4096), (2 * 14336, 4096), (4096, 14336))  # (N, K)
    flop_elems = 32 * sum((n + bf16.n_half) * (k + bf16.k_half) for n, k in shapes)
    gemm_s = 2 * flop_elems * (tokens + bf16.m_half) / (989e12 * bf16.eta_compute)
    b = model.breakdown(prefill(tokens))
    assert b["gemm"] == pytest.approx(gemm_s, rel=1e-3)
    # prefill attention (tuner/perf/prefill_attention.py): head dim 128, 32 query heads
    # packed 4 per KV head, the longest (only) prompt's last tile on one of 132 SMs
    extra = c.attn_prefill_half_tokens + c.attn_prefill_kv_tokens / 4
    pairs = tokens * (tokens + 1) / 2 + extra * tokens
    tail = 132 * c.attn_prefill_tail_rows / 32 * ((tokens + 1) / 2 + tokens / 2 + extra)
    attn_s = (pairs + tail) * 4 * 32 * 128 * 32 / (989e12 * c.attn_prefill_eff)
    kv_write = tokens * 2 * 32 * 8 * 128 * 2 / (H100.hbm_bandwidth * c.kv_bw_eff)
    assert b["attention"] == pytest.approx(attn_s + kv_write, rel=1e-6)
    assert b["allreduce"] == 0.0  # TP1: no collective
    # the per-token cost is higher for a short prompt: efficiency rises with M
    short = model.breakdown(prefill(64))["gemm"] / 64
    assert short > 1.5 * b["gemm"] / tokens


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
    gemm = {tp: m.breakdown(small)["gemm"] for tp, m in times.items()}
    for tp in (2, 4, 8):
        assert gemm[tp] == pytest.approx(gemm[1] / tp, rel=0.02)  # weights split tp ways
    t = {tp: m.step_time_s(small) for tp, m in times.items()}
    assert t[1] > t[2] > t[4] > t[8]
    assert times[1].breakdown(small)["allreduce"] == 0.0
    assert times[8].breakdown(small)["allreduce"] > times[2].breakdown(small)["allreduce"]
    with pytest.raises(ConfigError, match="must divide"):
        RooflineStepTimeModel(MI355X, L70, 3)


def test_allreduce_bandwidth_grows_with_the_message():
    model = RooflineStepTimeModel(MI355X, L70, 8)
    per_tok = [model.breakdown(decode(n, 100))["allreduce"] / n for n in (1, 64, 4096)]
    assert per_tok[0] > per_tok[1] > per_tok[2]  # latency and half-size amortised


def test_moe_reads_only_touched_experts():
    c = MI355X.coefficients
    model = RooflineStepTimeModel(MI355X, DSV3, 8, c)
    per_expert = DSV3.weight_bytes_per_gpu(8)["experts"] / 256
    bw = 8.0e12 * c.gemm_for("fp8moe").eta_mem  # FP8 routed experts: fused MoE
    one = model.breakdown(decode(1, 100))["experts"]
    assert one == pytest.approx(8 * per_expert / bw, rel=1e-9)  # top-8 of 256, memory-bound
    for n in (4, 32, 128):
        assert model.breakdown(decode(n, 100))["experts"] >= min(256, 8 * n) * per_expert / bw * 0.5
    full = model.breakdown(decode(4096, 100))["experts"]
    assert full >= 256 * per_expert / bw * (1 - 1e-3)


def test_mla_decode_attention_uses_the_latent_dims_and_16_head_tiles():
    c = MI355X.coefficients
    model = RooflineStepTimeModel(MI355X, DSV3, 8, c)
    ctx = 64 * 4096
    b = model.breakdown(decode(64, 4095))
    # 128 heads / 8 = 16 per rank: absorbed QK (latent + rope) and PV over the latent
    per_pair = 2 * 16 * (2 * 512 + 64) * 61
    compute = ctx * per_pair / (2500e12 * c.attn_decode_eff)
    # 64 work items (one latent head per request): split-KV's underfill (1 + half / 64)
    kv = ctx * 576 * 2 * 61 / (8.0e12 * c.kv_bw_eff) * (1 + c.attn_decode_half_items / 64)
    write = 64 * 576 * 2 * 61 / (8.0e12 * c.kv_bw_eff)
    assert b["attention"] == pytest.approx(max(compute, kv) + write, rel=1e-9)
    # Kimi-style 64 heads at TP8 = 8 per rank still cost 16 (AITER pads to 16)
    kimi = load_model(str(DATA / "moonshotai--Kimi-K2.5.json"))
    k8 = RooflineStepTimeModel(MI355X, kimi, 8, c).breakdown(decode(64, 8191))["attention"]
    k4 = RooflineStepTimeModel(MI355X, kimi, 4, c).breakdown(decode(64, 8191))["attention"]
    assert k8 == pytest.approx(k4, rel=1e-9)


def test_sliding_window_layers_read_at_most_the_window():
    c = MI355X.coefficients
    model = RooflineStepTimeModel(MI355X, GPTOSS, 1, c)
    short = model.breakdown(decode(64, 10_000))["attention"]
    long_ = model.breakdown(decode(64, 100_000))["attention"]
    per_layer = 2 * 8 * 64 * 2
    # only the 18 full layers grow with context (both far above the occupancy floor),
    # their 64 x 8 decode work items reading at (1 + half / 512) the full-bandwidth time
    assert long_ - short == pytest.approx(64 * 90_000 * 18 * per_layer / (8.0e12 * c.kv_bw_eff)
                                          * (1 + c.attn_decode_half_items / 512), rel=1e-6)


@settings(max_examples=80, deadline=None)
@given(items=st.lists(st.tuples(st.integers(0, 40000), st.integers(1, 3000)), min_size=1,
                      max_size=40),
       name=st.sampled_from(list_models()), tp=st.sampled_from([1, 2, 8]),
       hw=st.sampled_from(["mi355x", "h100", "b200"]))
def test_fast_path_equals_terms_scalar_and_vectorised(items, name, tp, hw):
    """The hot path, the explained terms and the NumPy path agree on any batch."""
    hardware = load_hardware(hw)
    model = RooflineStepTimeModel(hardware, load_model(name), tp)
    batch = StepBatch.from_requests(items)
    t = model.step_time_s(batch)
    assert t == pytest.approx(sum(model.breakdown(batch).values()), rel=1e-9)
    vec = step_times(model, batch_arrays([batch, batch]))
    assert vec == pytest.approx([t, t], rel=1e-9)
    assert model.cpu_s(batch) + model.gpu_s(batch) == pytest.approx(t, rel=1e-12)
    cpu, gpu = model.step_parts_s(batch)  # the async clock's prices
    assert (cpu, gpu) == (model.cpu_s(batch), t - model.cpu_s(batch))
    assert cpu == pytest.approx(model.breakdown(batch)["cpu"], rel=1e-12) and gpu > 0


def test_step_parts_of_an_empty_batch_and_of_a_model_without_a_cpu_part():
    model = RooflineStepTimeModel(load_hardware("mi355x"), load_model("llama-3.1-8b"), 1)
    assert model.step_parts_s(StepBatch()) == (0.0, 0.0)

    class GpuOnly(StepTimeModel):
        def step_time_s(self, batch: StepBatch) -> float:
            return 0.5

    assert GpuOnly().step_parts_s(decode(4, 100)) == (0.0, 0.5)


@pytest.mark.parametrize("field,value", [("kv_bw_eff", 0.0), ("attn_prefill_eff", 2.0),
                                         ("step_overhead_s", -1e-3), ("kv_bw_eff", "fast")])
def test_bad_coefficients_are_refused(field, value):
    with pytest.raises(ConfigError, match=field):
        Coefficients(**{field: value})
    with pytest.raises(ConfigError, match="eta_mem"):
        GemmCoefficients(eta_mem=1.5)


def test_calibrated_coefficients_change_the_time():
    slow = MI355X.coefficients.with_flat({"gemm.bf16.eta_mem": 0.3})
    b = decode(8, 1000)
    assert (RooflineStepTimeModel(MI355X, L70, 8, slow).step_time_s(b)
            > RooflineStepTimeModel(MI355X, L70, 8).step_time_s(b))


# ---------------------------------------------------------- worked example
def worked_example_markdown() -> str:
    """The block between the markers in docs/step-time-model.md, computed now."""
    from tuner.perf.capacity import kv_capacity

    from tuner.perf.fit.published import default_coefficients

    model = RooflineStepTimeModel(MI355X, L70, 8, default_coefficients(MI355X))
    block = MI355X.block_size_for(L70.backend_kind)
    cap = kv_capacity(MI355X, L70, 8, block, 0.92, max_num_batched_tokens=16384,
                      max_num_seqs=1024)
    lines = ["| component (ms) | decode: 128 requests at 8k context | prefill: one 8192-token prompt |",
             "|---|---|---|"]
    d = model.breakdown(decode(128, 8191))
    p = model.breakdown(prefill(8192))
    for key in d:
        lines.append(f"| {key} | {d[key] * 1e3:.3f} | {p[key] * 1e3:.3f} |")
    td, tp_ = model.step_time_s(decode(128, 8191)), model.step_time_s(prefill(8192))
    lines.append(f"| **step time** | **{td * 1e3:.3f}** | **{tp_ * 1e3:.3f}** |")
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
        "`python tests/perf/test_step_time.py`")


def test_doc_lists_every_coefficient():
    text = DOC.read_text()
    for name in Coefficients().to_dict():
        assert f"`{name}`" in text, name
    for name in ("t0_s", "eta_mem", "eta_compute", "m_half"):
        assert f"`{name}`" in text, name


if __name__ == "__main__":
    print(worked_example_markdown())
