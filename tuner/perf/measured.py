"""Step time from NVIDIA's measured vLLM kernel tables (aiconfigurator-core), where covered.

``aiconfigurator-core`` (optional extra ``tuner[aic]``) ships per-GPU tables measured with
vLLM's own kernels. For the GPUs and formats they cover, the GEMMs (qkv, o, gate_up, down
per layer, the LM head once) and the custom all-reduce are priced from those tables instead
of the roofline; attention, sampling, CPU overhead and launch gaps stay analytic (the
roofline model's terms, with its GEMM floors removed because a measured kernel time
includes its own floor).

Interpolation is AIConfigurator's own: at resolve time each op of this model at this TP is
evaluated through aiconfigurator-core's compiled engine (``EngineHandle.evaluate_ops_json``,
its public op-list surface, which interpolates and clamps its tables exactly as
AIConfigurator does) on a grid of token counts M, and the results are spread with
``np.interp`` onto every integer M up to ``m_max``. The model object then holds plain
``array('d')`` tables, so it pickles into a vLLM interpreter without aiconfigurator-core,
and a step adds three index lookups to the analytic path (bench/bench_step_time.py).

Coverage (:func:`aic_coverage`): H100, H200 and B200; dense (non-MoE) GQA models whose
GEMMs run bf16 or fp8 kernels. Anything else is refused with one line naming why, so
``--step-time-source auto`` falls back to the analytic model and ``aic`` reports it.
"""

from __future__ import annotations

import functools
from array import array
from typing import Any, Callable

from tuner.errors import ConfigError
from tuner.perf.coefficients import Coefficients
from tuner.perf.hardware import HardwareSpec
from tuner.perf.models import ModelSpec
from tuner.perf.step_time import RooflineStepTimeModel, add_full_attention, kernel_format
from tuner.sim.batch import StepBatch

#: tuner hardware preset -> aiconfigurator-core system folder.
AIC_SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm"}
#: GEMM kernel format -> aiconfigurator-core ``GEMMQuantMode`` name.
AIC_GEMM_MODES = {"bf16": "bfloat16", "fp8": "fp8"}
#: Step-time sources a ``Target`` may ask for.
STEP_TIME_SOURCES = ("auto", "analytic", "aic")
#: Token counts priced from the tables per index (one float each); above, linear
#: extrapolation on the last segment (a step never has more than max_num_batched_tokens).
DEFAULT_M_MAX = 16384


def aic_coverage(hardware: HardwareSpec, model: ModelSpec) -> str | None:
    """``None`` when the tables cover this GPU and model, else why not (one clause)."""
    if hardware.name not in AIC_SYSTEMS:
        return (f"aiconfigurator-core has no measured tables for {hardware.name} "
                f"(covered: {', '.join(AIC_SYSTEMS)})")
    if model.is_moe:
        return "measured step times cover dense models only (this one is MoE)"
    if model.attention != "gqa" or model.num_linear_layers:
        return f"measured step times cover GQA models only ({model.name} uses {model.attention})"
    for fmt in {kernel_format(model.weight_dtype), kernel_format(model.attn_weight_dtype)}:
        if fmt not in AIC_GEMM_MODES:
            return (f"aiconfigurator-core has no measured vLLM {fmt} GEMMs "
                    f"(covered: {', '.join(AIC_GEMM_MODES)})")
    return None


def aic_available() -> bool:
    """Whether aiconfigurator-core is importable (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("aiconfigurator_core") is not None


def _gemm_shapes(model: ModelSpec, tp: int) -> list[tuple[str, int, int, str]]:
    """(name, n, k, kernel format) of one layer's GEMMs on one rank, as vLLM runs them."""
    q = model.num_attention_heads // tp * model.head_dim
    kv = model.kv_heads_per_gpu(tp) * model.head_dim
    inter = model.intermediate_size // tp
    attn_f, dense_f = kernel_format(model.attn_weight_dtype), kernel_format(model.weight_dtype)
    return [("qkv", q + 2 * kv, model.hidden_size, attn_f), ("o", model.hidden_size, q, attn_f),
            ("gate_up", 2 * inter, model.hidden_size, dense_f),
            ("down", model.hidden_size, inter, dense_f)]


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
               m_max: int = DEFAULT_M_MAX) -> dict[str, Any]:
    """Measured per-step seconds as functions of M, for one (GPU, model, TP).

    Returns ``{"m": [...], "gemm": [...], "lm_head": [...], "allreduce": [...],
    "ops": {op: [...]}, "source": "h200_sxm vLLM 0.24.0"}``: the sample points and, at
    each, all layers' GEMMs (M = tokens), the LM head (M = requests) and all all-reduce
    calls (M = tokens), in seconds; ``ops`` has each op alone (qkv, o, gate_up, down: all
    layers; lm_head; allreduce: all calls). Raises ``ConfigError`` when an op has no
    measured data (the engine then reports a non-silicon provenance).
    """
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk.engine import build_ops_json
    from aiconfigurator_core.sdk.operations.communication import CustomAllReduce
    from aiconfigurator_core.sdk.operations.gemm import GEMM

    engine, source = _aic_engine(AIC_SYSTEMS[hardware_name])
    layers = model.num_layers

    def mode(fmt: str) -> Any:
        return getattr(common.GEMMQuantMode, AIC_GEMM_MODES[fmt])

    ops = {name: GEMM(f"{name}_gemm", layers, n, k, mode(fmt))
                for name, n, k, fmt in _gemm_shapes(model, tp)}
    ops["lm_head"] = GEMM("logits_gemm", 1, model.vocab_size // tp, model.hidden_size,
                               mode("bf16"))
    if tp > 1:  # two all-reduces per layer and one after the embedding, as vLLM runs
        ops["allreduce"] = CustomAllReduce("allreduce", 2 * layers + 1, model.hidden_size, tp)
    points = _m_points(m_max)
    per_op: dict[str, list[float]] = {}
    for key, op in ops.items():
        js = build_ops_json([op])
        col = []
        for m in points:
            ((name, ms, _energy, provenance),) = engine.evaluate_ops_json(
                js, is_context=True, batch_size=1, s=m)
            if provenance != "silicon":
                raise ConfigError(f"aiconfigurator-core has no measured data for {name} of "
                                  f"{model.name} at TP{tp} on {source} ({provenance})")
            col.append(ms * 1e-3)
        per_op[key] = col
    zeros = [0.0] * len(points)
    out: dict[str, Any] = {
        "m": points, "source": source, "ops": per_op,
        "gemm": [sum(v) for v in zip(*(per_op[k] for k in ("qkv", "o", "gate_up", "down")))],
        "lm_head": per_op["lm_head"], "allreduce": per_op.get("allreduce", zeros)}
    return out


def _dense(points: list[int], values: list[float], m_max: int) -> tuple[array, float]:
    """``values`` at every integer M in 0..m_max (0 at M=0) and the slope beyond."""
    import numpy as np

    xs = np.asarray([0] + points, dtype=float)
    ys = np.asarray([0.0] + values, dtype=float)
    grid = np.interp(np.arange(m_max + 1, dtype=float), xs, ys)
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
    return array("d", grid.tolist()), float(max(slope, 0.0))


class MeasuredStepTimeModel(RooflineStepTimeModel):
    """The roofline model with GEMMs, LM head and all-reduce from measured tables.

    ``tables`` is :func:`aic_tables`'s dict (plain lists). Everything the roofline model
    prices from GEMM coefficients or the all-reduce formula is zeroed and replaced by an
    index into per-M arrays; the other terms are the parent's.
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
        self._grid = {k: [float(v) for v in tables[k]] for k in ("gemm", "lm_head", "allreduce")}
        self._g_tok, self._g_slope = _dense(points, self._grid["gemm"], m_max)
        self._ar, self._ar_slope = _dense(points, self._grid["allreduce"], m_max)
        self._lm_req, self._lm_slope = _dense(points, self._grid["lm_head"], m_max)
        # the analytic GEMM, LM-head and all-reduce terms (and GEMM floors) are replaced
        c = self.coefficients
        floors = sum(c.gemm_for(fmt).t0_s * n for fmt, n in self.shape["kernels"].items())
        self._gpu_decode -= floors
        self._gpu_mixed -= floors
        self._dense = ((0.0, 0.0, 0.0),)
        self._lm = (0.0, 0.0, 0.0)
        self._ar_tok = self._ar_fixed = self._ar_lib_extra = 0.0
        self._ar_lib_tokens = float("inf")
        self._pack()

    def step_time_s(self, batch: StepBatch) -> float:
        # The parent's hot path with its GEMM, LM-head and all-reduce terms replaced by
        # index lookups (inlined rather than calling the parent: a call costs ~150 ns).
        npt = batch.num_prefill_tokens
        ndr = batch.num_decode_reqs
        tokens = npt + ndr
        if tokens <= 0:
            return 0.0
        (mixed, decode, per_req, per_tok, _d_mem, _d_tok, _d_zero, _more, _lm_mem, _lm_tok,
         _lm_zero, _moe, _e_mem, _e_tok, _e_half, _num_experts, _expert_q, kv_tok, occ, attn_d,
         attn_p, sliding, _lib_tokens, _lib_extra) = self._k
        reqs = batch.num_prefill_reqs + ndr
        t = (mixed if npt else decode) + per_req * reqs + per_tok * tokens
        m_max = self._m_max
        if tokens <= m_max:
            t += self._g_tok[tokens] + self._ar[tokens]
        else:
            extra = tokens - m_max
            t += (self._g_tok[m_max] + self._g_slope * extra
                  + self._ar[m_max] + self._ar_slope * extra)
        if reqs <= m_max:
            t += self._lm_req[reqs]
        else:
            t += self._lm_req[m_max] + self._lm_slope * (reqs - m_max)
        t = add_full_attention(t, batch, ndr, npt, kv_tok, occ, attn_d, attn_p)
        if sliding:
            t += self._sliding_s(batch)
        return t

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
        return out

    def describe(self) -> str:
        return super().describe() + f"; GEMMs and all-reduce measured ({self.tables_source})"
