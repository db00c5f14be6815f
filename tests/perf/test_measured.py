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
    (Target(hardware="h200", model="gpt-oss-120b"), "dense models only"),
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
    shapes = {name: (n, k) for name, n, k, _ in measured._gemm_shapes(r.model, 1)}
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
