"""Hardware and model presets, HF config parsing, KV capacity, resolve_target and
calibration files (round trip and every bad-file path)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import yaml

from tuner.errors import ConfigError
from tuner.sim.batch import StepBatch
from tuner.perf.fit.calibration_file import Calibration, load_calibration, save_calibration
from tuner.perf.capacity import CUDAGRAPH_BYTES, NON_TORCH_BYTES, kv_capacity, num_gpu_blocks
from tuner.perf.hardware import list_hardware, load_hardware
from tuner.perf.models import PRESET_DIR, list_models, load_model
from tuner.perf.presets import default_scheduler_settings, resolve_target
from tuner.sim.settings import SchedulerSettings
from tuner.perf.step_time import Coefficients
from tuner.perf.target import Target

GIB = 1 << 30


# ------------------------------------------------------------------ models
@pytest.mark.parametrize("name,total_b,active_b", [
    ("llama-3.1-8b", 8.03, None),
    ("llama-3.1-70b", 70.6, None),
    ("qwen3-32b", 32.8, None),
    ("deepseek-v3", 671.0, 37.0),
    ("gpt-oss-120b", 117.0, 5.1),
])
def test_parameter_counts_match_published_totals(name, total_b, active_b):
    m = load_model(name)
    assert m.total_params / 1e9 == pytest.approx(total_b, rel=0.02)
    if active_b is not None:
        assert m.active_params / 1e9 == pytest.approx(active_b, rel=0.03)
    assert m.active_params <= m.total_params


def test_model_fields_are_parsed():
    ds = load_model("deepseek-v3")
    assert (ds.attention, ds.kv_lora_rank, ds.qk_rope_head_dim) == ("mla", 512, 64)
    assert (ds.num_experts, ds.num_experts_per_tok, ds.num_moe_layers) == (256, 8, 58)
    assert ds.shared_expert_intermediate_size == 2048
    # 128x128 block-scaled FP8: block-scaled dense GEMMs, fp8 experts (priced as the fused-MoE fp8moe family)
    assert (ds.weight_dtype, ds.kv_dtype, ds.max_position_embeddings) == ("fp8b", "bf16", 163840)
    assert ds.expert_weight_dtype == "fp8"
    oss = load_model("gpt-oss-120b")
    assert (oss.num_experts, oss.num_experts_per_tok) == (128, 4)
    assert (oss.expert_weight_dtype, oss.attn_weight_dtype) == ("fp4", "bf16")  # MXFP4 experts only
    assert (oss.sliding_window, oss.num_sliding_layers) == (128, 18)
    q = load_model("qwen3-32b")
    assert (q.head_dim, q.num_kv_heads, q.max_position_embeddings) == (128, 8, 40960)


def test_kv_bytes_per_token():
    l70 = load_model("llama-3.1-70b")
    assert l70.kv_bytes_per_token(1) == 2 * 80 * 8 * 128 * 2  # 320 KiB
    assert l70.kv_bytes_per_token(8) == 2 * 80 * 1 * 128 * 2  # split over 8 ranks
    assert l70.kv_bytes_per_token(16) == l70.kv_bytes_per_token(8)  # replicated past 8
    ds = load_model("deepseek-v3")
    assert ds.kv_bytes_per_token(1) == ds.kv_bytes_per_token(8) == (512 + 64) * 61 * 2
    oss = load_model("gpt-oss-120b")
    assert oss.kv_bytes_per_token(1) == 18 * 2 * 8 * 64 * 2  # full-attention layers only
    assert l70.with_dtypes(kv_cache_dtype="fp8").kv_bytes_per_token(8) == 2 * 80 * 128
    assert l70.with_dtypes(kv_cache_dtype="auto").kv_dtype == "bf16"


def test_weight_dtype_override_changes_bytes():
    l70 = load_model("llama-3.1-70b")
    bf16 = l70.weight_bytes_per_gpu(8)
    fp8 = l70.with_dtypes(weight_dtype="fp8").weight_bytes_per_gpu(8)
    assert fp8["attn"] == pytest.approx(bf16["attn"] / 2)
    assert fp8["dense_mlp"] == pytest.approx(bf16["dense_mlp"] / 2)
    assert fp8["embed"] == bf16["embed"]  # embeddings stay in the activation dtype
    with pytest.raises(ConfigError, match="weight_dtype='int3'"):
        l70.with_dtypes(weight_dtype="int3")


def test_load_model_from_file_and_folder(tmp_path):
    src = PRESET_DIR / "qwen3-32b.json"
    shutil.copy(src, tmp_path / "config.json")
    by_folder = load_model(tmp_path)
    by_file = load_model(tmp_path / "config.json")
    assert by_folder.total_params == by_file.total_params == load_model("qwen3-32b").total_params
    # multimodal wrapper: the text_config is used
    wrapped = {"model_type": "wrapper", "text_config": json.loads(src.read_text())}
    (tmp_path / "mm.json").write_text(json.dumps(wrapped))
    assert load_model(tmp_path / "mm.json").num_layers == 64


def test_mixtral_and_qwen_moe_field_names(tmp_path):
    mixtral = {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
               "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
               "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
               "torch_dtype": "bfloat16"}
    (tmp_path / "mixtral.json").write_text(json.dumps(mixtral))
    m = load_model(tmp_path / "mixtral.json")
    assert m.total_params / 1e9 == pytest.approx(46.7, rel=0.01)  # Mixtral-8x7B
    assert m.active_params / 1e9 == pytest.approx(12.9, rel=0.02)
    qmoe = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
            "intermediate_size": 6144, "moe_intermediate_size": 768, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "num_experts": 128,
            "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "torch_dtype": "bfloat16"}
    (tmp_path / "qmoe.json").write_text(json.dumps(qmoe))
    q = load_model(tmp_path / "qmoe.json")
    assert q.num_moe_layers == 48
    assert q.total_params / 1e9 == pytest.approx(30.5, rel=0.02)  # Qwen3-30B-A3B
    assert q.active_params / 1e9 == pytest.approx(3.3, rel=0.1)


def test_bad_model_configs(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_model("llama-9000")
    assert "available: " in str(err.value) and "llama-3.1-70b" in str(err.value)
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(ConfigError, match=r"bad.json:1: invalid JSON"):
        load_model(bad)
    cfg = json.loads((PRESET_DIR / "llama-3.1-8b.json").read_text())
    cfg["hidden_size"] = "big"
    bad.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"bad.json: field 'hidden_size' must be a positive"):
        load_model(bad)
    cfg = json.loads((PRESET_DIR / "llama-3.1-8b.json").read_text())
    cfg["quantization_config"] = {"quant_method": "bitsandbytes"}
    bad.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="quant_method'='bitsandbytes'"):
        load_model(bad)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="config.json: model config not found"):
        load_model(tmp_path / "empty")


# ---------------------------------------------------------------- hardware
def test_hardware_presets():
    assert set(list_hardware()) >= {"mi355x", "mi300x", "mi325x", "h100", "h200", "b200"}
    mi = load_hardware("mi355x")
    assert (mi.vendor, mi.memory_gib, mi.hbm_bandwidth) == ("amd", 288, 8.0e12)
    assert (mi.peak("bf16"), mi.peak("fp8"), mi.peak("fp4")) == (2500e12, 5000e12, 10000e12)
    h100 = load_hardware("h100")
    assert h100.peak("bf16") == 989e12  # dense, not the 2x sparse figure
    assert h100.peak("fp4") == 989e12  # no FP4 units: dequantize to bf16 (W4A16)
    for name in list_hardware():
        hw = load_hardware(name)
        assert hw.peak("fp8") >= hw.peak("bf16") > 0
        assert hw.interconnect_bandwidth > 0 and hw.allreduce_latency_s > 0


def test_default_block_size_per_backend():
    """vLLM 0.33.0's default backends and the block size each implies (docs §4)."""
    mi = load_hardware("mi355x")
    assert (mi.backend_for("gqa"), mi.block_size_for("gqa")) == ("ROCM_ATTN", 16)
    assert (mi.backend_for("gqa_sinks"), mi.block_size_for("gqa_sinks")) == (
        "ROCM_AITER_UNIFIED_ATTN", 64)
    assert load_hardware("h100").block_size_for("gqa") == 16  # CUDA FlashAttention
    assert load_hardware("h100").block_size_for("gqa_sinks") == 16  # falls back to gqa
    assert load_hardware("h200").block_size_for("mla") == 16  # FLASH_ATTN_MLA, multiples of 16
    assert load_hardware("b200").block_size_for("mla") == 32  # FLASHINFER_MLA: 32 or 64
    assert load_model("gpt-oss-120b").backend_kind == "gqa_sinks"
    assert load_model("deepseek-v3").backend_kind == "mla"
    oss = resolve_target(Target(hardware="mi355x", model="gpt-oss-120b", tp=1))
    assert oss.cache.block_size == 64
    base = resolve_target(Target(hardware="mi355x", model="llama-3.1-70b", tp=8))
    assert base.cache.block_size == 16
    over = resolve_target(Target(hardware="mi355x", model="llama-3.1-70b", tp=8, block_size=64))
    assert over.cache.block_size == 64
    # bigger blocks, same bytes: a quarter of the blocks (to rounding)
    assert abs(4 * over.cache.num_gpu_blocks - base.cache.num_gpu_blocks) <= 4


def test_vllm_batch_defaults_by_memory():
    assert default_scheduler_settings("mi355x") == SchedulerSettings(16384, 1024)
    assert default_scheduler_settings("b200").max_num_batched_tokens == 16384
    assert default_scheduler_settings("h100") == SchedulerSettings.vllm_defaults(79.6)
    assert default_scheduler_settings("h200").max_num_batched_tokens == 8192


def test_bad_hardware(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_hardware("tpu-v9")
    assert "available: b200, h100, h200, mi300x, mi325x, mi355x" in str(err.value)
    data = yaml.safe_load(load_hardware.__globals__["PRESET_DIR"].joinpath("mi355x.yaml").read_text())
    data["hbm_bandwidth_tbps"] = -1
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"gpu.yaml: field 'hbm_bandwidth_tbps' must be a positive"):
        load_hardware(path)
    del data["hbm_bandwidth_tbps"]
    data["hbm_bandwidth_tbps"] = 4.0
    data["peak_tflops"]["int8"] = 5
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="unknown dtype"):
        load_hardware(path)
    data["peak_tflops"].pop("int8")
    data["default_block_size"] = {"gqa": 16, "mamba": 528}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"field 'default_block_size' has unknown model kind"):
        load_hardware(path)
    path.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match=r"gpu.yaml:\d+: invalid YAML"):
        load_hardware(path)


# ---------------------------------------------------------------- capacity
def test_capacity_matches_a_hand_computation():
    """Llama-3.1-70B bf16, TP8 on MI355X, block 16, utilization 0.92, 16384/1024."""
    hw, m = load_hardware("mi355x"), load_model("llama-3.1-70b")
    requested = math.ceil(288 * GIB * 0.92)
    weights = sum(m.weight_bytes_per_gpu(8).values())
    assert weights == pytest.approx(m.total_params * 2 / 8, rel=1e-3)
    act = 16384 * 2 * (4 * 8192 + 3 * 28672 / 8) + 1024 * 128256 * 4 * 2
    per_block = 16 * 2 * 80 * 1 * 128 * 2
    expected = int((requested - weights - act - NON_TORCH_BYTES - CUDAGRAPH_BYTES) // per_block)
    got = num_gpu_blocks(hw, m, 8, 16, 0.92, max_num_batched_tokens=16384, max_num_seqs=1024)
    assert got == expected
    tokens = got * 16
    assert 5.5e6 < tokens < 7.0e6  # "about 6 million"
    resolved = resolve_target(Target(hardware="mi355x", model="llama-3.1-70b", tp=8))
    assert resolved.cache.num_gpu_blocks == got
    assert resolved.capacity is not None and resolved.capacity.num_tokens == tokens


def test_capacity_grows_with_utilization_and_fp8_kv():
    hw, m = load_hardware("mi355x"), load_model("llama-3.1-70b")
    lo = kv_capacity(hw, m, 8, 16, 0.8)
    hi = kv_capacity(hw, m, 8, 16, 0.92)
    assert hi.num_gpu_blocks > lo.num_gpu_blocks
    fp8 = kv_capacity(hw, m.with_dtypes(kv_cache_dtype="fp8"), 8, 16, 0.92)
    assert abs(fp8.num_gpu_blocks - 2 * hi.num_gpu_blocks) <= 2


def test_override_and_refusals():
    t = Target(hardware="h100", model="llama-3.1-70b", tp=8, num_gpu_blocks=1234)
    r = resolve_target(t)
    assert r.cache.num_gpu_blocks == 1234 and r.capacity is None
    assert r.num_gpus == 8 and r.cache.enable_prefix_caching
    assert CUDAGRAPH_BYTES == 1 << 30 and NON_TORCH_BYTES == 1.5 * (1 << 30)
    with pytest.raises(ConfigError, match="does not fit on 1x h100"):
        resolve_target(Target(hardware="h100", model="llama-3.1-70b", tp=1))
    with pytest.raises(ConfigError, match="max_model_len=131072"):
        resolve_target(Target(hardware="h100", model="llama-3.1-70b", tp=2))
    ok = resolve_target(Target(hardware="h100", model="llama-3.1-70b", tp=2, max_model_len=8192))
    assert ok.cache.max_model_len == 8192
    with pytest.raises(ConfigError, match="--tp 0: must be an integer >= 1"):
        resolve_target(Target(tp=0))
    with pytest.raises(ConfigError, match="available"):
        resolve_target(Target(model="nope"))


def test_resolve_target_fields():
    r = resolve_target(Target(hardware="mi355x", model="llama-3.1-70b", tp=8, dp=2))
    assert r.num_gpus == 16 and (r.tp, r.dp) == (8, 2)
    assert r.default_settings == SchedulerSettings.vllm_defaults(288)
    assert r.cache.max_model_len == 131072
    assert "MI355X" in r.description and "TP8" in r.description and "\n" not in r.description
    assert r.step_time.step_time_s(StepBatch.from_requests([(100, 1)])) > 0
    # the activation reserve follows the scheduler settings used for profiling
    small = resolve_target(Target(hardware="mi355x", model="llama-3.1-70b", tp=8),
                           scheduler_settings=SchedulerSettings(2048, 256))
    assert small.cache.num_gpu_blocks > r.cache.num_gpu_blocks


# ------------------------------------------------------------- calibration
def _cal(**over) -> dict:
    data = {"hardware": "mi355x", "model": "llama-3.1-70b", "tp": 8,
            "coefficients": {"weight_bw_eff": 0.6, "step_overhead_s": 0.0004},
            "fit": {"num_steps": 100, "rmse_ms": 0.3}}
    data.update(over)
    return data


def test_calibration_round_trip_and_use(tmp_path):
    cal = Calibration("mi355x", "llama-3.1-70b", 8,
                      Coefficients().with_flat({"gemm.bf16.eta_mem": 0.3, "gemm.bf16.eta_compute": 0.5,
                                                "allreduce_latency_s": 1.2e-5}),
                      {"vllm_version": "0.33.0", "rmse_ms": 0.41})
    path = save_calibration(tmp_path / "cal" / "mi355x.yaml", cal)
    assert load_calibration(path) == cal
    assert not list(path.parent.glob(".*.tmp"))  # atomic write leaves no temp file
    plain = resolve_target(Target(hardware="mi355x", model="llama-3.1-70b", tp=8))
    tuned = resolve_target(Target(hardware="mi355x", model="llama-3.1-70b", tp=8,
                                  calibration=str(path)))
    assert tuned.step_time.coefficients == cal.coefficients
    batch = StepBatch.from_requests([(1000, 1)] * 4)
    assert tuned.step_time.step_time_s(batch) > plain.step_time.step_time_s(batch)
    assert "calibrated" in tuned.description


def test_partial_calibration_keeps_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_cal(coefficients={"gemm": {"fp8": {"eta_mem": 0.2}}})))
    c = load_calibration(path).coefficients
    assert c.gemm["fp8"].eta_mem == 0.2 and c.gemm["bf16"] == Coefficients().gemm["bf16"]
    # over the target GPU's own defaults, not the generic ones
    resolved = resolve_target(Target(hardware="mi355x", model="llama-3.1-70b", tp=8,
                                     calibration=str(path)))
    got = resolved.step_time.coefficients
    assert got.gemm["fp8"].eta_mem == 0.2
    assert got.gemm["bf16"] == resolve_target(Target(hardware="mi355x", model="llama-3.1-70b",
                                                     tp=8)).step_time.coefficients.gemm["bf16"]


def test_legacy_calibration_names_still_load(tmp_path):
    """Files written before the per-kernel model (weight_bw_eff, mfu_*) load as before."""
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(_cal(coefficients={"weight_bw_eff": 0.5, "mfu_prefill": 0.4,
                                                      "mfu_decode": 0.3, "kv_bw_eff": 0.6})))
    c = load_calibration(path).coefficients
    assert {c.gemm[f].eta_mem for f in c.gemm} == {0.5}
    assert {c.gemm[f].eta_compute for f in c.gemm} == {0.4}
    assert c.kv_bw_eff == 0.6


@pytest.mark.parametrize("data,pattern", [
    (_cal(tp=0), r"field 'tp' must be a positive integer"),
    (_cal(hardware=None), r"field 'hardware' must be a non-empty string"),
    (_cal(coefficients=[1, 2]), r"field 'coefficients' must be a mapping"),
    (_cal(coefficients={"warp_speed": 1.0}), r"field 'coefficients.warp_speed' is not a coefficient"),
    (_cal(coefficients={"mfu_prefill": "high"}), r"field 'coefficients.mfu_prefill' must be a number"),
    (_cal(coefficients={"mfu_prefill": 3.0}), r"field 'coefficients': coefficient mfu_prefill=3.0"),
    (_cal(fit=[1]), r"field 'fit' must be a mapping"),
    (_cal(extra=1), r"unknown top-level field"),
    ([1, 2], r"must hold a mapping"),
])
def test_bad_calibration_files(tmp_path, data, pattern):
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=pattern) as err:
        load_calibration(path)
    assert str(err.value).startswith(str(path))


def test_calibration_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="calibration file not found"):
        load_calibration(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("hardware: [mi355x\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: invalid YAML"):
        load_calibration(bad)


@pytest.mark.parametrize("over,pattern", [
    ({"hardware": "h100"}, "field 'hardware' is 'h100'"),
    ({"model": "qwen3-32b"}, "field 'model' is 'qwen3-32b'"),
    ({"tp": 4}, "field 'tp' is 4"),
])
def test_calibration_for_another_target_is_refused(tmp_path, over, pattern):
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(_cal(**over)))
    with pytest.raises(ConfigError, match=pattern):
        resolve_target(Target(hardware="mi355x", model="llama-3.1-70b", tp=8,
                              calibration=str(path)))


def test_every_preset_resolves_somewhere():
    """Each model preset fits on 8 GPUs of every >= 141 GB part, and its step time is sane."""
    for model in list_models():
        for hw in ("mi355x", "mi325x", "h200", "b200"):
            r = resolve_target(Target(hardware=hw, model=model, tp=8, max_model_len=32768))
            t = r.step_time.step_time_s(StepBatch.from_requests([(2000, 1)] * 32))
            assert 1e-4 < t < 1.0, (model, hw, t)


def test_doc_preset_table_matches_the_code():
    """docs/step-time-model.md §5 lists each preset's counts; they must be the code's."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "step-time-model.md").read_text()
    for name in list_models():
        row = re.search(rf"^\| `{re.escape(name)}` \|[^|]*\| ([\d.]+) B \| ([\d.]+) B \| (\d+) \| (\d+)",
                        doc, re.M)
        assert row, f"docs/step-time-model.md has no preset row for {name}"
        m = load_model(name)
        total, active, kv1, kv8 = row.groups()
        assert float(total) == pytest.approx(m.total_params / 1e9, abs=0.006), name
        assert float(active) == pytest.approx(m.active_params / 1e9, abs=0.006), name
        assert (int(kv1), int(kv8)) == (m.kv_bytes_per_token(1), m.kv_bytes_per_token(8)), name
