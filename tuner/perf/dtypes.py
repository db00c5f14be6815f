"""Dtypes as vLLM names them: ``--quantization`` methods and ``--kv-cache-dtype`` values.

The step-time model prices each GEMM by its *kernel format*: the weight format the
kernel streams and the arithmetic it runs (``bf16``, ``fp8`` W8A8, ``fp4`` MXFP4/NVFP4
W4A4 where the GPU has FP4 units, ``int4`` W4A16 as AWQ/GPTQ/Marlin run). This module
maps vLLM's names onto those formats:

* ``--quantization`` (vLLM ``QuantizationMethods``): ``fp8``, ``ptpc_fp8``,
  ``fbgemm_fp8``, ``modelopt`` (FP8) -> ``fp8``; ``mxfp4``, ``modelopt_fp4``, ``nvfp4``
  -> ``fp4``; ``awq``, ``awq_marlin``, ``gptq``, ``gptq_marlin``, ``marlin`` -> ``int4``;
  ``compressed-tensors`` and ``quark`` are containers whose scheme lives in the
  checkpoint's ``quantization_config`` (read by :func:`scheme_from_config`); ``none``
  (or no flag) = whatever the checkpoint is.
* ``--kv-cache-dtype``: ``auto`` (the model dtype), ``bfloat16``, ``float16``, ``fp8``,
  ``fp8_e4m3``, ``fp8_e5m2``, ``fp8_inc``, ``fp8_ds_mla`` (DeepSeek MLA FP8 layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.errors import ConfigError

#: GEMM kernel formats the model prices, with the bytes one weight element takes.
#: FP4 = 4-bit values + one 8-bit scale per 32 (MXFP4; NVFP4's 16-wide FP8 scales are
#: 4.5 bits, within the noise); INT4 = 4 bits + a 16-bit scale per 128-group. ``fp8b`` is
#: block-scaled FP8 W8A8 (128x128 weight blocks with an fp32 scale each, 1x128 activation
#: groups quantized per token at run time: DeepSeek/MiniMax/Qwen3 FP8 checkpoints,
#: ``weight_block_size``), a kernel family of its own: vLLM runs it through
#: ``W8A8BlockFp8LinearOp`` (DeepGEMM, CUTLASS or FlashInfer block-scaled kernels on
#: NVIDIA; AITER's A8W8 block-scale GEMM on ROCm), whose activation-quantization launch and
#: per-block scale loads give it floors and efficiencies per-tensor FP8 does not have.
#: ``fp8moe`` is the routed experts of an FP8 checkpoint (per-tensor or block-scaled):
#: vLLM runs them through its fused-MoE kernels (Triton ``fused_moe`` W8A8, Marlin W8A16 on
#: Hopper, DeepGEMM / CUTLASS grouped GEMMs on Blackwell), a kernel family whose
#: efficiency has nothing to do with the dense CUTLASS scaled-mm's (aiconfigurator-core
#: measures them apart: docs/step-time-model.md §10), so it has its own coefficients.
#: ``int4moe`` is the same split for INT4 (W4A16) routed experts: vLLM runs them through
#: Marlin's fused MoE on NVIDIA (``fused_marlin_moe``), whose padded expert blocks and
#: in-register dequantisation make it a kernel of its own next to a dense GPTQ/AWQ Marlin
#: GEMM (``int4``); aiconfigurator-core measures it (``int4_wo`` MoE rows).
FORMAT_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "fp8b": 1.0 + 4.0 / (128 * 128),
                                  "fp8moe": 1.0, "fp4": 4.25 / 8, "int4": 4.125 / 8,
                                  "int4moe": 4.125 / 8}
#: Routed-expert kernel format by the experts' weight format, where the fused-MoE kernels
#: are a family of their own (the others price experts with the dense GEMM coefficients).
EXPERT_FORMATS: dict[str, str] = {"fp8": "fp8moe", "int4": "int4moe"}

_FP8 = ("fp8", "ptpc_fp8", "fbgemm_fp8", "modelopt", "fp8_e4m3", "w8a8_fp8")
_FP4 = ("mxfp4", "modelopt_fp4", "nvfp4", "fp4", "w_mxfp4_a_mxfp6", "w4a6", "petit_nvfp4")
_INT4 = ("awq", "awq_marlin", "gptq", "gptq_marlin", "marlin", "int4", "w4a16")
_CONTAINERS = ("compressed-tensors", "compressed_tensors", "quark")

#: ``--quantization`` values accepted on the command line (``none`` = checkpoint dtype).
QUANTIZATION_CHOICES: tuple[str, ...] = (
    "none", "fp8", "ptpc_fp8", "fbgemm_fp8", "modelopt", "mxfp4", "modelopt_fp4", "nvfp4",
    "awq", "awq_marlin", "gptq", "gptq_marlin", "marlin", "compressed-tensors", "quark")

#: ``--kv-cache-dtype`` values (vLLM ``CacheDType``) and the element bytes they store.
KV_CACHE_DTYPES: dict[str, float | None] = {
    "auto": None, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0, "fp8_inc": 1.0, "fp8_ds_mla": 1.0,
}


@dataclass(frozen=True, slots=True)
class QuantScheme:
    """Kernel formats of a checkpoint's linear layers (``None`` = the activation dtype)."""

    method: str  # vLLM quantization name it came from ("none" = unquantized)
    dense: str | None = None  # attention projections and dense MLP
    experts: str | None = None  # routed and shared experts
    attention: str | None = None  # attention projections when they differ from dense


def normalize_quantization(name: str | None) -> str:
    """Lower-case vLLM ``--quantization`` name, or refuse one the model cannot price."""
    key = "none" if name is None else str(name).strip().lower()
    if key in ("", "none", "null"):
        return "none"
    if key not in _FP8 + _FP4 + _INT4 + _CONTAINERS:
        raise ConfigError(f"--quantization {name!r} is not modelled; use one of "
                          f"{', '.join(QUANTIZATION_CHOICES)}")
    return key.replace("_", "-") if key == "compressed_tensors" else key


def format_of(method: str) -> str | None:
    """Kernel format of a single-scheme quantization method (None for containers)."""
    if method in _FP8:
        return "fp8"
    if method in _FP4:
        return "fp4"
    if method in _INT4:
        return "int4"
    return None


def scheme_for(method: str | None, config_quant: dict[str, Any] | None = None, *,
               source: str = "config") -> QuantScheme:
    """The checkpoint's scheme: ``method`` (the flag) over ``config_quant`` (its config).

    Raises:
        ConfigError: a container method (``compressed-tensors``, ``quark``) with no
            ``quantization_config`` to say which scheme it holds, or a config scheme
            the model cannot price.
    """
    flag = normalize_quantization(method)
    from_config = scheme_from_config(config_quant, source=source) if config_quant else None
    if flag == "none":
        return from_config or QuantScheme("none")
    fmt = format_of(flag)
    if fmt is None:  # a container: the checkpoint says what is inside
        if from_config is None:
            raise ConfigError(f"--quantization {flag}: the model config has no "
                              "quantization_config saying which scheme it holds; pass the "
                              "scheme itself (fp8, mxfp4, awq, ...)")
        return from_config
    if from_config is not None and from_config.method != "none":
        # the flag picks the format; keep what the checkpoint leaves unquantized
        keep_attn = from_config.attention if from_config.attention != from_config.dense else None
        return QuantScheme(flag, dense=fmt if from_config.dense else None, experts=fmt,
                           attention=keep_attn)
    return QuantScheme(flag, dense=fmt, experts=fmt)


def scheme_from_config(quant: dict[str, Any], *, source: str = "config") -> QuantScheme:
    """Read a Hugging Face ``quantization_config`` (fp8, mxfp4, modelopt, awq, gptq,
    compressed-tensors, quark, bitsandbytes-free)."""
    method = str(quant.get("quant_method", "")).strip().lower()
    if not method:
        return QuantScheme("none")
    skipped = [str(m) for m in (quant.get("modules_to_not_convert") or quant.get("ignore")
                                or quant.get("exclude") or [])]
    keep_attn = any("self_attn" in m or "attn" in m.split(".")[-1] for m in skipped)
    keep_mlp = any(m.endswith("mlp") or m.endswith("experts") for m in skipped)
    # dense MLPs left unquantized beside quantized experts (Kimi-K2.5: "mlp.down_proj")
    keep_dense = keep_mlp or any("mlp" in m and ("down" in m or "gate_up" in m) for m in skipped)
    if method == "modelopt":
        algo = str(quant.get("quant_algo", "fp8")).lower()
        fmt = "fp4" if "fp4" in algo else "fp8"
    elif method == "fp8" and quant.get("weight_block_size"):
        # block-scaled FP8: the dense and attention linears run the block-scaled GEMMs;
        # the routed experts run vLLM's fused MoE kernel, priced as fp8 (its measured
        # block-scaled tables agree with the fp8 coefficients, docs/step-time-model.md §10)
        return QuantScheme(method, dense=None if keep_dense else "fp8b",
                           experts=None if keep_mlp else "fp8",
                           attention=None if keep_attn or keep_mlp else "fp8b")
    elif method in ("compressed-tensors", "compressed_tensors"):
        fmt = _compressed_tensors_format(quant, source)
    elif method == "quark":
        fmt = _quark_format(quant, source)
    else:
        fmt = format_of(method)
        if fmt is None:
            raise ConfigError(f"{source}: field 'quantization_config.quant_method'={method!r} "
                              f"is not modelled; supported: {', '.join(QUANTIZATION_CHOICES[1:])}")
    return QuantScheme(method, dense=None if keep_dense else fmt,
                       experts=None if keep_mlp else fmt,
                       attention=None if keep_attn or keep_mlp else fmt)


def _compressed_tensors_format(quant: dict[str, Any], source: str) -> str:
    """compressed-tensors: the first config group's weight bits and type."""
    groups = quant.get("config_groups") or {}
    for group in groups.values() if isinstance(groups, dict) else []:
        weights = group.get("weights") or {} if isinstance(group, dict) else {}
        bits, kind = weights.get("num_bits"), str(weights.get("type", "int")).lower()
        if bits == 8:
            return "fp8" if kind == "float" else "fp8"  # W8A8 int8 runs at the fp8 rate class
        if bits == 4:
            return "fp4" if kind == "float" else "int4"
    raise ConfigError(f"{source}: field 'quantization_config.config_groups' gives no "
                      "4- or 8-bit weight scheme; pass --quantization fp8/mxfp4/awq")


def _quark_format(quant: dict[str, Any], source: str) -> str:
    """AMD Quark: ``global_quant_config.weight.dtype`` (fp8_e4m3, fp4, int4...)."""
    glob = quant.get("global_quant_config") or {}
    weight = glob.get("weight") or {} if isinstance(glob, dict) else {}
    if isinstance(weight, list):
        weight = weight[0] if weight else {}
    dtype = str(weight.get("dtype", "")).lower()
    if "fp8" in dtype:
        return "fp8"
    if "fp4" in dtype:
        return "fp4"
    if "int4" in dtype or "uint4" in dtype:
        return "int4"
    raise ConfigError(f"{source}: field 'quantization_config.global_quant_config.weight.dtype'"
                      f"={dtype!r} is not modelled; pass --quantization fp8/mxfp4")


def normalize_kv_cache_dtype(name: str | None) -> str:
    """vLLM's ``--kv-cache-dtype`` value, checked (``None`` -> ``auto``)."""
    key = "auto" if name is None else str(name).strip().lower()
    if key in ("bf16",):
        key = "bfloat16"
    if key in ("fp16", "half"):
        key = "float16"
    if key not in KV_CACHE_DTYPES:
        raise ConfigError(f"--kv-cache-dtype {name!r} is not a vLLM cache dtype; use one of "
                          f"{', '.join(KV_CACHE_DTYPES)}")
    return key
