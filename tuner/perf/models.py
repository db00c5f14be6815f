"""Model shapes for the step-time model, read from a Hugging Face ``config.json``.

``ModelSpec`` keeps the handful of numbers a roofline needs (layer count, widths,
attention kind, experts, dtypes) and derives from them, once, the parameter counts
and the per-GPU byte and FLOP figures under tensor parallelism. The derivation
follows vLLM's sharding (``vllm/model_executor/layers/linear.py`` @ 0.33.0):

* q/o projections, MLP and expert intermediate dims, vocabulary: split over TP ranks;
* GQA k/v heads: split while ``tp <= num_kv_heads``, replicated beyond that
  (``QKVParallelLinear.num_kv_head_replicas``);
* MLA: ``q_a_proj`` and ``kv_a_proj_with_mqa`` are replicated, ``q_b``/``kv_b``/``o``
  split; the latent KV cache is replicated on every rank;
* norms, router (gate) and biases of replicated layers: replicated.

Supported field names: Llama/Qwen (dense, GQA), Mixtral (``num_local_experts``),
Qwen-MoE (``num_experts``, ``moe_intermediate_size``,
``shared_expert_intermediate_size``, ``decoder_sparse_step``, ``mlp_only_layers``),
DeepSeek-V2/V3 (``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``,
``moe_layer_freq``, MLA ``q_lora_rank``/``kv_lora_rank``/``qk_rope_head_dim``/
``qk_nope_head_dim``/``v_head_dim``) and gpt-oss (``num_local_experts``, ``layer_types``
with sliding-window layers, MXFP4 ``quantization_config``). Multimodal configs with a
``text_config`` use that.

Deliberate simplifications (documented in docs/step-time-model.md): multi-token
prediction layers (``num_nextn_predict_layers``) are not counted, because vLLM loads
them only for speculative decoding; MLP blocks are gated (SwiGLU, three matrices).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from tuner.errors import ConfigError
from tuner.loaders import load_json
from tuner.perf.dtypes import (format_of, normalize_kv_cache_dtype, normalize_quantization,
                               scheme_for, scheme_from_config)
from tuner.perf.hardware import find_preset, preset_names

AttentionKind = Literal["gqa", "mla"]

#: Bytes per stored element for the dtypes tuner understands. FP4 is MXFP4: 4-bit
#: values plus one 8-bit scale per 32 (4.25 bits); FP8 block scales are negligible.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp8b": 1.0 + 4.0 / (128 * 128),
    "fp8moe": 1.0, "fp4": 4.25 / 8, "int4": 4.125 / 8, "int4moe": 4.125 / 8,
}

_DTYPE_ALIASES = {
    "float32": "fp32", "float": "fp32", "fp32": "fp32",
    "bfloat16": "bf16", "bf16": "bf16",
    "float16": "fp16", "half": "fp16", "fp16": "fp16",
    "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float8_e4m3fn": "fp8",
    "float8": "fp8", "e4m3": "fp8", "fp8b": "fp8b", "fp8_block": "fp8b",
    "fp4": "fp4", "mxfp4": "fp4", "nvfp4": "fp4", "int4": "int4",
}

PRESET_DIR = Path(__file__).parent / "presets" / "models"


def normalize_dtype(name: str, *, where: str = "dtype") -> str:
    """Map ``bfloat16``/``float8_e4m3fn``/``mxfp4``... to ``bf16``/``fp8``/``fp4``."""
    key = str(name).strip().lower()
    if key not in _DTYPE_ALIASES:
        raise ConfigError(f"{where}={name!r} is not a known dtype; use one of "
                          f"{', '.join(sorted(DTYPE_BYTES))}")
    return _DTYPE_ALIASES[key]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of a decoder-only transformer, as far as step time and KV size need it.

    Counts are per model (not per GPU); the ``*_per_gpu`` methods apply TP sharding.
    """

    name: str  # preset name or the config path it came from
    model_type: str  # HF ``model_type`` (llama, qwen3, deepseek_v3, gpt_oss, ...)
    num_layers: int  # decoder layers (num_hidden_layers), MTP layers excluded
    hidden_size: int  # residual width
    vocab_size: int
    num_attention_heads: int  # query heads
    num_kv_heads: int  # GQA key/value heads (MLA: equal to query heads, unused)
    head_dim: int  # GQA head dim (MLA: qk_nope + qk_rope)
    intermediate_size: int  # dense MLP width (0 if no dense layer)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v (and, for gpt-oss, o) biases
    attention: AttentionKind = "gqa"
    attention_sinks: bool = False  # learned per-head sinks (gpt-oss); narrows backend choice
    # MLA (DeepSeek-V2/V3); zero for GQA models
    q_lora_rank: int = 0  # 0 = no low-rank query (q_proj directly)
    kv_lora_rank: int = 0  # latent KV width (the cached part, with qk_rope_head_dim)
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # MoE; num_experts == 0 means dense
    num_experts: int = 0  # routed experts per MoE layer
    num_experts_per_tok: int = 0  # top-k
    moe_intermediate_size: int = 0  # one routed expert's width
    shared_expert_intermediate_size: int = 0  # total width of always-on shared experts
    num_moe_layers: int = 0  # layers whose MLP is an MoE block (the rest are dense)
    expert_bias: bool = False  # gpt-oss experts carry biases
    # sliding-window attention (gpt-oss); layers with a window hold at most W tokens
    sliding_window: int = 0  # tokens; 0 = no sliding layers
    num_sliding_layers: int = 0
    # linear-attention layers (Qwen3.5/3.6 Gated DeltaNet): a fixed-size state per
    # request instead of a KV cache that grows with the context; their projections are
    # priced like attention projections, their scan in tuner/perf/linear_attention.py
    num_linear_layers: int = 0
    linear_attn_params: int = 0  # projections of one linear-attention layer (split over TP)
    # Gated DeltaNet heads (split over TP like attention heads) and the recurrent state's
    # bytes per element (config ``mamba_ssm_dtype``; the model dtype when absent)
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_state_bytes: float = 2.0
    attn_output_gate: bool = False  # Qwen3.5/3.6 gated attention: q_proj also emits a gate
    # dtypes (normalized names, see DTYPE_BYTES)
    act_dtype: str = "bf16"  # torch_dtype: activations, embeddings, norms, router
    weight_dtype: str = "bf16"  # linear layers in attention and dense MLP
    expert_weight_dtype: str = "bf16"  # routed and shared experts
    attn_weight_dtype: str = "bf16"  # attention projections (gpt-oss keeps them bf16)
    kv_dtype: str = "bf16"  # KV cache; vLLM's kv_cache_dtype=auto is the model dtype
    max_position_embeddings: int = 131072
    quantization: str = "none"  # vLLM quantization method the weights use ("none": checkpoint dtype)
    kv_cache_dtype: str = "auto"  # vLLM --kv-cache-dtype name behind kv_dtype

    # ------------------------------------------------------------------ shape
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def backend_kind(self) -> str:
        """What the attention backend choice depends on: ``mla``, ``gqa_sinks`` or ``gqa``."""
        if self.attention == "mla":
            return "mla"
        return "gqa_sinks" if self.attention_sinks else "gqa"

    @property
    def num_full_layers(self) -> int:
        """Layers with full (unbounded) attention."""
        return self.num_layers - self.num_sliding_layers - self.num_linear_layers

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # ---------------------------------------------------- parameter counts
    def _attn_parts(self) -> tuple[int, int, int]:
        """Attention parameters of one layer: (split over TP, replicated, kv proj).

        ``kv proj`` (GQA k/v weights) is reported apart because its sharding stops at
        ``num_kv_heads`` ranks.
        """
        h = self.hidden_size
        nh = self.num_attention_heads
        if self.attention == "mla":
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            replicated = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            if self.q_lora_rank:
                replicated += h * self.q_lora_rank + self.q_lora_rank
                split = self.q_lora_rank * nh * qk
            else:
                split = h * nh * qk
            split += self.kv_lora_rank * nh * (self.qk_nope_head_dim + self.v_head_dim)
            split += nh * self.v_head_dim * h
            return split, replicated, 0
        hd = self.head_dim
        split = (3 if self.attn_output_gate else 2) * h * nh * hd  # q (+ gate) and o
        kv = 2 * h * self.num_kv_heads * hd
        if self.attention_bias:
            split += nh * hd
            kv += 2 * self.num_kv_heads * hd
        replicated = 0
        if self.model_type == "gpt_oss":
            replicated += h + nh  # o_proj bias (added once) and attention sinks
        return split, replicated, kv

    def _expert_params(self) -> int:
        """One routed expert (gate, up, down)."""
        p = 3 * self.hidden_size * self.moe_intermediate_size
        if self.expert_bias:
            p += 2 * self.moe_intermediate_size + self.hidden_size
        return p

    def _router_params(self) -> int:
        p = self.hidden_size * self.num_experts
        if self.expert_bias or self.model_type in ("deepseek_v3",):
            p += self.num_experts  # router bias / e_score_correction_bias
        return p

    def param_groups(self) -> dict[str, int]:
        """Parameter counts by group (whole model).

        Keys: ``embed``, ``lm_head``, ``attn``, ``dense_mlp``, ``experts`` (all routed
        experts of all MoE layers), ``shared_experts``, ``router``, ``norms``.
        """
        split, replicated, kv = self._attn_parts()
        h = self.hidden_size
        norms = self.num_layers * 2 * h + h
        return {
            "embed": self.vocab_size * h,
            "lm_head": 0 if self.tie_word_embeddings else self.vocab_size * h,
            "attn": (self.num_layers - self.num_linear_layers) * (split + replicated + kv)
                    + self.num_linear_layers * self.linear_attn_params,
            "dense_mlp": self.num_dense_layers * 3 * h * self.intermediate_size,
            "experts": self.num_moe_layers * self.num_experts * self._expert_params(),
            "shared_experts": self.num_moe_layers * 3 * h * self.shared_expert_intermediate_size,
            "router": self.num_moe_layers * self._router_params() if self.is_moe else 0,
            "norms": norms,
        }

    @property
    def total_params(self) -> int:
        """All weights vLLM loads (MTP layers excluded)."""
        return sum(self.param_groups().values())

    @property
    def active_params(self) -> int:
        """Parameters one token multiplies: routed experts counted top-k of E per layer.

        The input embedding is a lookup, not a matmul, so it is excluded unless tied
        to the LM head (this is how "5.1B active" for gpt-oss-120b and "37B active"
        for DeepSeek-V3 are counted).
        """
        g = self.param_groups()
        active = sum(g.values()) - (0 if self.tie_word_embeddings else g["embed"])
        if self.is_moe:
            inactive = self.num_experts - self.num_experts_per_tok
            active -= self.num_moe_layers * inactive * self._expert_params()
        return active

    # ------------------------------------------------------ per-GPU figures
    def kv_heads_per_gpu(self, tp: int) -> int:
        """vLLM: kv heads split while tp <= kv heads, else one (replicated) per rank."""
        return max(1, self.num_kv_heads // tp) if tp <= self.num_kv_heads else 1

    def kv_bytes_per_token_layer(self, tp: int) -> float:
        """KV-cache bytes one token needs in one attention layer on one GPU."""
        b = DTYPE_BYTES[self.kv_dtype]
        if self.attention == "mla":
            if self.kv_cache_dtype == "fp8_ds_mla":
                # FlashMLA's FP8 layout: 512 fp8 latent + 4 fp32 scales + 64 bf16 rope
                return float(self.kv_lora_rank + 16 + 2 * self.qk_rope_head_dim)
            return (self.kv_lora_rank + self.qk_rope_head_dim) * b  # replicated per rank
        return 2 * self.kv_heads_per_gpu(tp) * self.head_dim * b

    def kv_bytes_per_token(self, tp: int) -> float:
        """KV bytes per token per GPU over the full-attention layers.

        Sliding-window layers are left out: each request holds at most a window of
        them, so they do not grow with context (see docs/step-time-model.md).
        """
        return self.num_full_layers * self.kv_bytes_per_token_layer(tp)

    def weight_bytes_per_gpu(self, tp: int) -> dict[str, float]:
        """Bytes of weights one TP rank holds, by group (see :meth:`param_groups`)."""
        split, replicated, kv = self._attn_parts()
        act = DTYPE_BYTES[self.act_dtype]
        attn_b = DTYPE_BYTES[self.attn_weight_dtype]
        kv_share = self.kv_heads_per_gpu(tp) / max(1, self.num_kv_heads)
        softmax_layers = self.num_layers - self.num_linear_layers
        attn = softmax_layers * (split / tp + kv * kv_share) * attn_b
        attn += softmax_layers * replicated * (attn_b if self.attention == "mla" else act)
        attn += self.num_linear_layers * self.linear_attn_params / tp * attn_b
        g = self.param_groups()
        exp_b = DTYPE_BYTES[self.expert_weight_dtype]
        return {
            "embed": g["embed"] * act / tp,
            "lm_head": g["lm_head"] * act / tp,
            "attn": attn,
            "dense_mlp": g["dense_mlp"] * DTYPE_BYTES[self.weight_dtype] / tp,
            "experts": g["experts"] * exp_b / tp,
            "shared_experts": g["shared_experts"] * exp_b / tp,
            "router": g["router"] * act,
            "norms": g["norms"] * act,
        }

    def with_dtypes(self, *, weight_dtype: str | None = None,
                    kv_cache_dtype: str | None = None,
                    quantization: str | None = None) -> "ModelSpec":
        """Apply ``Target``'s dtype choices, as vLLM's flags would.

        ``quantization`` (vLLM ``--quantization``; ``none``/None = the checkpoint's own
        scheme) sets the kernel format of the linear layers, keeping the layers the
        checkpoint leaves unquantized (gpt-oss attention). ``weight_dtype`` (a tuner-only
        override) applies one format to every linear layer. ``kv_cache_dtype`` ``auto``
        means the activation dtype, as in vLLM.
        """
        spec = self
        method = normalize_quantization(quantization)
        if method != "none":
            fmt = format_of(method)
            if fmt is None:  # compressed-tensors / quark: the config says what is inside
                if spec.quantization == "none":
                    scheme_for(method, None)  # raises: nothing says which scheme
            elif spec.quantization != "none":
                # a quantized checkpoint: the flag's format for the layers it quantizes,
                # the rest (gpt-oss and Kimi attention, dense MLPs) stay as they are
                def swap(dtype: str) -> str:
                    # --quantization fp8 on a block-scaled FP8 checkpoint keeps its block
                    # scales (vLLM's Fp8Config reads weight_block_size from the checkpoint)
                    if dtype == spec.act_dtype or (fmt == "fp8" and dtype == "fp8b"):
                        return dtype
                    return fmt

                spec = replace(spec, weight_dtype=swap(spec.weight_dtype),
                               expert_weight_dtype=swap(spec.expert_weight_dtype),
                               attn_weight_dtype=swap(spec.attn_weight_dtype),
                               quantization=method)
            else:
                spec = replace(spec, weight_dtype=fmt, expert_weight_dtype=fmt,
                               attn_weight_dtype=fmt, quantization=method)
        if weight_dtype is not None:
            w = normalize_dtype(weight_dtype, where="weight_dtype")
            spec = replace(spec, weight_dtype=w, expert_weight_dtype=w, attn_weight_dtype=w)
        if kv_cache_dtype is not None:
            name = normalize_kv_cache_dtype(kv_cache_dtype)
            if name == "fp8_ds_mla" and spec.attention != "mla":  # vLLM refuses it too
                raise ConfigError(f"--kv-cache-dtype fp8_ds_mla is the FP8 layout of MLA "
                                  f"attention (DeepSeek); {spec.name} uses {spec.attention} "
                                  "attention: use fp8")
            kv = spec.act_dtype if name == "auto" else (
                "fp8" if name.startswith("fp8") else normalize_dtype(name, where="kv_cache_dtype"))
            spec = replace(spec, kv_dtype=kv, kv_cache_dtype=name)
        return spec


# ---------------------------------------------------------------- loading
#: The optional package whose wheel ships Hugging Face config.json files by model id.
AIC_PACKAGE = "aiconfigurator_core"
AIC_EXTRA = "pip install -e '.[aic]'  (or: pip install aiconfigurator-core)"

#: Hugging Face ids of the bundled presets. The first is the Hub repository ``export``
#: serves (presets/models/SOURCES.md); the others are the same architecture under the
#: names people type: Meta's base and ``-Instruct`` checkpoints, before and after the
#: ``Meta-`` prefix was dropped, share every shape field of ``config.json``.
PRESET_HUB_IDS: dict[str, tuple[str, ...]] = {
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B",
                     "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct"),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B",
                      "meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B-Instruct"),
    "qwen3-32b": ("Qwen/Qwen3-32B",),
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3",),
    "gpt-oss-120b": ("openai/gpt-oss-120b",),
}

#: Hub configs bundled for the benchmark fit (data/models/SOURCES.md), one ``org--name.json``
#: per id; they resolve by id on the base install like the presets.
BUNDLED_CONFIG_DIR = Path(__file__).parent / "data" / "models"


def bundled_hf_config(model_id: str) -> Path | None:
    """The config this wheel itself ships for a Hugging Face id (a preset's or a bundled
    config's, matched in any case as the Hub does), else None. Checked before the optional
    extra, so an id resolves to the same shape with or without aiconfigurator-core."""
    wanted = model_id.strip().lower()
    for preset, ids in PRESET_HUB_IDS.items():
        if wanted in (i.lower() for i in ids):
            return PRESET_DIR / f"{preset}.json"
    for candidate in BUNDLED_CONFIG_DIR.glob("*.json"):
        if candidate.stem.replace("--", "/", 1).lower() == wanted:
            return candidate
    return None


def aic_model_dir() -> Path | None:
    """``aiconfigurator_core/model_configs`` if the package is installed, found without
    importing it (its ``__init__`` pulls pandas; tuner.perf must stay light)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(AIC_PACKAGE)
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(root) / "model_configs"
        if folder.is_dir():
            return folder
    return None


def hf_config_path(model_id: str) -> Path:
    """The ``config.json`` of a Hugging Face id (``org/name``); never a download. The ids
    of bundled presets and configs resolve from this wheel; any other id from the optional
    aiconfigurator-core package.

    Raises:
        ConfigError: the id is malformed, not bundled and the aiconfigurator-core extra is
            missing (the message says how to install it), or the package has no config for
            the id (the message lists close ids).
    """
    parts = model_id.strip().split("/")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"--model {model_id!r}: not a file, folder, preset or Hugging Face "
                          "id (org/name)")
    bundled = bundled_hf_config(model_id)
    if bundled is not None:
        return bundled
    folder = aic_model_dir()
    if folder is None:
        raise ConfigError(f"--model {model_id!r} is a Hugging Face id; tuner reads the configs "
                          f"of such ids from the aiconfigurator-core package, which is not "
                          f"installed: {AIC_EXTRA}; or pass a local config.json "
                          "(tuner never downloads from a model hub)")
    stem = f"{parts[0]}--{parts[1]}"
    for candidate in folder.glob("*_config.json"):
        if candidate.name[:-len("_config.json")].lower() == stem.lower():
            return candidate
    known = sorted(c.name[:-len("_config.json")].replace("--", "/", 1)
                   for c in folder.glob("*_config.json") if not c.name.endswith("quant_config.json"))
    close = [k for k in known if parts[1].lower().split("-")[0] in k.lower()][:8]
    raise ConfigError(f"--model {model_id!r}: aiconfigurator-core ships no config for this id"
                      + (f"; close: {', '.join(close)}" if close else "")
                      + "; pass a local config.json instead")


def list_models() -> list[str]:
    """Names of the bundled model presets."""
    return preset_names(PRESET_DIR, ".json")


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A ``ModelSpec`` from a preset name, a ``config.json`` path or its folder, or a
    Hugging Face id (:func:`hf_config_path`; the spec is named by the id as typed).

    Raises:
        ConfigError: unknown preset (the message lists the presets), unreadable or
            invalid config (the message names the file and field).
    """
    text = str(name_or_path)
    hub_id = ""  # the Hugging Face id as typed, when the config came from one
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
    elif not path.exists():
        if (PRESET_DIR / f"{text.lower()}.json").is_file() or "/" not in text:
            path = find_preset(text, PRESET_DIR, ".json", kind="model",
                               not_a="not a file or folder,")
        else:
            path = hf_config_path(text)
            hub_id = text.strip()
    config = load_json(path, "model config", mapping=True).data
    name = hub_id if hub_id else (path.stem if path.parent == PRESET_DIR else str(path))
    return model_from_config(config, name=name, source=str(path))


def model_from_config(config: dict[str, Any], *, name: str, source: str = "config") -> ModelSpec:
    """Build a ``ModelSpec`` from a parsed HF config (see module docstring for fields)."""
    if isinstance(config.get("text_config"), dict):
        merged = dict(config["text_config"])
        merged.setdefault("quantization_config", config.get("quantization_config"))
        merged.setdefault("torch_dtype", config.get("torch_dtype"))
        config = merged

    def req(key: str) -> int:
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{source}: field {key!r} must be a positive integer, "
                              f"got {value!r}")
        return value

    def opt(*keys: str, default: int = 0) -> int:
        for key in keys:
            value = config.get(key)
            if value is not None:
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ConfigError(f"{source}: field {key!r} must be a non-negative "
                                      f"integer, got {value!r}")
                return value
        return default

    model_type = str(config.get("model_type", ""))
    layers = req("num_hidden_layers")
    hidden = req("hidden_size")
    heads = req("num_attention_heads")
    vocab = req("vocab_size")
    kv_heads = opt("num_key_value_heads", default=heads)
    head_dim = opt("head_dim", default=hidden // heads)

    mla = opt("kv_lora_rank") > 0
    fields: dict[str, Any] = {}
    if mla:
        fields.update(
            attention="mla", q_lora_rank=opt("q_lora_rank"), kv_lora_rank=req("kv_lora_rank"),
            qk_nope_head_dim=req("qk_nope_head_dim"), qk_rope_head_dim=req("qk_rope_head_dim"),
            v_head_dim=req("v_head_dim"))
        head_dim = fields["qk_nope_head_dim"] + fields["qk_rope_head_dim"]
        kv_heads = heads

    experts = opt("num_local_experts", "n_routed_experts", "num_experts")
    if experts:
        top_k = opt("num_experts_per_tok", "experts_per_token", "num_experts_per_token")
        if top_k <= 0 or top_k > experts:
            raise ConfigError(f"{source}: field 'num_experts_per_tok' must be in "
                              f"[1, {experts}], got {top_k}")
        moe_inter = opt("moe_intermediate_size") or req("intermediate_size")
        shared = opt("n_shared_experts") * moe_inter + opt("shared_expert_intermediate_size")
        moe_layers = _count_moe_layers(config, layers, source)
        fields.update(num_experts=experts, num_experts_per_tok=top_k,
                      moe_intermediate_size=moe_inter, shared_expert_intermediate_size=shared,
                      num_moe_layers=moe_layers, expert_bias=model_type == "gpt_oss")
        intermediate = (opt("dense_intermediate_size", "intermediate_size")
                        if moe_layers < layers else 0)
    else:
        intermediate = req("intermediate_size")

    window, sliding = _sliding_layers(config, layers)
    layer_types = config.get("layer_types")
    linear = (sum(1 for t in layer_types[:layers] if t == "linear_attention")
              if isinstance(layer_types, list) else 0)
    linear_params = 0
    nk = dk = nv = dv = 0
    if linear:  # Gated DeltaNet: in_proj_qkvz, in_proj_ba, out_proj
        nk, dk = opt("linear_num_key_heads"), opt("linear_key_head_dim")
        nv, dv = opt("linear_num_value_heads"), opt("linear_value_head_dim")
        linear_params = hidden * (2 * nk * dk + 2 * nv * dv + 2 * nv) + nv * dv * hidden
    dtypes = _dtypes(config, source)
    ssm = config.get("mamba_ssm_dtype")
    state_bytes = DTYPE_BYTES[normalize_dtype(ssm, where=f"{source}: mamba_ssm_dtype")] \
        if isinstance(ssm, str) else DTYPE_BYTES[dtypes.get("act_dtype", "bf16")]
    max_pos = opt("max_position_embeddings", default=131072)
    return ModelSpec(
        name=name, model_type=model_type, num_layers=layers, hidden_size=hidden,
        vocab_size=vocab, num_attention_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=intermediate,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", False) or model_type in ("qwen2", "qwen2_moe")),
        sliding_window=window, num_sliding_layers=sliding, num_linear_layers=linear,
        linear_attn_params=linear_params, attn_output_gate=bool(config.get("attn_output_gate")),
        linear_num_key_heads=nk, linear_num_value_heads=nv, linear_key_head_dim=dk,
        linear_value_head_dim=dv, linear_state_bytes=state_bytes,
        attention_sinks=model_type == "gpt_oss", max_position_embeddings=max_pos, **fields, **dtypes)


def _count_moe_layers(config: dict[str, Any], layers: int, source: str) -> int:
    """Layers with an MoE MLP: DeepSeek ``first_k_dense_replace``/``moe_layer_freq``,
    Qwen-MoE ``decoder_sparse_step``/``mlp_only_layers``; otherwise every layer."""
    first_dense = int(config.get("first_k_dense_replace") or 0)
    pattern = config.get("moe_layer_freq")
    if isinstance(pattern, list):  # MiniMax-M3: one 0/1 flag per layer
        return sum(1 for flag in pattern[:layers] if flag)
    freq = int(pattern or config.get("decoder_sparse_step") or 1)
    if freq < 1:
        raise ConfigError(f"{source}: field 'moe_layer_freq' must be >= 1, got {freq}")
    mlp_only = set(config.get("mlp_only_layers") or [])
    count = 0
    for i in range(layers):
        if i < first_dense or i in mlp_only:
            continue
        if "decoder_sparse_step" in config:
            if (i + 1) % freq == 0:
                count += 1
        elif (i - first_dense) % freq == 0:
            count += 1
    return count


def _sliding_layers(config: dict[str, Any], layers: int) -> tuple[int, int]:
    """(window, number of sliding-window layers); (0, 0) when every layer is full."""
    window = config.get("sliding_window")
    layer_types = config.get("layer_types")
    if not window or config.get("use_sliding_window") is False:
        return 0, 0
    if isinstance(layer_types, list):
        sliding = sum(1 for t in layer_types[:layers] if t == "sliding_attention")
        return (int(window), sliding) if sliding else (0, 0)
    return 0, 0  # a window without layer types (Mistral-style) is not modelled


def _dtypes(config: dict[str, Any], source: str) -> dict[str, str]:
    """Activation, weight and KV dtypes from ``torch_dtype``/``dtype`` and the
    ``quantization_config`` (:func:`tuner.perf.dtypes.scheme_from_config`)."""
    act_name = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    act = normalize_dtype(act_name, where=f"{source}: torch_dtype")
    if act == "fp32":
        act = "bf16"  # vLLM serves fp32 checkpoints in bf16 by default
    quant = config.get("quantization_config")
    scheme = scheme_from_config(quant, source=source) if isinstance(quant, dict) else None
    method = scheme.method if scheme else "none"
    dense = (scheme.dense if scheme else None) or act
    expert = (scheme.experts if scheme else None) or act
    attn = (scheme.attention if scheme else None) or act
    return {"act_dtype": act, "weight_dtype": dense, "expert_weight_dtype": expert,
            "attn_weight_dtype": attn, "kv_dtype": act, "quantization": method}


def expected_experts_touched(num_experts: int, top_k: int, num_tokens: float) -> float:
    """Distinct experts hit by ``num_tokens`` tokens under uniform top-k routing.

    ``E * (1 - (1 - k/E) ** T)``: 1 token hits k experts; many tokens approach E. It
    is never above ``min(E, T*k)``, the bound it refines.
    """
    if num_experts <= 0 or num_tokens <= 0:
        return 0.0
    return num_experts * (1.0 - math.pow(1.0 - top_k / num_experts, num_tokens))
