"""Expert parallelism in the step-time model (tuner/perf/expert_parallel.py).

Hand-computed figures for DeepSeek-V3 (256 experts, top-8, 58 MoE layers, hidden 7168,
fp8 experts) on MI355X: the all-to-all term, the expert sharding, the KV capacity and
the lock-step rank rule.
"""

from __future__ import annotations

import dataclasses

import pytest

from tuner.errors import ConfigError
from tuner.perf.expert_parallel import expert_layout, ranks_per_token
from tuner.perf.hardware import load_hardware
from tuner.perf.models import load_model
from tuner.perf.presets import resolve_target
from tuner.perf.step_time import RooflineStepTimeModel
from tuner.perf.target import Target
from tuner.sim.batch import StepBatch

MI355X = load_hardware("mi355x")
DSV3 = load_model("deepseek-v3")


def decode(n: int, ctx: int = 2000) -> StepBatch:
    return StepBatch(num_decode_reqs=n, decode_ctx_tokens=n * ctx)


def test_all_to_all_is_latency_plus_bytes_over_bandwidth_per_moe_layer():
    m = RooflineStepTimeModel(MI355X, DSV3, 1, dp=8, expert_parallel=True)
    r = 8 * (1 - (7 / 8) ** 8)  # ranks a token's 8 experts land on, of 8
    assert ranks_per_token(8, 8) == pytest.approx(r)
    per_token = 58 * r * 7168 * (1.0 + 2.0) / 394e9  # fp8 dispatch + bf16 combine
    fixed = 58 * 2 * 19e-6
    for n in (1, 64, 512):
        assert m.breakdown(decode(n))["all2all"] == pytest.approx(fixed + per_token * n)
    # without EP, or with EP inside one DP rank, nothing is dispatched
    assert RooflineStepTimeModel(MI355X, DSV3, 8).breakdown(decode(64))["all2all"] == 0.0
    tp8_ep = RooflineStepTimeModel(MI355X, DSV3, 8, dp=1, expert_parallel=True)
    assert tp8_ep.breakdown(decode(64))["all2all"] == 0.0


def test_ep_inside_one_dp_rank_streams_the_same_expert_bytes():
    plain = RooflineStepTimeModel(MI355X, DSV3, 8)
    ep = RooflineStepTimeModel(MI355X, DSV3, 8, expert_parallel=True)
    for n in (1, 16, 256, 4096):
        assert ep.breakdown(decode(n))["experts"] == pytest.approx(
            plain.breakdown(decode(n))["experts"], rel=1e-9)


def test_ep_shards_whole_experts_and_feeds_them_the_group_tokens():
    layout = expert_layout(DSV3, 1, 8, True)
    assert (layout.ep, layout.local_experts, layout.width_share, layout.all2all) == (8, 32, 1.0, True)
    m = RooflineStepTimeModel(MI355X, DSV3, 1, dp=8, expert_parallel=True)
    c = m.coefficients.gemm_for("fp8moe")  # FP8 routed experts: the fused-MoE family
    expert_bytes = DSV3.weight_bytes_per_gpu(1)["experts"] / 256  # one whole expert, fp8
    one = m.breakdown(decode(1))["experts"]
    # one token per rank, 8 in the group: each touches 8 of 256 experts, 32 live here
    touched = 32 * (1 - (1 - 8 / 256) ** 8)
    assert one == pytest.approx(touched * expert_bytes / (c.eta_mem * MI355X.hbm_bandwidth),
                                rel=1e-6)


def test_lock_step_rank_takes_the_group_tokens_and_the_slowest_rank_sets_the_step():
    m = RooflineStepTimeModel(MI355X, DSV3, 1, dp=2, expert_parallel=True)
    busy, idle = decode(256), decode(1)  # an idle rank runs vLLM's one-token dummy batch
    group = 256 + 1
    assert m.rank_step_time_s(busy, 512) == pytest.approx(m.step_time_s(busy))  # balanced
    # hand-computed: 128 whole fp8 experts per rank, k/EP = 4 pairs per group token
    g = m.coefficients.gemm_for("fp8moe")
    w = DSV3.weight_bytes_per_gpu(1)["experts"] / 256  # elements (= bytes) of one expert
    e_mem = w / (g.eta_mem * MI355X.hbm_bandwidth)
    e_cmp = 2 * w / (g.eta_compute * MI355X.peak("fp8"))

    def experts(group_tokens: float) -> float:
        touched = 128 * (1 - (1 - 8 / 256) ** group_tokens)
        return max(e_mem * touched, e_cmp * (4 * group_tokens + g.m_half * touched))

    a2a_tok = 58 * ranks_per_token(2, 8) * 7168 * 3.0 / 394e9
    want_idle = (m.step_time_s(idle) - experts(2) + experts(group)
                 + a2a_tok * (group / 2 - 1))  # it waits on what it receives
    assert m.rank_step_time_s(idle, group) == pytest.approx(want_idle, rel=1e-9)
    t_busy = m.rank_step_time_s(busy, group)
    assert t_busy == pytest.approx(m.step_time_s(busy) - experts(512) + experts(group),
                                   rel=1e-9)
    assert max(t_busy, m.rank_step_time_s(idle, group)) == t_busy  # the step's time


def test_kv_capacity_holds_one_ep_share_of_the_experts():
    r = resolve_target(Target(hardware="mi355x", model="deepseek-v3", tp=1, dp=8,
                              enable_expert_parallel=True))
    wb = DSV3.weight_bytes_per_gpu(1)
    assert r.capacity.weight_bytes == pytest.approx(sum(wb.values()) - wb["experts"] * 7 / 8)
    assert "(TP1 x DP8, EP)" in r.description
    with pytest.raises(ConfigError, match="does not fit"):  # without EP: all experts per GPU
        resolve_target(Target(hardware="mi355x", model="deepseek-v3", tp=1, dp=8))


def test_ep_refuses_more_ranks_than_experts_and_is_a_no_op_on_dense_models():
    few = dataclasses.replace(DSV3, num_experts=8)
    with pytest.raises(ConfigError, match="8 experts, fewer than the 16 EP ranks"):
        RooflineStepTimeModel(MI355X, few, 8, dp=2, expert_parallel=True)
    dense = load_model("llama-3.1-8b")
    a = RooflineStepTimeModel(MI355X, dense, 1, dp=4, expert_parallel=True)
    b = RooflineStepTimeModel(MI355X, dense, 1)
    assert a.step_time_s(decode(64)) == b.step_time_s(decode(64))
    assert a.rank_step_time_s(decode(64), 999) == a.step_time_s(decode(64))
