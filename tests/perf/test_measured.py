"""Step time from aiconfigurator-core's measured vLLM kernel tables (tuner.perf.measured).

The selection rule and its one-line refusals run everywhere; the tests that read the
tables skip, with one line, where the optional extra ``tuner[aic]`` is not installed.
"""

from __future__ import annotations

import importlib.util
import pickle

import numpy as np
import pytest

from tuner.errors import ConfigError
from tuner.perf import measured
from tuner.perf.presets import resolve_target
from tuner.perf.step_time import RooflineStepTimeModel
from tuner.perf.target import Target
from tuner.sim.batch import StepBatch

HAVE_AIC = importlib.util.find_spec("aiconfigurator_core") is not None
needs_aic = pytest.mark.skipif(not HAVE_AIC, reason="aiconfigurator-core not installed "
                                                    "(pip install -e '.[aic]')")


def _without_aic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measured, "aic_available", lambda: False)


# ------------------------------------------------------------ selection (no extra needed)
def test_aic_without_the_extra_is_one_line_naming_it(monkeypatch):
    _without_aic(monkeypatch)
    missing = r"^--step-time-source aic: .*pip install -e '\.\[aic\]'$"
    with pytest.raises(ConfigError, match=missing):
        resolve_target(Target(hardware="h200", model="llama-3.1-8b", step_time_source="aic"))


def test_auto_falls_back_to_analytic(monkeypatch):
    _without_aic(monkeypatch)
    r = resolve_target(Target(hardware="h200", model="llama-3.1-8b"))
    assert r.step_time_source == "analytic" and type(r.step_time) is RooflineStepTimeModel
    assert r.description.endswith("step time: analytic")
    amd = resolve_target(Target(hardware="mi355x", model="llama-3.1-8b"))  # not covered
    assert amd.step_time_source == "analytic"


@pytest.mark.parametrize("target, why", [
    (Target(hardware="mi355x", model="llama-3.1-8b"), "no measured tables for mi355x"),
    (Target(hardware="h200", model="llama-3.1-8b", quantization="mxfp4"), "no measured vLLM fp4"),
    (Target(hardware="h200", model="deepseek-v3", tp=8), "GQA models only .* uses mla"),
])
def test_aic_refuses_what_the_tables_do_not_cover(target, why):
    import dataclasses

    with pytest.raises(ConfigError, match=why) as info:
        resolve_target(dataclasses.replace(target, step_time_source="aic"))
    assert "\n" not in str(info.value)


def test_unknown_source_is_refused():
    with pytest.raises(ConfigError, match="auto, analytic, aic"):
        resolve_target(Target(hardware="h200", model="llama-3.1-8b", step_time_source="tables"))


# ------------------------------------------------------------ with the tables
def _table_latency_s(system: str, dtype: str, m: int, n: int, k: int) -> float | None:
    """The fastest measured kernel for (m, n, k) in the newest vLLM GEMM table, seconds."""
    pl = pytest.importorskip("polars")
    from tuner.perf.models import aic_model_dir

    folder = aic_model_dir().parent / "systems" / "data" / system / "gemm" / "vllm"
    d = pl.read_parquet(sorted(folder.glob("*/gemm_perf.parquet"))[-1])
    rows = d.filter((pl.col("gemm_dtype") == dtype) & (pl.col("m") == m) & (pl.col("n") == n)
                    & (pl.col("k") == k))
    return None if rows.is_empty() else float(rows["latency"].min()) * 1e-3


@needs_aic
def test_h200_steps_are_priced_from_the_measured_gemm_table():
    target = Target(hardware="h200", model="llama-3.1-8b", tp=1, step_time_source="aic")
    r = resolve_target(target)
    step = r.step_time
    assert isinstance(step, measured.MeasuredStepTimeModel)
    assert r.step_time_source.startswith("aic (h200_sxm vLLM ")
    tables = measured.aic_tables("h200", r.model, 1)
    layers = r.model.num_layers
    shapes = {name: (n, k) for name, n, k, _, _ in measured._gemm_shapes(r.model, 1)}
    checked = 0
    for name in ("qkv", "o"):  # Llama-3.1-8B's attention GEMMs are measured shapes
        n, k = shapes[name]
        for m in (1, 16, 64, 1024, 4096, 8192):
            want = _table_latency_s("h200_sxm", "bfloat16", m, n, k)
            if want is None:
                continue
            xs, ys = [0] + tables["m"], [0.0] + tables["ops"][name]
            got = float(np.interp(m, xs, ys)) / layers
            assert got == pytest.approx(want, rel=0.02), (name, m, got, want)
            checked += 1
    assert checked >= 8
    # a step's GEMM term is the four GEMMs of every layer at M = tokens
    xs = [0] + tables["m"]
    for tokens in (1, 64, 1024, 4096):
        batch = StepBatch(num_prefill_reqs=1, num_prefill_tokens=tokens,
                          prefill_attn_pairs=tokens * (tokens + 1) / 2)
        parts = step.breakdown(batch)
        ops = sum(float(np.interp(tokens, xs, [0.0] + tables["ops"][op]))
                  for op in ("qkv", "o", "gate_up", "down"))
        assert parts["gemm"] == pytest.approx(ops, rel=1e-9)
        assert sum(parts.values()) == pytest.approx(step.step_time_s(batch), rel=1e-9)
    # and it is not the analytic model
    analytic = resolve_target(Target(hardware="h200", model="llama-3.1-8b",
                                     step_time_source="analytic")).step_time
    big = StepBatch(num_prefill_reqs=1, num_prefill_tokens=4096,
                    prefill_attn_pairs=4096 * 4097 / 2)
    assert abs(step.step_time_s(big) / analytic.step_time_s(big) - 1) > 0.05
    assert pickle.loads(pickle.dumps(step)).step_time_s(big) == step.step_time_s(big)


@needs_aic
def test_tp8_all_reduce_is_measured_and_auto_picks_the_tables():
    r = resolve_target(Target(hardware="h200", model="llama-3.1-70b", tp=8))  # auto
    assert r.step_time_source.startswith("aic")
    batch = StepBatch(num_decode_reqs=32, decode_ctx_tokens=32 * 2000)
    assert r.step_time.breakdown(batch)["allreduce"] > 0


def test_profile_records_the_source(tmp_path):
    from tuner.profile.model import Profile, ProfileTarget, load_profile, save_profile
    from tuner.sim.settings import SchedulerSettings

    prof = Profile(name="p", scheduler=SchedulerSettings(),
                   target=ProfileTarget(hardware="h200", model="llama-3.1-8b",
                                        step_time_source="aic"))
    path = tmp_path / "p.yaml"
    save_profile(prof, path)
    assert load_profile(path).target.step_time_source == "aic"
    assert "step_time_source" not in ProfileTarget(hardware="h200", model="m").to_dict()
    path.write_text(path.read_text().replace("step_time_source: aic", "step_time_source: x"))
    with pytest.raises(Exception, match="target.step_time_source"):
        load_profile(path)


# ------------------------------------------------ attention and MoE from the tables
def _engine_s(op, *, is_context: bool, b: int, s: int) -> float:
    from aiconfigurator_core.sdk.engine import build_ops_json

    engine, _ = measured._aic_engine("h200_sxm")
    return engine.evaluate_ops_json(build_ops_json([op]), is_context=is_context,
                                    batch_size=b, s=s)[0][1] * 1e-3


@needs_aic
def test_attention_is_a_2d_lookup_that_follows_the_engine():
    import random

    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk.operations.attention import (ContextAttention,
                                                              GenerationAttention)

    r = resolve_target(Target(hardware="h200", model="llama-3.1-70b", tp=8,
                              step_time_source="aic"))
    step = r.step_time
    kv = common.KVCacheQuantMode.bfloat16
    gen = GenerationAttention("g", 80, 8, 1, kv, head_size=128)
    ctx = ContextAttention("c", 80, 8, 1, kv, common.FMHAQuantMode.bfloat16, head_size=128)
    # on a grid point the step's attention is the engine's (plus decode KV writes)
    b = StepBatch(num_decode_reqs=64, decode_ctx_tokens=64 * 4096)
    want = _engine_s(gen, is_context=False, b=64, s=4096) + step._kv_write * 64
    assert step.breakdown(b)["attention"] == pytest.approx(want, rel=1e-9)
    p = StepBatch(num_prefill_reqs=2, num_prefill_tokens=2 * 2048,
                  prefill_attn_pairs=2 * 2048 * 2049 / 2)
    assert step.breakdown(p)["attention"] == pytest.approx(
        _engine_s(ctx, is_context=True, b=2, s=2048), rel=1e-9)
    # off the grid: bilinear between points that include the engine's collection grid
    rng = random.Random(7)
    errs = []
    for _ in range(150):
        n, ctx_len = rng.randint(1, 2048), int(2 ** rng.uniform(1, 17))
        got = step._gen.at(n, ctx_len)
        errs.append(abs(got / _engine_s(gen, is_context=False, b=n, s=ctx_len) - 1))
    errs.sort()
    assert errs[len(errs) // 2] < 0.01 and errs[int(0.95 * len(errs))] < 0.10
    # a cached prefix costs the causal-pair share of a prompt of the full length...
    cached = StepBatch(num_prefill_reqs=1, num_prefill_tokens=1024, prefill_ctx_tokens=3072,
                       prefill_attn_pairs=1024 * (3072 + 1025 / 2))
    full = _engine_s(ctx, is_context=True, b=1, s=4096)
    share = full * cached.prefill_attn_pairs / (4096 * 4097 / 2)
    assert share > _engine_s(gen, is_context=False, b=1, s=4096)
    assert step.breakdown(cached)["attention"] == pytest.approx(share, rel=1e-6)
    # ...but a short chunk over a long prefix at least reads the prefix's KV once
    short = StepBatch(num_prefill_reqs=4, num_prefill_tokens=4 * 16,
                      prefill_ctx_tokens=4 * 32768, prefill_attn_pairs=4 * 16 * (32768 + 8.5))
    read_once = _engine_s(gen, is_context=False, b=4, s=32784)
    assert step.breakdown(short)["attention"] == pytest.approx(read_once, rel=0.02)


@needs_aic
def test_moe_experts_come_from_the_measured_moe_table():
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk.operations.moe import MoE

    r = resolve_target(Target(hardware="h200", model="gpt-oss-120b", tp=1,
                              step_time_source="aic"))
    assert isinstance(r.step_time, measured.MeasuredStepTimeModel)
    m = r.model
    op = MoE("moe", m.num_moe_layers, m.hidden_size, m.moe_intermediate_size,
             m.num_experts_per_tok, m.num_experts, 1, 1, common.MoEQuantMode.w4a16_mxfp4,
             measured.AIC_MOE_DISTRIBUTION, 1)
    for n in (1, 32, 256, 2048):
        batch = StepBatch(num_decode_reqs=n, decode_ctx_tokens=n * 1000)
        want = _engine_s(op, is_context=True, b=1, s=n)
        assert r.step_time.breakdown(batch)["experts"] == pytest.approx(want, rel=1e-9)
        assert sum(r.step_time.breakdown(batch).values()) == pytest.approx(
            r.step_time.step_time_s(batch), rel=1e-9)
    big = StepBatch(num_decode_reqs=256, decode_ctx_tokens=256 * 1000)
    assert pickle.loads(pickle.dumps(r.step_time)).step_time_s(big) == r.step_time.step_time_s(big)


@needs_aic
def test_a_shape_the_tables_lack_falls_back_under_auto_and_is_refused_under_aic():
    # NVFP4 gpt-oss experts on B200 at TP2: aiconfigurator-core has no such MoE rows
    target = Target(hardware="b200", model="gpt-oss-120b", tp=2, quantization="modelopt_fp4")
    assert resolve_target(target).step_time_source == "analytic"
    import dataclasses

    with pytest.raises(ConfigError, match=r"^--step-time-source aic: aiconfigurator-core "
                                          r"cannot price nvfp4 MoE") as info:
        resolve_target(dataclasses.replace(target, step_time_source="aic"))
    assert "\n" not in str(info.value)


@needs_aic
def test_expert_parallel_lock_step_rank_on_the_tables():
    r = resolve_target(Target(hardware="h200", model="gpt-oss-120b", tp=1, dp=2,
                              enable_expert_parallel=True, step_time_source="aic"))
    step = r.step_time
    busy, idle = (StepBatch(num_decode_reqs=n, decode_ctx_tokens=n * 1000) for n in (128, 1))
    assert step.rank_step_time_s(busy, 256) == pytest.approx(step.step_time_s(busy))
    assert step.breakdown(busy)["all2all"] > 0
    # the idle rank's experts are priced at the group's mean tokens per rank
    assert step.rank_step_time_s(idle, 129) > step.step_time_s(idle)
    assert step.rank_step_time_s(busy, 129) < step.step_time_s(busy)
