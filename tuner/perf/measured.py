"""Step time from NVIDIA's measured vLLM kernel tables (aiconfigurator-core), where covered.

``aiconfigurator-core`` (optional extra ``tuner[aic]``) ships per-GPU tables measured with
vLLM's own kernels. For the GPUs and models they cover, every kernel the tables measure
is priced from them instead of the roofline: the GEMMs (qkv, o, gate_up, down per layer,
router and shared experts of MoE layers, the LM head once), the custom all-reduce, the
fused MoE experts, and context and generation attention (full and sliding-window
layers). Sampling, CPU overhead, launch gaps, decode KV writes and the expert-parallel
all-to-all stay analytic (the roofline model's terms); the analytic floors of what is
measured (GEMM ``t0``, attention floor, MoE layer overhead) leave the launch term
because a measured kernel time includes its own floor.

Interpolation is AIConfigurator's own: at resolve time each op of this model at this TP
is evaluated through aiconfigurator-core's compiled engine (``EngineHandle.evaluate_ops_json``,
its public op-list surface, which interpolates and clamps its tables exactly as
AIConfigurator does). Token-count ops (GEMMs, all-reduce, MoE) are evaluated on a grid of
M and spread with ``np.interp`` onto every integer M up to ``m_max``; attention, which
depends on the number of requests *and* their lengths, on a 2-D grid
(:mod:`tuner.perf.measured_grid`). The model object holds plain tables, so it pickles
into a vLLM interpreter without aiconfigurator-core, and a step costs index lookups and
one or two bilinear interpolations (bench/bench_step_time.py).

Coverage (:func:`aic_coverage`): H100, H200 and B200; GQA models, dense or MoE, whose
GEMMs run bf16 or fp8 kernels (MoE experts: bf16, block-scaled fp8, MXFP4/NVFP4, INT4).
Anything else is refused with one line naming why, so ``--step-time-source auto`` falls
back to the analytic model and ``aic`` reports it.
"""

from __future__ import annotations

import bisect

import functools
from array import array
from typing import Any, Callable

from tuner.errors import ConfigError
from tuner.perf.fit.coefficients import Coefficients
from tuner.perf.hardware import HardwareSpec
from tuner.perf.models import ModelSpec
from tuner.perf.expert_parallel import expert_layout
from tuner.perf.measured_grid import Grid2D, attention_grids, evaluate, moe_column
from tuner.perf.step_time import RooflineStepTimeModel, kernel_format
from tuner.sim.batch import StepBatch

#: tuner hardware preset -> aiconfigurator-core system folder.
AIC_SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm"}
#: GEMM kernel format -> aiconfigurator-core ``GEMMQuantMode`` name.
AIC_GEMM_MODES = {"bf16": "bfloat16", "fp8": "fp8", "fp8b": "fp8_block"}
#: Step-time sources a ``Target`` may ask for.
STEP_TIME_SOURCES = ("auto", "analytic", "aic")
#: expert kernel format -> aiconfigurator-core ``MoEQuantMode`` name, per GPU family: the
#: fp8 MoE checkpoints vLLM serves (DeepSeek, Qwen3, MiniMax) are 128x128 block-scaled;
#: MXFP4 experts run the W4A16 (Marlin/Triton) kernels on Hopper, NVFP4 natively on B200.
AIC_MOE_MODES = {"bf16": "bfloat16", "fp8": "fp8_block", "int4": "int4_wo"}
#: NVFP4 checkpoints (``modelopt_fp4``, ``nvfp4``) run native FP4 MoE only on Blackwell
AIC_NVFP4_MOE = {"b200": "nvfp4"}
#: AIConfigurator's routing skew for vLLM MoE models (sdk/models/moe.py: power law 1.2;
#: DeepSeek-style models 1.01), so the measured MoE includes its load imbalance.
AIC_MOE_DISTRIBUTION = "power_law_1.2"
#: Token counts priced from the tables per index (one float each); above, linear
#: extrapolation on the last segment (a step never has more than max_num_batched_tokens).
DEFAULT_M_MAX = 16384


def _moe_mode(hardware_name: str, model: ModelSpec) -> str | None:
    fmt = kernel_format(model.expert_weight_dtype)
    if fmt != "fp4":
        return AIC_MOE_MODES.get(fmt)
    if model.quantization in ("modelopt_fp4", "nvfp4"):
        return AIC_NVFP4_MOE.get(hardware_name)
    return "w4a16_mxfp4"  # MXFP4 (gpt-oss): the W4A16 MoE kernels vLLM runs for it


def aic_coverage(hardware: HardwareSpec, model: ModelSpec) -> str | None:
    """``None`` when the tables cover this GPU and model, else why not (one clause)."""
    if hardware.name not in AIC_SYSTEMS:
        return (f"aiconfigurator-core has no measured tables for {hardware.name} "
                f"(covered: {', '.join(AIC_SYSTEMS)})")
    if model.attention != "gqa" or model.num_linear_layers:
        kind = "linear attention" if model.num_linear_layers else model.attention
        return f"measured step times cover GQA models only ({model.name} uses {kind})"
    gemm_formats = {kernel_format(model.attn_weight_dtype)}
    if model.num_dense_layers and model.intermediate_size:
        gemm_formats.add(kernel_format(model.weight_dtype))
    for fmt in sorted(gemm_formats):
        if fmt not in AIC_GEMM_MODES:
            return (f"aiconfigurator-core has no measured vLLM {fmt} GEMMs "
                    f"(covered: {', '.join(AIC_GEMM_MODES)})")
    if model.is_moe and _moe_mode(hardware.name, model) is None:
        return (f"aiconfigurator-core has no measured vLLM {model.expert_weight_dtype} MoE "
                f"kernels on {hardware.name}")
    return None


def aic_available() -> bool:
    """Whether aiconfigurator-core is importable (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("aiconfigurator_core") is not None


def _gemm_shapes(model: ModelSpec, tp: int) -> list[tuple[str, int, int, str, int]]:
    """(name, n, k, kernel format, layers) of the GEMMs on one rank, as vLLM runs them:
    attention projections in every layer, the dense MLP in dense layers, router and
    shared experts in MoE layers (the routed experts are the fused MoE op)."""
    q = model.num_attention_heads // tp * model.head_dim
    kv = model.kv_heads_per_gpu(tp) * model.head_dim
    attn_f, dense_f = kernel_format(model.attn_weight_dtype), kernel_format(model.weight_dtype)
    exp_f = kernel_format(model.expert_weight_dtype)
    layers, dense, moe = model.num_layers, model.num_dense_layers, model.num_moe_layers
    shapes = [("qkv", q + 2 * kv, model.hidden_size, attn_f, layers),
              ("o", model.hidden_size, q, attn_f, layers)]
    if dense and model.intermediate_size:
        inter = model.intermediate_size // tp
        shapes += [("gate_up", 2 * inter, model.hidden_size, dense_f, dense),
                   ("down", model.hidden_size, inter, dense_f, dense)]
    if moe:
        shapes.append(("router", model.num_experts, model.hidden_size, "bf16", moe))
        if model.shared_expert_intermediate_size:
            shared = model.shared_expert_intermediate_size // tp
            shapes += [("shared_gate_up", 2 * shared, model.hidden_size,
                        exp_f if exp_f in AIC_GEMM_MODES else "bf16", moe),
                       ("shared_down", model.hidden_size, shared,
                        exp_f if exp_f in AIC_GEMM_MODES else "bf16", moe)]
    return shapes


def _m_points(m_max: int) -> list[int]:
    """Token counts to evaluate: aiconfigurator-core's own collection grid for vLLM GEMMs
    (every M up to 512, then each multiple of 256 and the M after it, where a new tile row
    starts and the time jumps), so linear interpolation between them reproduces the
    engine's interpolation instead of smoothing over those steps."""
    pts = set(range(1, min(512, m_max) + 1))
    for m in range(512, m_max + 1, 256):
        pts.update((m, m + 1))
    pts.add(m_max)
    return sorted(p for p in pts if p <= m_max)


@functools.lru_cache(maxsize=16)
def _aic_engine(system: str) -> tuple[Any, str]:
    """aiconfigurator-core's engine bound to ``system``'s newest vLLM tables (cached:
    loading takes about a second)."""
    try:
        from aiconfigurator_core.sdk.engine import EngineHandle
        from aiconfigurator_core.sdk.perf_database import (get_database,
                                                           get_latest_database_version)
    except ImportError as exc:
        raise ConfigError("--step-time-source aic needs aiconfigurator-core: "
                          "pip install -e '.[aic]'") from exc
    version = get_latest_database_version(system, "vllm")
    database = get_database(system, "vllm", version) if version else None
    if database is None:
        raise ConfigError(f"aiconfigurator-core has no vLLM tables for {system}")
    return EngineHandle.for_database(database), f"{system} vLLM {version}"


@functools.lru_cache(maxsize=32)
def aic_tables(hardware_name: str, model: ModelSpec, tp: int,
               m_max: int = DEFAULT_M_MAX, *, dp: int = 1,
               expert_parallel: bool = False) -> dict[str, Any]:
    """Measured per-step seconds for one (GPU, model, TP[, DP x EP]).

    Returns ``{"m": [...], "gemm": [...], "lm_head": [...], "allreduce": [...],
    "moe": [...], "ops": {op: [...]}, "attention": {...}, "source": "h200_sxm vLLM
    0.24.0"}``: the sample points M and, at each, all GEMMs (M = tokens), the LM head
    (M = requests), all all-reduce calls and the fused MoE experts of all MoE layers
    (M = tokens of this rank), in seconds; ``ops`` has each op alone; ``attention`` maps
    ``full`` (and ``sliding``) to :func:`~tuner.perf.measured_grid.attention_grids`.
    Raises ``ConfigError`` when an op has no measured data (the engine then reports a
    non-silicon provenance).
    """
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk.engine import build_ops_json
    from aiconfigurator_core.sdk.operations.communication import CustomAllReduce
    from aiconfigurator_core.sdk.operations.gemm import GEMM

    engine, source = _aic_engine(AIC_SYSTEMS[hardware_name])
    label = f"{model.name} at TP{tp} on {source}"

    def mode(fmt: str) -> Any:
        return getattr(common.GEMMQuantMode, AIC_GEMM_MODES[fmt])

    ops = {name: GEMM(f"{name}_gemm", layers, n, k, mode(fmt))
           for name, n, k, fmt, layers in _gemm_shapes(model, tp)}
    ops["lm_head"] = GEMM("logits_gemm", 1, model.vocab_size // tp, model.hidden_size,
                          mode("bf16"))
    if tp > 1:  # two all-reduces per layer and one after the embedding, as vLLM runs
        ops["allreduce"] = CustomAllReduce("allreduce", 2 * model.num_layers + 1,
                                           model.hidden_size, tp)
    points = _m_points(m_max)
    per_op: dict[str, list[float]] = {}
    for key, op in ops.items():
        js = build_ops_json([op])
        per_op[key] = [evaluate(engine, js, label, is_context=True, batch_size=1, s=m)
                       for m in points]
    zeros = [0.0] * len(points)
    moe = zeros
    if model.is_moe:
        layout = expert_layout(model, tp, dp, expert_parallel)
        moe_tp, moe_ep = (1, layout.ep) if layout.ep > 1 else (tp, 1)
        moe = moe_column(engine, points, hidden=model.hidden_size,
                         inter=model.moe_intermediate_size, top_k=model.num_experts_per_tok,
                         experts=model.num_experts, tp=moe_tp, ep=moe_ep,
                         dp=layout.dp if layout.ep > 1 else 1, quant=_moe_mode(hardware_name, model) or "",
                         distribution=AIC_MOE_DISTRIBUTION, layers=model.num_moe_layers,
                         label=label)
        per_op["moe"] = moe
    heads, kv_heads = model.num_attention_heads // tp, model.kv_heads_per_gpu(tp)
    attention = {"full": attention_grids(
        engine, heads=heads, kv_heads=kv_heads, head_dim=model.head_dim,
        kv_dtype=model.kv_dtype, layers=model.num_full_layers, label=label)}
    if model.num_sliding_layers:
        attention["sliding"] = attention_grids(
            engine, heads=heads, kv_heads=kv_heads, head_dim=model.head_dim,
            kv_dtype=model.kv_dtype, layers=model.num_sliding_layers,
            window=model.sliding_window, label=label)
    gemm_keys = [k for k in per_op if k not in ("lm_head", "allreduce", "moe")]
    return {"m": points, "source": source, "ops": per_op, "attention": attention,
            "gemm": [sum(v) for v in zip(*(per_op[k] for k in gemm_keys))],
            "lm_head": per_op["lm_head"], "allreduce": per_op.get("allreduce", zeros),
            "moe": moe}


def _dense(points: list[int], values: list[float], m_max: int) -> tuple[array, float]:
    """``values`` at every integer M in 0..m_max (0 at M=0) and the slope beyond."""
    import numpy as np

    xs = np.asarray([0] + points, dtype=float)
    ys = np.asarray([0.0] + values, dtype=float)
    grid = np.interp(np.arange(m_max + 1, dtype=float), xs, ys)
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
    return array("d", grid.tolist()), float(max(slope, 0.0))


class MeasuredStepTimeModel(RooflineStepTimeModel):
    """The roofline model with every measured kernel from the tables.

    ``tables`` is :func:`aic_tables`'s dict (plain lists). GEMMs, all-reduce and MoE,
    all functions of the token count, are pre-summed into one per-M array; the LM head
    is indexed by requests; attention is a bilinear lookup at (decode requests, KV
    tokens per request) and (prefill requests, tokens per request). The other terms
    (CPU, launch gaps, sampling, decode KV writes, expert-parallel all-to-all) are the
    parent's.
    """

    source = "aic"

    def __init__(self, hardware: HardwareSpec, model: ModelSpec, tp: int,
                 coefficients: Coefficients | None, tables: dict[str, Any], *, dp: int = 1,
                 expert_parallel: bool = False) -> None:
        super().__init__(hardware, model, tp, coefficients, dp=dp,
                         expert_parallel=expert_parallel)
        self.tables_source = str(tables["source"])
        points = [int(m) for m in tables["m"]]
        self._m_max = m_max = points[-1]
        self._grid_m = points
        self._grid = {k: [float(v) for v in tables[k]]
                      for k in ("gemm", "lm_head", "allreduce", "moe")}
        # GEMMs + all-reduce + experts at M = tokens: one lookup per step
        per_tok = [g + a + e for g, a, e in zip(self._grid["gemm"], self._grid["allreduce"],
                                                self._grid["moe"])]
        self._tok, self._tok_slope = _dense(points, per_tok, m_max)
        self._moe_col, self._moe_slope = _dense(points, self._grid["moe"], m_max)
        self._lm_req, self._lm_slope = _dense(points, self._grid["lm_head"], m_max)
        # full and sliding-window layers are looked up at the same (requests, length)
        # point on the same grid, so their tables are summed into one
        att = tables["attention"]
        parts = [att["full"]] + ([att["sliding"]] if "sliding" in att else [])

        def summed(phase: str) -> Grid2D:
            xs, ys, _ = parts[0][phase]
            return Grid2D(xs, ys, [sum(v) for v in zip(*(p[phase][2] for p in parts))])

        self._gen, self._ctx = summed("gen"), summed("ctx")
        # the analytic terms the tables replace, and the floors inside measured kernels
        c = self.coefficients
        floors = sum(c.gemm_for(fmt).t0_s * n for fmt, n in self.shape["kernels"].items())
        floors += (model.num_full_layers + model.num_sliding_layers) * c.attn_floor_s
        floors += model.num_moe_layers * c.moe_layer_overhead_s
        self._gpu_decode -= floors
        self._gpu_mixed -= floors
        self._dense = ((0.0, 0.0, 0.0, 0.0),)
        self._lm = (0.0, 0.0, 0.0)
        self._ar_tok = self._ar_fixed = self._ar_lib_extra = self._ar_lib_tok = 0.0
        self._ar_lib_tokens = float("inf")
        self._pack()
        k = self._k
        # per step (with prefill / decode only), per request, per token (all-to-all),
        # per decode token (its KV write: a prefill's is inside the context table)
        self._m = (k[0], k[1], k[2], self._a2a_tok, self._kv_write)

    def _attention_s(self, npr: int, ndr: int, npt: int, pctx: int, pairs: float,
                     dctx: int) -> float:
        """Measured attention: decode at (requests, mean KV length); prefill at (requests,
        mean total length) scaled by the ratio of the step's causal pairs to those of
        uncached prompts of that length (aiconfigurator's own rule for a cached prefix),
        but never below reading that KV once (the decode table at the same point)."""
        t = self._gen.at(ndr, dctx / ndr) if ndr else 0.0
        if npt:
            length = (npt + pctx) / npr
            pre = self._ctx.at(npr, length) * pairs / (npr * length * (length + 1.0) * 0.5)
            if pctx > npt:
                # a short chunk over a longer cached prefix still streams the prefix's KV
                # once: at least what decode attention over that length measures (with
                # less cached than new the pair share is >= 3/4 of a whole prompt's,
                # far above one KV read, so the lookup is skipped)
                floor = self._gen.at(npr, length)
                if floor > pre:
                    pre = floor
            t += pre
        return t

    def step_time_s(self, batch: StepBatch) -> float:
        npt = batch.num_prefill_tokens
        ndr = batch.num_decode_reqs
        tokens = npt + ndr
        if tokens <= 0:
            return 0.0
        mixed, decode, per_req, a2a_tok, kv_write = self._m
        npr = batch.num_prefill_reqs
        reqs = npr + ndr
        t = (mixed if npt else decode) + per_req * reqs + a2a_tok * tokens + kv_write * ndr
        m_max = self._m_max
        if tokens <= m_max:
            t += self._tok[tokens]
        else:
            t += self._tok[m_max] + self._tok_slope * (tokens - m_max)
        if reqs <= m_max:
            t += self._lm_req[reqs]
        else:
            t += self._lm_req[m_max] + self._lm_slope * (reqs - m_max)
        return t + self._attention_s(npr, ndr, npt, batch.prefill_ctx_tokens,
                                     batch.prefill_attn_pairs, batch.decode_ctx_tokens)

    def rank_step_time_s(self, batch: StepBatch, group_tokens: int) -> float:
        """A lock-step DP rank under expert parallelism: the measured MoE (which already
        spreads a rank's tokens over the DP group) at the group's mean tokens per rank
        instead of this rank's, plus the all-to-all wait for what it receives."""
        t = self.step_time_s(batch)
        layout = self.expert_layout
        tokens = batch.num_prefill_tokens + batch.num_decode_reqs
        if layout.ep == 1 or layout.dp == 1 or tokens <= 0:
            return t
        mean = group_tokens / layout.dp
        extra = self._a2a_tok * (mean - tokens) if mean > tokens else 0.0
        return t - self._moe_at(tokens) + self._moe_at(mean) + extra

    def _moe_at(self, m: float) -> float:
        """Measured experts at ``m`` tokens of this rank (linear between integers)."""
        m_max = self._m_max
        col = self._moe_col
        if m >= m_max:
            return col[m_max] + self._moe_slope * (m - m_max)
        i = int(m)
        return col[i] + (col[i + 1] - col[i]) * (m - i)

    def transfer_s(self, batch: StepBatch) -> float:
        """The measured all-reduce at M = tokens plus the analytic all-to-all."""
        tokens = batch.num_prefill_tokens + batch.num_decode_reqs
        if tokens <= 0:
            return 0.0
        xs, ys = [0] + self._grid_m, [0.0] + self._grid["allreduce"]
        i = bisect.bisect_left(xs, tokens)
        if i >= len(xs):
            ar = ys[-1] + (tokens - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        else:
            lo = max(i - 1, 0)
            w = 0.0 if xs[i] == xs[lo] else (tokens - xs[lo]) / (xs[i] - xs[lo])
            ar = ys[lo] + (ys[i] - ys[lo]) * w
        return ar + self._a2a_fixed + self._a2a_tok * tokens

    def terms(self, npr: Any, ndr: Any, npt: Any, pctx: Any, pairs: Any, dctx: Any, *,
              maximum: Callable[[Any, Any], Any] = max,
              minimum: Callable[[Any, Any], Any] = min) -> dict[str, Any]:
        import numpy as np

        out = super().terms(npr, ndr, npt, pctx, pairs, dctx, maximum=maximum, minimum=minimum)
        tokens, reqs = npt + ndr, npr + ndr
        xs = [0] + self._grid_m

        def at(key: str, m: Any) -> Any:
            ys = [0.0] + self._grid[key]
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            v = np.interp(m, xs, ys) + np.maximum(np.asarray(m, dtype=float) - xs[-1], 0.0) * slope
            return float(v) if np.ndim(v) == 0 else v

        out["gemm"] = at("gemm", tokens)
        out["lm_head"] = at("lm_head", reqs)
        out["allreduce"] = at("allreduce", tokens)
        out["experts"] = at("moe", tokens)
        attention = np.vectorize(self._attention_s, otypes=[float])(npr, ndr, npt, pctx, pairs, dctx)
        out["attention"] = (float(attention) if np.ndim(attention) == 0 else attention) \
            + self._kv_write * ndr
        return out

    def describe(self) -> str:
        return super().describe() + f"; kernels measured ({self.tables_source})"
