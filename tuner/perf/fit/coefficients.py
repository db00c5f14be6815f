"""Coefficients of the per-kernel step-time model, and where their values come from.

Every number is a physical quantity with a bound: a fraction of a vendor peak in
(0, 1], a kernel floor or an overhead in seconds >= 0, a token count >= 0. Values are
layered, later layers winning:

1. :data:`GENERIC_GEMM` and the dataclass defaults (engineering estimates, used for a
   GPU whose preset gives nothing);
2. the hardware preset's ``step_time`` section (priors per GPU and kernel format, each
   number with its source in the YAML);
3. the shipped fit to published serving results (``presets/fitted/published.yaml``,
   written by ``tuner calibrate --from-benchmarks``);
4. a calibration file (``--calibration``, from ``tuner calibrate --launch/--endpoint``).

A fit addresses the coefficients by flat names (``gemm.fp8.eta_mem``,
``step_overhead_s``): :meth:`Coefficients.flat` and :meth:`Coefficients.with_flat`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import ConfigError

#: GEMM kernel formats (:data:`tuner.perf.dtypes.FORMAT_BYTES`).
FORMATS: tuple[str, ...] = ("bf16", "fp8", "fp8b", "fp8moe", "fp4", "int4", "int4moe")


@dataclass(frozen=True, slots=True)
class GemmCoefficients:
    """One GEMM kernel family: ``t0 + max(bytes / (eta_mem BW), flops / (eta peak))``
    with the compute side ``2 (N + n_half) (K + k_half) (M + m_half) / (eta_compute peak)``.

    Each ``*_half`` is the size along one dimension at which the kernel reaches half its
    asymptotic efficiency along it: a tiled kernel computes whole output tiles in whole
    waves over the SMs (tile and wave quantisation make skinny M and N slow), and each
    tile pays a fixed prologue and epilogue (pipeline fill, the C write) worth ``k_half``
    steps of its K loop (small K is slow). The library's tile heuristic (cuBLAS,
    CUTLASS, hipBLASLt pick among tile shapes, split-K and stream-K per shape) smooths the
    staircase of any one tile into these hyperbolae (docs/step-time-model.md §1).
    ``k_half = n_half = 0`` is the M-only form (what presets without them price).

    ``m_tile`` is the one staircase the library does *not* smooth: a kernel family that
    dispatches on M alone to a few fixed tiles computes M rounded up to its tile
    (:func:`tile_rows`). vLLM's per-tensor FP8 GEMM on Hopper is one CUTLASS kernel per
    M bucket (``scaled_mm_sm90_fp8_dispatch.cuh``: M <= 16 and <= 64 swap A and B onto a
    16- / 64-wide tile side, (64, 128] runs 64-row tiles, above 128 rows 128-row tiles in
    2 x 1 clusters, i.e. 256 rows), so its time jumps where M crosses 64, 128, 256 and
    each multiple of 256 (aiconfigurator-core's H100 fp8 table: +24 % / +1 % model error
    at M = 64 / 65, +29 % / -4 % at 512 / 513 with M alone). ``m_tile = 0`` (every
    preset but those that cite such a dispatch) prices M as it is.
    """

    t0_s: float = 6e-6  # launch-to-finish floor of one GEMM kernel
    eta_mem: float = 0.75  # fraction of HBM bandwidth when streaming the weights
    eta_compute: float = 0.65  # asymptotic fraction of the format's dense peak
    m_half: float = 64.0  # tokens at half the asymptotic compute efficiency
    k_half: float = 0.0  # reduction depth at half efficiency (per-tile prologue/epilogue)
    n_half: float = 0.0  # output columns at half efficiency (tiles and waves along N)
    m_tile: float = 0.0  # rows of the kernel's largest M tile (cluster); 0: M is not padded

    def flop_elems(self, elems: float, sum_n: float, sum_k: float, count: float) -> float:
        """``sum (N + n_half)(K + k_half)`` over ``count`` GEMMs with ``elems = sum N K``,
        ``sum_n = sum N`` and ``sum_k = sum K``: the weight elements a token's FLOPs are
        priced on (``elems`` itself when both terms are 0, bit for bit)."""
        if not (self.k_half or self.n_half):
            return elems
        return (elems + self.n_half * sum_k + self.k_half * sum_n
                + self.n_half * self.k_half * count)

    def __post_init__(self) -> None:
        for name in ("eta_mem", "eta_compute"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < v <= 1.0:
                raise ConfigError(f"gemm coefficient {name}={v!r} must be in (0, 1]")
        for name in ("t0_s", "m_half", "k_half", "n_half", "m_tile"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0.0 or math.isinf(v):
                raise ConfigError(f"gemm coefficient {name}={v!r} must be a number >= 0")
        if self.m_tile and (self.m_tile < MIN_TILE_ROWS
                            or math.log2(self.m_tile) != int(math.log2(self.m_tile))):
            raise ConfigError(f"gemm coefficient m_tile={self.m_tile!r} must be 0 or a power "
                              f"of two >= {MIN_TILE_ROWS:g}")


#: The narrowest tile side an M bucket runs on (Hopper's wgmma N granularity, the side a
#: swapped-operand small-M GEMM puts its tokens on): fewer rows cost as many.
MIN_TILE_ROWS = 16.0


def tile_rows(m: float, tile: float) -> float:
    """The rows a GEMM of ``m`` tokens computes on a kernel whose largest M tile is
    ``tile`` (``GemmCoefficients.m_tile``, > 0): up to ``tile`` the dispatch picks the
    smallest power-of-two tile side that holds M (16, 32, ... rows), above it whole
    ``tile``-row tiles. Scalar hot path (ints or floats, ``m > 0``);
    :func:`tile_rows_array` is the vectorised twin."""
    if m > tile:
        return -(-m // tile) * tile
    rows = MIN_TILE_ROWS
    while rows < m:
        rows *= 2.0
    return rows


def tile_rows_array(m: Any, tile: float) -> Any:
    """:func:`tile_rows` over NumPy arrays (or scalars), 0 where ``m`` is 0 (the fits'
    step counters hold steps without prefill tokens)."""
    import numpy as np

    m = np.asarray(m, dtype=np.float64)
    small = np.exp2(np.ceil(np.log2(np.maximum(m, MIN_TILE_ROWS))))
    return np.where(m > tile, np.ceil(m / tile) * tile, small) * (m > 0)


#: Used for a format the hardware preset gives no prior for (engineering estimates).
GENERIC_GEMM: dict[str, GemmCoefficients] = {
    "bf16": GemmCoefficients(6e-6, 0.75, 0.65, 64.0),
    "fp8": GemmCoefficients(7e-6, 0.65, 0.55, 128.0),
    # block-scaled FP8: the activation-quantization launch and scale loads raise the floor
    "fp8b": GemmCoefficients(3e-5, 0.55, 0.50, 128.0),
    # FP8 routed experts (fused MoE): the dense per-tensor estimate, M-only
    "fp8moe": GemmCoefficients(7e-6, 0.65, 0.55, 128.0),
    "fp4": GemmCoefficients(8e-6, 0.30, 0.40, 256.0),
    "int4": GemmCoefficients(8e-6, 0.60, 0.45, 128.0),
    # INT4 routed experts (fused MoE): the dense W4A16 estimate
    "int4moe": GemmCoefficients(8e-6, 0.60, 0.45, 128.0),
}

_FRACTIONS = ("kv_bw_eff", "kv_fp8_bw_eff", "attn_prefill_eff", "attn_decode_eff",
              "allreduce_bw_eff", "allreduce_lib_bw_eff")
#: Fractions that may be None (then another coefficient stands in for them).
_OPTIONAL = ("kv_fp8_bw_eff", "allreduce_lib_bw_eff", "allreduce_latency_s")
_NONNEG = ("attn_floor_s", "allreduce_latency_s", "allreduce_half_bytes", "step_overhead_s",
           "request_overhead_s", "layer_overhead_mixed_s", "layer_overhead_decode_s",
           "moe_layer_overhead_s", "attn_chunk_tokens", "attn_decode_item_s",
           "attn_decode_half_items", "attn_prefill_half_tokens",
           "attn_prefill_kv_tokens", "attn_prefill_tail_rows", "attn_softmax_head_dim")
#: Pre-issue-15 coefficient names a calibration file may still hold (loaded as before).
LEGACY = ("weight_bw_eff", "mfu_prefill", "mfu_decode")


@dataclass(frozen=True, slots=True)
class Coefficients:
    """All calibratable numbers of :class:`tuner.perf.step_time.RooflineStepTimeModel`."""

    # GEMMs per kernel format (bf16, fp8, fp4, int4); missing formats use GENERIC_GEMM
    gemm: Mapping[str, GemmCoefficients] = field(default_factory=lambda: dict(GENERIC_GEMM))
    # attention: paged-KV bandwidth, FlashAttention-style compute, kernel floor
    kv_bw_eff: float = 0.70  # fraction of HBM bandwidth reading/writing the KV cache
    # fraction of HBM bandwidth *reading* an fp8 KV cache: the decode kernel dequantises
    # every element (and quantises the query), so on Hopper an fp8 KV read runs well
    # below a bf16 one (aic's H200 table: 0.63 against 0.91 of HBM); None = kv_bw_eff.
    # Fitted to the measured generation-attention tables and held by the serving fit
    # (no NVIDIA serving row but two B200 NVFP4 ones runs an fp8 KV cache)
    kv_fp8_bw_eff: float | None = None
    attn_prefill_eff: float = 0.40  # prefill attention, fraction of the bf16 peak (head dim 128)
    # prefill attention's shape (tuner/perf/prefill_attention.py; 0 = the term is off):
    # query tokens' worth of extra key pairs each query costs (tiles not yet full,
    # pipeline fill): efficiency eff * L / (L + 2 * this) on an L-token prompt
    attn_prefill_half_tokens: float = 0.0
    # extra key pairs per query token and KV head, shared by the g query heads packed
    # into one tile (pack-GQA): MHA and MLA's prefill pay it whole
    attn_prefill_kv_tokens: float = 0.0
    # query rows of the longest prompt's last tiles, run on one SM/CU after the rest
    attn_prefill_tail_rows: float = 0.0
    # the exponential per score element in head-dim units: efficiency d / (d + this),
    # relative to d = 128 (the softmax unit does not scale with the tensor cores)
    attn_softmax_head_dim: float = 0.0
    attn_decode_eff: float = 0.25  # decode attention compute side (MLA is compute-heavy)
    attn_floor_s: float = 8e-6  # one attention kernel per layer, launch-to-finish floor
    attn_chunk_tokens: float = 256.0  # KV tokens one split-KV work item reads (occupancy)
    # decode attention's work items (one per request and KV head; docs/step-time-model.md
    # §1): each costs this long on one SM/CU (page table, query, softmax, output: latency
    # that KV bandwidth does not hide), so a step pays at least items x this / units;
    # 0 = the term is off
    attn_decode_item_s: float = 0.0
    # work items at which the KV read reaches half its asymptotic bandwidth's excess:
    # split-KV fills the GPU for few items, but at a lower bandwidth per CTA, so the
    # KV read costs (1 + this / items) times the full-bandwidth time; 0 = off
    attn_decode_half_items: float = 0.0
    # all-reduce: latency floor + bandwidth that grows with the message
    allreduce_bw_eff: float = 0.70  # asymptotic bus-bandwidth fraction of the link
    allreduce_latency_s: float | None = None  # per call; None = the hardware preset's
    allreduce_half_bytes: float = 1.0e6  # message size at half the asymptotic bandwidth
    # above the custom all-reduce's 8 MiB the library (NCCL/RCCL) runs its own algorithm
    # (ring/tree, NVLS on NVSwitch): its bus-bandwidth fraction; None = allreduce_bw_eff
    allreduce_lib_bw_eff: float | None = None
    # engine: CPU side (exposed apart as cpu_s for async scheduling) and launches
    step_overhead_s: float = 2.5e-4  # per step: schedule, prepare inputs, process outputs (CPU)
    request_overhead_s: float = 8e-6  # per scheduled request per step (CPU)
    layer_overhead_mixed_s: float = 2.0e-5  # per layer with prefill tokens (piecewise graphs)
    layer_overhead_decode_s: float = 2.0e-6  # per layer of a decode-only (full-graph) step
    moe_layer_overhead_s: float = 1.5e-5  # per MoE layer: routing, permute, unpermute kernels

    def __post_init__(self) -> None:
        if not isinstance(self.gemm, Mapping):
            raise ConfigError("coefficient gemm must map kernel formats to coefficients")
        bad = sorted(set(self.gemm) - set(FORMATS))
        if bad:
            raise ConfigError(f"coefficient gemm has unknown format(s) {bad}; use "
                              f"{', '.join(FORMATS)}")
        for name in _FRACTIONS:
            v = getattr(self, name)
            if v is None and name in _OPTIONAL:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < v <= 1.0:
                raise ConfigError(f"coefficient {name}={v!r} must be in (0, 1]")
        for name in _NONNEG:
            v = getattr(self, name)
            if v is None and name in _OPTIONAL:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0.0 \
                    or math.isinf(v):
                raise ConfigError(f"coefficient {name}={v!r} must be a number >= 0")

    def gemm_for(self, fmt: str) -> GemmCoefficients:
        return self.gemm.get(fmt) or GENERIC_GEMM[fmt]

    def kv_read_bw_eff(self, kv_dtype: str) -> float:
        """The HBM-bandwidth fraction reading a KV cache of ``kv_dtype`` (the model's
        ``kv_dtype``: ``fp8`` for every vLLM fp8 KV format). Writes keep ``kv_bw_eff``:
        quantising one new token is not what the tables show to be slow."""
        if kv_dtype == "fp8" and self.kv_fp8_bw_eff is not None:
            return self.kv_fp8_bw_eff
        return self.kv_bw_eff

    # ------------------------------------------------------------ (de)serialise
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = ({k: dataclasses.asdict(v) for k, v in sorted(value.items())}
                           if f.name == "gemm" else value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "coefficients",
                  base: "Coefficients | None" = None) -> "Coefficients":
        """``base`` (default: the defaults) with the entries of ``data`` replaced.

        ``gemm`` may give any subset of formats and fields. The pre-issue-15 names
        ``weight_bw_eff`` and ``mfu_prefill`` set ``eta_mem`` and ``eta_compute`` of
        every format (``mfu_decode`` has no counterpart: the compute efficiency now
        rises with the token count) so older calibration files load as before.
        """
        base = base or cls()
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known - set(LEGACY))
        if unknown:
            raise ConfigError(f"{source}: field 'coefficients.{unknown[0]}' is not a "
                              f"coefficient; known: {', '.join(sorted(known))}")
        flat: dict[str, float | None] = {}
        for key, value in data.items():
            if key == "gemm":
                if not isinstance(value, Mapping):
                    raise ConfigError(f"{source}: field 'gemm' must map formats to mappings")
                for fmt, entries in value.items():
                    if not isinstance(entries, Mapping):
                        raise ConfigError(f"{source}: field 'gemm.{fmt}' must be a mapping")
                    for sub, v in entries.items():
                        flat[f"gemm.{fmt}.{sub}"] = _number(v, f"gemm.{fmt}.{sub}", source)
            elif key in LEGACY:
                v = _number(value, key, source)
                if not 0.0 < v <= 1.5:  # the old bound (a fit could absorb cache effects)
                    raise ConfigError(f"{source}: field 'coefficients': coefficient "
                                      f"{key}={v!r} must be in (0, 1.5]")
                if key != "mfu_decode":
                    sub = "eta_mem" if key == "weight_bw_eff" else "eta_compute"
                    for fmt in FORMATS:
                        flat.setdefault(f"gemm.{fmt}.{sub}", min(1.0, v))
            elif key in _OPTIONAL and value is None:
                flat[key] = None
            else:
                flat[key] = _number(value, key, source)
        try:
            return base.with_flat(flat)
        except ConfigError as exc:
            raise ConfigError(f"{source}: field 'coefficients': {exc}") from None

    def flat(self) -> dict[str, float]:
        """Every scalar by flat name (``gemm.<fmt>.<field>`` for the GEMM families)."""
        out: dict[str, float] = {}
        for fmt in FORMATS:
            for f in dataclasses.fields(GemmCoefficients):
                out[f"gemm.{fmt}.{f.name}"] = float(getattr(self.gemm_for(fmt), f.name))
        for f in dataclasses.fields(self):
            if f.name != "gemm" and getattr(self, f.name) is not None:
                out[f.name] = float(getattr(self, f.name))
        return out

    def with_flat(self, values: Mapping[str, float | None]) -> "Coefficients":
        """A copy with the named scalars replaced (names as :meth:`flat` gives them)."""
        gemm = {fmt: self.gemm_for(fmt) for fmt in FORMATS}
        top: dict[str, Any] = {}
        gemm_fields = {f.name for f in dataclasses.fields(GemmCoefficients)}
        top_fields = {f.name for f in dataclasses.fields(self)} - {"gemm"}
        for name, value in values.items():
            parts = name.split(".")
            if len(parts) == 3 and parts[0] == "gemm" and parts[1] in FORMATS \
                    and parts[2] in gemm_fields:
                gemm[parts[1]] = dataclasses.replace(gemm[parts[1]], **{parts[2]: value})
            elif name in top_fields:
                top[name] = value
            else:
                raise ConfigError(f"unknown coefficient {name!r}")
        return dataclasses.replace(self, gemm=gemm, **top)


def _number(value: Any, key: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: field 'coefficients.{key}' must be a number, got {value!r}")
    return float(value)


def coefficients_from_preset(data: Mapping[str, Any] | None, *, source: str) -> Coefficients:
    """Coefficients from a hardware preset's ``step_time`` section.

    Layout: ``gemm: {<fmt>: {t0_us, eta_mem, eta_compute, m_half, k_half, n_half}}`` and any other
    coefficient by name, with ``*_us`` keys in microseconds (``step_overhead_us``); a
    ``sources`` entry (free text) is ignored here and kept for the reader, and so is
    ``measured`` (the names whose priors are measured, ``HardwareSpec.measured_priors``).
    """
    if not data:
        return Coefficients()
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("sources", "measured"):  # provenance, read by HardwareSpec
            continue
        if key == "gemm":
            if not isinstance(value, Mapping):
                raise ConfigError(f"{source}: field 'step_time.gemm' must be a mapping")
            entries: dict[str, Any] = {}
            for fmt, sub in value.items():
                if not isinstance(sub, Mapping):
                    raise ConfigError(f"{source}: field 'step_time.gemm.{fmt}' must be a mapping")
                entries[fmt] = {(k[:-3] + "_s" if k.endswith("_us") else k):
                                (_number(v, f"gemm.{fmt}.{k}", source) * (1e-6 if k.endswith("_us") else 1.0))
                                for k, v in sub.items() if k != "source"}
            flat["gemm"] = entries
        elif key.endswith("_us"):
            flat[key[:-3] + "_s"] = _number(value, key, source) * 1e-6
        else:
            flat[key] = value
    return Coefficients.from_dict(flat, source=f"{source}: step_time")
