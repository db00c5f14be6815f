"""Dtypes as vLLM names them: --quantization, --kv-cache-dtype, quantization_config,
the CLI flags, profiles and export; Hugging Face ids via the aiconfigurator-core extra."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.errors import ConfigError
from tuner.perf.dtypes import normalize_kv_cache_dtype, normalize_quantization, scheme_from_config
from tuner.perf.models import PRESET_DIR, load_model
from tuner.perf.presets import resolve_target
from tuner.perf.target import Target

DATA = Path(__file__).resolve().parents[2] / "tuner" / "perf" / "data" / "models"


@pytest.mark.parametrize("quant,fmt", [("fp8", "fp8"), ("ptpc_fp8", "fp8"), ("mxfp4", "fp4"),
                                       ("modelopt_fp4", "fp4"), ("awq", "int4"),
                                       ("GPTQ_Marlin", "int4")])
def test_quantization_names_pick_the_kernel_format(quant, fmt):
    m = load_model("llama-3.1-8b").with_dtypes(quantization=quant)
    assert (m.weight_dtype, m.attn_weight_dtype, m.quantization) == (fmt, fmt, quant.lower())
    assert load_model("llama-3.1-8b").with_dtypes(quantization="none").weight_dtype == "bf16"


def test_a_quantized_checkpoint_keeps_what_it_leaves_unquantized():
    # gpt-oss: MXFP4 experts, bf16 attention; Kimi-K2.5: int4 experts only
    oss = load_model("gpt-oss-120b")
    assert (oss.quantization, oss.expert_weight_dtype, oss.attn_weight_dtype) == ("mxfp4", "fp4", "bf16")
    kimi = load_model(DATA / "moonshotai--Kimi-K2.5.json")
    assert (kimi.quantization, kimi.weight_dtype, kimi.expert_weight_dtype,
            kimi.attn_weight_dtype) == ("compressed-tensors", "bf16", "int4", "bf16")
    mx = kimi.with_dtypes(quantization="mxfp4")
    assert (mx.weight_dtype, mx.expert_weight_dtype, mx.attn_weight_dtype) == ("bf16", "fp4", "bf16")


@pytest.mark.parametrize("config,fmt", [
    ({"quant_method": "fp8"}, "fp8"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "fp4"),
    ({"quant_method": "awq", "bits": 4}, "int4"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {
        "num_bits": 8, "type": "float"}}}}, "fp8"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {
        "num_bits": 4, "type": "int"}}}}, "int4"),
    ({"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "fp4"}}}, "fp4"),
    ({"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "fp8_e4m3"}}}, "fp8"),
])
def test_quantization_config_of_common_checkpoint_formats(config, fmt):
    scheme = scheme_from_config(config)
    assert scheme.dense == scheme.experts == fmt


def test_containers_need_a_scheme_and_bad_names_are_refused():
    with pytest.raises(ConfigError, match="compressed-tensors: the model config has no"):
        load_model("llama-3.1-8b").with_dtypes(quantization="compressed-tensors")
    with pytest.raises(ConfigError, match="--quantization 'int3' is not modelled"):
        normalize_quantization("int3")
    with pytest.raises(ConfigError, match="--kv-cache-dtype 'fp4' is not a vLLM cache dtype"):
        normalize_kv_cache_dtype("fp4")


def test_kv_cache_dtype_sizes_the_cache():
    l70 = load_model("llama-3.1-70b")
    assert l70.with_dtypes(kv_cache_dtype="fp8_e4m3").kv_bytes_per_token(8) == 80 * 2 * 128
    assert l70.with_dtypes(kv_cache_dtype="auto").kv_bytes_per_token(8) == 80 * 2 * 128 * 2
    ds = load_model("deepseek-v3").with_dtypes(kv_cache_dtype="fp8_ds_mla")
    assert ds.kv_bytes_per_token_layer(8) == 656  # FlashMLA's fp8 layout
    bf = resolve_target(Target(hardware="mi355x", model="llama-3.1-70b", tp=8))
    f8 = resolve_target(Target(hardware="mi355x", model="llama-3.1-70b", tp=8, kv_cache_dtype="fp8"))
    assert f8.cache.num_gpu_blocks > 1.9 * bf.cache.num_gpu_blocks


# ------------------------------------------------------------------ CLI / profile
def test_cli_flags_reach_the_target(monkeypatch):
    import tuner.cli._replay as replay_cli

    seen: list[Target] = []

    def fake_resolve(target, **kw):  # stop right after the target is built
        seen.append(target)
        raise ConfigError("stop here")

    monkeypatch.setattr("tuner.perf.presets.resolve_target", fake_resolve)
    from tuner.cli import cli

    trace = Path(__file__).resolve().parents[2] / "traces" / "agentic_1h.parquet"
    result = CliRunner().invoke(cli, [
        "replay", str(trace), "--hardware", "mi355x", "--model", "llama-3.1-8b",
        "--tensor-parallel-size", "2", "--quantization", "MXFP4", "--kv-cache-dtype", "fp8"])
    assert "stop here" in result.output, result.output
    assert (seen[0].tp, seen[0].quantization, seen[0].kv_cache_dtype) == (2, "mxfp4", "fp8")
    assert replay_cli.TargetFlags  # the typed flags every target command gets
    bad = CliRunner().invoke(cli, ["replay", str(trace), "--quantization", "int3"])
    assert bad.exit_code != 0 and "int3" in bad.output


def test_profile_stores_and_exports_the_dtypes(tmp_path):
    from tuner.profile.export import export_profile
    from tuner.profile.model import Profile, ProfileTarget, load_profile, save_profile
    from tuner.sim.settings import SchedulerSettings

    prof = Profile(name="p", scheduler=SchedulerSettings(),
                   target=ProfileTarget(hardware="mi355x", model="llama-3.1-70b", tp=8,
                                        num_gpus=8, quantization="fp8", kv_cache_dtype="fp8"))
    path = tmp_path / "p.yaml"
    save_profile(prof, path)
    back = load_profile(path)
    assert (back.target.quantization, back.target.kv_cache_dtype) == ("fp8", "fp8")
    flags = export_profile(back, "flags")
    assert "--quantization fp8" in flags and "--kv-cache-dtype fp8" in flags
    plain = ProfileTarget(hardware="mi355x", model="m")
    assert "quantization" not in plain.to_dict()  # older profiles stay byte-identical
    bad = path.read_text().replace("quantization: fp8", "quantization: int3")
    path.write_text(bad)
    with pytest.raises(Exception, match="target.quantization"):
        load_profile(path)


# ------------------------------------------------------------------ Hugging Face ids
def _fake_aic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in aiconfigurator_core package holding one config (no wheel needed)."""
    pkg = tmp_path / "site" / "aiconfigurator_core"
    (pkg / "model_configs").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    cfg = json.loads((PRESET_DIR / "llama-3.1-70b.json").read_text())
    # an id this wheel does not bundle (bundled ids never reach the extra: test_hub_ids.py)
    (pkg / "model_configs" / "nvidia--Llama-3.1-70B-Instruct-FP8_config.json").write_text(
        json.dumps(cfg))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for mod in [m for m in sys.modules if m.startswith("aiconfigurator_core")]:
        monkeypatch.delitem(sys.modules, mod)
    return pkg


def test_hugging_face_ids_resolve_from_the_extra_without_importing_it(tmp_path, monkeypatch):
    _fake_aic(tmp_path, monkeypatch)
    m = load_model("nvidia/Llama-3.1-70B-Instruct-FP8")
    assert m.name == "nvidia/Llama-3.1-70B-Instruct-FP8" and m.num_layers == 80
    with pytest.raises(ConfigError, match="ships no config for this id; close: nvidia/Llama"):
        load_model("nvidia/Llama-9")


def test_missing_extra_names_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "aiconfigurator_core" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[aic\]'.*never downloads"):
        load_model("moonshotai/Kimi-K3")  # not bundled (Kimi-K2.5 is)
