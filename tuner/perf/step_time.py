"""Step time: how long one scheduler step (one forward pass) takes on the target GPU.

The twin asks this once per simulated step (about 200,000 times per simulated hour),
so :class:`RooflineStepTimeModel` folds every model/GPU constant into a few floats in
``__init__`` and ``step_time_s`` is plain float arithmetic on the ``StepBatch``
counters: no allocation, no loop, no dict lookup (bench/bench_step_time.py measures it).

Model, per TP rank (docs/step-time-model.md has the formulas and a worked example)::

    t = max(W_dense / BWw, F_dense / (P * mfu))          dense linear layers
      + max(W_experts(touched) / BWw, F_experts / (P * mfu))   routed experts (MoE)
      + max(KV_bytes / BWkv, F_attn / (P_bf16 * attn_eff))      attention
      + all-reduce (2 per layer + 1 for the embedding; ring + per-call latency)
      + step overhead + per-request overhead + per-layer overhead

``mfu`` and ``attn_eff`` take their prefill value for prefill tokens and their decode
value for decode tokens. Each kernel group is bounded by the slower of its memory and
compute times (``max``), and the groups are summed because they run one after another
inside every layer. ``max`` rather than a smooth sum: it keeps each limiting regime
exact (small-batch decode = bytes / bandwidth, big prefill = FLOPs / peak), and it is
piecewise linear in the inverse efficiencies, which is what lets a non-negative
least-squares fit recover the coefficients (see :meth:`RooflineStepTimeModel.features`).
Real kernels are slower than both bounds near the ridge point; the efficiencies absorb
that on average.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from tuner.errors import ConfigError
from tuner.sim.batch import StepBatch
from tuner.perf.hardware import HardwareSpec
from tuner.perf.models import DTYPE_BYTES, ModelSpec, expected_experts_touched

#: Names of :meth:`RooflineStepTimeModel.features`, in order, and the coefficient
#: each one's weight stands for (``1/x`` for an efficiency ``x``).
FEATURE_NAMES: tuple[str, ...] = (
    "step",          # 1                                       -> step_overhead_s
    "request",       # scheduled requests                      -> request_overhead_s
    "layer_mixed",   # layers, if the step has prefill tokens  -> layer_overhead_mixed_s
    "layer_decode",  # layers, if the step is decode-only      -> layer_overhead_decode_s
    "weight_mem",    # weight bytes / HBM peak, memory-bound groups -> 1/weight_bw_eff
    "kv_mem",        # KV bytes / HBM peak, if attention is memory-bound -> 1/kv_bw_eff
    "mm_prefill",    # prefill matmul FLOPs / peak, compute-bound groups -> 1/mfu_prefill
    "mm_decode",     # decode matmul FLOPs / peak, compute-bound groups -> 1/mfu_decode
    "attn_prefill",  # prefill attention FLOPs / bf16 peak, if compute-bound -> 1/attn_prefill_eff
    "attn_decode",   # decode attention FLOPs / bf16 peak, if compute-bound -> 1/attn_decode_eff
    "ar_bytes",      # ring all-reduce bytes / link bandwidth  -> 1/allreduce_bw_eff
    "ar_calls",      # all-reduce calls                        -> allreduce_latency_s
)

_EFFICIENCIES = ("weight_bw_eff", "kv_bw_eff", "mfu_prefill", "mfu_decode",
                 "attn_prefill_eff", "attn_decode_eff", "allreduce_bw_eff")


@dataclass(frozen=True, slots=True)
class Coefficients:
    """Efficiency factors and overheads of the roofline (all calibratable).

    Defaults are literature values (../shared/spec/landscape.md §5), not
    measurements on any one GPU; ``tuner calibrate`` replaces them per (GPU, model,
    vLLM version). Efficiencies are fractions of the vendor peak in (0, 1.5]; values
    above 1 are allowed only because a fit may absorb cache effects.
    """

    # HBM bandwidth reached by weight streaming (GEMM/GEMV). AIC/AISimulate
    # mem_bw_empirical_scaling_factor = 0.8; LLMPerfOracle MBU 0.8.
    weight_bw_eff: float = 0.80
    # HBM bandwidth reached by paged-attention KV reads/writes. Same source (AIC uses
    # one factor for all memory traffic); kept apart so a fit can tell them apart.
    kv_bw_eff: float = 0.80
    # Matmul FLOP efficiency (MFU) for prefill tokens. BLIS H100 0.45; 0.4-0.6 typical.
    mfu_prefill: float = 0.45
    # Matmul FLOP efficiency for decode tokens (skinny GEMMs). BLIS H100 0.30.
    mfu_decode: float = 0.30
    # FlashAttention-style prefill attention, fraction of the bf16 dense peak.
    # Engineering estimate: FA2/FA3 forward reach 0.35-0.75 of peak at long sequences.
    attn_prefill_eff: float = 0.40
    # Compute side of decode attention (it is nearly always KV-bandwidth bound).
    attn_decode_eff: float = 0.30
    # Ring all-reduce bus bandwidth as a fraction of the per-GPU link bandwidth
    # (NCCL/RCCL busbw on 8-GPU NVSwitch/xGMI boxes is ~0.7-0.8 of the link rate).
    allreduce_bw_eff: float = 0.70
    # Fixed cost of one all-reduce call; None = the hardware preset's latency_us
    # (AIC: 10 us p2p latency; vLLM's custom all-reduce is ~5-10 us small-message).
    allreduce_latency_s: float | None = None
    # Per step: scheduler, input preparation, sampling, output processing in the
    # engine core (landscape §5: ~0.1 ms; 0.1-0.3 ms).
    step_overhead_s: float = 2.0e-4
    # Per scheduled request per step (Python bookkeeping in schedule/update, sampler
    # rows). Engineering estimate; calibrate.
    request_overhead_s: float = 5.0e-6
    # Per layer per step with prefill tokens: vLLM's piecewise CUDA/HIP graphs leave
    # attention eager, so each layer pays launches (landscape §5: ~20-30 us eager).
    layer_overhead_mixed_s: float = 2.0e-5
    # Per layer per decode-only step: full graphs replay the whole forward; the
    # residual is kernel gaps. Engineering estimate; calibrate.
    layer_overhead_decode_s: float = 2.0e-6

    def __post_init__(self) -> None:
        for name in _EFFICIENCIES:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 < value <= 1.5:
                raise ConfigError(f"coefficient {name}={value!r} must be in (0, 1.5]")
        for name in ("step_overhead_s", "request_overhead_s", "layer_overhead_mixed_s",
                     "layer_overhead_decode_s", "allreduce_latency_s"):
            value = getattr(self, name)
            if value is None and name == "allreduce_latency_s":
                continue
            if not isinstance(value, (int, float)) or value < 0.0 or math.isnan(value):
                raise ConfigError(f"coefficient {name}={value!r} must be a number >= 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "coefficients") -> "Coefficients":
        """Build from a mapping; unknown keys are an error naming ``source``."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown coefficient(s) {unknown}; known: "
                              f"{', '.join(sorted(known))}")
        try:
            return cls(**data)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    def theta(self, hardware: HardwareSpec) -> tuple[float, ...]:
        """The weights of :data:`FEATURE_NAMES` these coefficients stand for."""
        lat = hardware.allreduce_latency_s if self.allreduce_latency_s is None \
            else self.allreduce_latency_s
        return (self.step_overhead_s, self.request_overhead_s, self.layer_overhead_mixed_s,
                self.layer_overhead_decode_s, 1.0 / self.weight_bw_eff, 1.0 / self.kv_bw_eff,
                1.0 / self.mfu_prefill, 1.0 / self.mfu_decode, 1.0 / self.attn_prefill_eff,
                1.0 / self.attn_decode_eff, 1.0 / self.allreduce_bw_eff, lat)

    @classmethod
    def from_theta(cls, theta: "tuple[float, ...] | list[float]", *,
                   base: "Coefficients | None" = None) -> "Coefficients":
        """Inverse of :meth:`theta` (for a least-squares fit over the features).

        A weight of 0 for an efficiency means its feature never mattered in the fit
        data (e.g. no prefill steps); that efficiency keeps ``base``'s value.
        """
        if len(theta) != len(FEATURE_NAMES):
            raise ConfigError(f"theta has {len(theta)} values, expected {len(FEATURE_NAMES)} "
                              f"({', '.join(FEATURE_NAMES)})")
        base = base or cls()
        if any(t < 0 or math.isnan(t) for t in theta):
            raise ConfigError(f"theta must be non-negative, got {list(theta)}")

        def inv(t: float, name: str) -> float:
            return 1.0 / t if t > 0 else getattr(base, name)

        return cls(
            step_overhead_s=theta[0], request_overhead_s=theta[1],
            layer_overhead_mixed_s=theta[2], layer_overhead_decode_s=theta[3],
            weight_bw_eff=inv(theta[4], "weight_bw_eff"), kv_bw_eff=inv(theta[5], "kv_bw_eff"),
            mfu_prefill=inv(theta[6], "mfu_prefill"), mfu_decode=inv(theta[7], "mfu_decode"),
            attn_prefill_eff=inv(theta[8], "attn_prefill_eff"),
            attn_decode_eff=inv(theta[9], "attn_decode_eff"),
            allreduce_bw_eff=inv(theta[10], "allreduce_bw_eff"), allreduce_latency_s=theta[11])


class StepTimeModel(ABC):
    """Duration of one engine step for a given batch. One abstract method."""

    @abstractmethod
    def step_time_s(self, batch: StepBatch) -> float:
        """Seconds the forward pass (plus engine overheads) of ``batch`` takes."""


class RooflineStepTimeModel(StepTimeModel):
    """Roofline over per-rank weight/KV bytes and FLOPs; see the module docstring.

    Everything is per TP rank: the ranks of one engine run in lock step, so one rank's
    time is the step time.
    """

    def __init__(self, hardware: HardwareSpec, model: ModelSpec, tp: int = 1,
                 coefficients: Coefficients | None = None) -> None:
        if tp < 1:
            raise ConfigError(f"tp={tp} must be >= 1")
        if model.num_attention_heads % tp:
            raise ConfigError(f"tp={tp} must divide num_attention_heads="
                              f"{model.num_attention_heads} of {model.name}")
        self.hardware = hardware
        self.model = model
        self.tp = tp
        self.coefficients = c = coefficients or Coefficients()
        self._c = self._constants(hardware, model, tp)
        k = self._c
        bw_w = hardware.hbm_bandwidth * c.weight_bw_eff
        bw_kv = hardware.hbm_bandwidth * c.kv_bw_eff
        # NOTE: the hot path below reads only these precomputed floats (slot-free
        # attribute access on self is the cheapest lookup Python offers here).
        self._dense_mem_t = k["dense_bytes"] / bw_w
        self._dense_p_t = k["dense_flop_tok_s"] / c.mfu_prefill  # s per prefill token
        self._lm_p_t = k["lm_flop_req_s"] / c.mfu_prefill  # s per prefill request
        # a decode request is one token and one LM-head row: one constant for both
        self._decode_t = (k["dense_flop_tok_s"] + k["lm_flop_req_s"]) / c.mfu_decode
        self._moe = model.is_moe
        self._num_experts = float(model.num_experts)
        self._expert_q = (1.0 - model.num_experts_per_tok / model.num_experts) if self._moe else 1.0
        self._expert_mem_t = k["expert_bytes"] / bw_w  # s per touched expert (all layers)
        self._exp_p_t = k["expert_flop_tok_s"] / c.mfu_prefill
        self._exp_d_t = k["expert_flop_tok_s"] / c.mfu_decode
        self._kv_read_t = k["kv_full_tok"] / bw_kv
        self._kv_write_t = (k["kv_full_tok"] + k["kv_slide_tok"]) / bw_kv
        self._kv_slide_t = k["kv_slide_tok"] / bw_kv
        self._attn_p_t = k["attn_p_full_s"] / c.attn_prefill_eff  # s per prefill pair
        self._attn_d_t = k["attn_d_full_s"] / c.attn_decode_eff
        self._slide_p_t = k["attn_p_slide_s"] / c.attn_prefill_eff
        self._slide_d_t = k["attn_d_slide_s"] / c.attn_decode_eff
        self._window = float(model.sliding_window)
        self._sliding = model.num_sliding_layers > 0
        lat = hardware.allreduce_latency_s if c.allreduce_latency_s is None \
            else c.allreduce_latency_s
        # all-reduce latency and the step overhead are both paid once per step
        self._fixed = k["ar_calls"] * lat + c.step_overhead_s
        self._ar_tok = k["ar_bytes_tok_s"] / c.allreduce_bw_eff
        self._req = c.request_overhead_s
        self._layers_mixed = model.num_layers * c.layer_overhead_mixed_s
        self._layers_decode = model.num_layers * c.layer_overhead_decode_s

    # ------------------------------------------------------------ constants
    @staticmethod
    def _constants(hw: HardwareSpec, m: ModelSpec, tp: int) -> dict[str, float]:
        """Per-rank bytes and unit-efficiency seconds that do not depend on the batch."""
        wb = m.weight_bytes_per_gpu(tp)
        act_b = DTYPE_BYTES[m.act_dtype]
        attn_b = DTYPE_BYTES[m.attn_weight_dtype]
        # Dense groups (read whole every step). The embedding is a row lookup: its
        # traffic is negligible, so it is left out.
        dense_bytes = wb["attn"] + wb["dense_mlp"] + wb["shared_experts"] + wb["router"] \
            + wb["lm_head"] + wb["norms"]
        # FLOPs per token: 2 per multiply-add over the rank's elements, each group at
        # the peak of its weight dtype (fp8 weights run fp8 GEMMs, MXFP4 experts the
        # fp4 peak where the GPU has one).
        dense_s_tok = 2.0 * (wb["attn"] / attn_b / hw.peak(m.attn_weight_dtype)
                             + wb["dense_mlp"] / DTYPE_BYTES[m.weight_dtype] / hw.peak(m.weight_dtype)
                             + wb["shared_experts"] / DTYPE_BYTES[m.expert_weight_dtype]
                             / hw.peak(m.expert_weight_dtype)
                             + wb["router"] / act_b / hw.peak(m.act_dtype))
        # The LM head runs on one row per scheduled request (vLLM computes logits only
        # at each request's last scheduled position), not on every token.
        lm_elems = (m.vocab_size * m.hidden_size) / tp
        lm_s_req = 2.0 * lm_elems / hw.peak(m.act_dtype)
        expert_bytes = expert_s_tok = 0.0
        if m.is_moe:
            # bytes of one expert in every MoE layer on this rank (TP splits its width)
            expert_bytes = wb["experts"] / m.num_experts
            exp_elems = expert_bytes / DTYPE_BYTES[m.expert_weight_dtype]
            expert_s_tok = 2.0 * m.num_experts_per_tok * exp_elems / hw.peak(m.expert_weight_dtype)
        # Attention FLOPs per query-key pair per layer on this rank.
        heads = m.num_attention_heads / tp
        if m.attention == "mla":
            # prefill: decompressed heads, QK over nope+rope, PV over v_head_dim;
            # decode: weight-absorbed form over the latent (kv_lora + rope), PV over kv_lora.
            pair_p = 2.0 * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
            pair_d = 2.0 * heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
        else:
            pair_p = pair_d = 4.0 * heads * m.head_dim  # QK^T and PV, 2 FLOPs per MAC
        peak_attn = hw.peak("bf16")
        full, slide = m.num_full_layers, m.num_sliding_layers
        per_layer_kv = m.kv_bytes_per_token_layer(tp)
        # Tensor parallelism: one all-reduce after attention and one after the MLP in
        # every layer, plus one for the vocab-parallel embedding. Ring: each rank sends
        # and receives 2(p-1)/p of the message over its links.
        ar_calls = (2 * m.num_layers + 1) if tp > 1 else 0
        ring = 2.0 * (tp - 1) / tp
        ar_bytes_tok = ar_calls * ring * m.hidden_size * act_b
        return {
            "dense_bytes": dense_bytes, "dense_flop_tok_s": dense_s_tok,
            "lm_flop_req_s": lm_s_req, "expert_bytes": expert_bytes,
            "expert_flop_tok_s": expert_s_tok,
            "kv_full_tok": full * per_layer_kv, "kv_slide_tok": slide * per_layer_kv,
            "attn_p_full_s": full * pair_p / peak_attn, "attn_d_full_s": full * pair_d / peak_attn,
            "attn_p_slide_s": slide * pair_p / peak_attn,
            "attn_d_slide_s": slide * pair_d / peak_attn,
            "ar_calls": float(ar_calls), "ar_bytes_tok_s": ar_bytes_tok / hw.interconnect_bandwidth,
        }

    # ------------------------------------------------------------- hot path
    def step_time_s(self, batch: StepBatch) -> float:
        npt = batch.num_prefill_tokens
        ndr = batch.num_decode_reqs
        tokens = npt + ndr
        if tokens <= 0:
            return 0.0  # vLLM does not run the model for an empty schedule
        npr = batch.num_prefill_reqs
        # dense linear layers: weights once per step vs. FLOPs per token
        t = self._dense_p_t * npt + self._lm_p_t * npr + self._decode_t * ndr
        if t < self._dense_mem_t:
            t = self._dense_mem_t
        if self._moe:
            mem = self._num_experts * (1.0 - self._expert_q ** tokens) * self._expert_mem_t
            cmp = self._exp_p_t * npt + self._exp_d_t * ndr
            t += mem if mem > cmp else cmp
        # attention: KV read for every context token and new token, written for new ones
        dctx = batch.decode_ctx_tokens
        pctx = batch.prefill_ctx_tokens
        pairs = batch.prefill_attn_pairs
        mem = self._kv_read_t * (dctx + pctx + npt) + self._kv_write_t * tokens
        cmp = self._attn_p_t * pairs + self._attn_d_t * dctx
        if self._sliding:
            # sliding-window layers see at most `window` keys per query; conditional
            # expressions instead of min(): a builtin call costs ~60 ns here
            w = self._window
            sd = ndr * w
            if dctx < sd:
                sd = dctx
            sp = npr * w
            if pctx < sp:
                sp = pctx
            pp = npt * w
            if pairs < pp:
                pp = pairs
            mem += self._kv_slide_t * (sd + sp + npt)
            cmp += self._slide_p_t * pp + self._slide_d_t * sd
        t += mem if mem > cmp else cmp
        # all-reduce and overheads
        t += self._fixed + self._ar_tok * tokens + self._req * (npr + ndr)
        return t + (self._layers_mixed if npt else self._layers_decode)

    # ------------------------------------------------- slow, explained paths
    def _raw(self, batch: StepBatch) -> dict[str, float]:
        """Unit-efficiency quantities of one batch (seconds at 100 % of peak)."""
        k = self._c
        m = self.model
        hw = self.hardware
        npt, ndr, npr = batch.num_prefill_tokens, batch.num_decode_reqs, batch.num_prefill_reqs
        tokens = npt + ndr
        dctx, pctx, pairs = batch.decode_ctx_tokens, batch.prefill_ctx_tokens, batch.prefill_attn_pairs
        touched = expected_experts_touched(m.num_experts, m.num_experts_per_tok, tokens)
        w = float(m.sliding_window)
        sd = min(dctx, ndr * w) if m.num_sliding_layers else 0.0
        sp_kv = min(pctx + npt, npt + npr * w) if m.num_sliding_layers else 0.0
        sp_pairs = min(pairs, npt * w) if m.num_sliding_layers else 0.0
        bw = hw.hbm_bandwidth
        return {
            "dense_mem": k["dense_bytes"] / bw,
            "dense_p": k["dense_flop_tok_s"] * npt + k["lm_flop_req_s"] * npr,
            "dense_d": (k["dense_flop_tok_s"] + k["lm_flop_req_s"]) * ndr,
            "expert_mem": touched * k["expert_bytes"] / bw,
            "expert_p": k["expert_flop_tok_s"] * npt,
            "expert_d": k["expert_flop_tok_s"] * ndr,
            "kv_mem": (k["kv_full_tok"] * (dctx + pctx + npt + tokens)
                       + k["kv_slide_tok"] * (sd + sp_kv + tokens)) / bw,
            "attn_p": k["attn_p_full_s"] * pairs + k["attn_p_slide_s"] * sp_pairs,
            "attn_d": k["attn_d_full_s"] * dctx + k["attn_d_slide_s"] * sd,
            "ar_bytes": k["ar_bytes_tok_s"] * tokens if tokens else 0.0,
            "ar_calls": k["ar_calls"] if tokens else 0.0,
            "tokens": float(tokens),
        }

    def breakdown(self, batch: StepBatch) -> dict[str, float]:
        """Seconds per component; the values sum to :meth:`step_time_s` (up to rounding).

        Keys: ``dense``, ``experts``, ``attention`` (each the max of its memory and
        compute time), ``allreduce``, ``overhead``; plus, for explanation only (not
        summed), ``*_mem_s``/``*_compute_s`` of the three kernel groups and the
        ``bound`` of each (``"memory"`` or ``"compute"``) in ``bounds``.
        """
        if batch.num_tokens <= 0:
            return {"dense": 0.0, "experts": 0.0, "attention": 0.0, "allreduce": 0.0,
                    "overhead": 0.0}
        r = self._raw(batch)
        c = self.coefficients
        groups = {
            "dense": (r["dense_mem"] / c.weight_bw_eff,
                      r["dense_p"] / c.mfu_prefill + r["dense_d"] / c.mfu_decode),
            "experts": (r["expert_mem"] / c.weight_bw_eff,
                        r["expert_p"] / c.mfu_prefill + r["expert_d"] / c.mfu_decode),
            "attention": (r["kv_mem"] / c.kv_bw_eff,
                          r["attn_p"] / c.attn_prefill_eff + r["attn_d"] / c.attn_decode_eff),
        }
        theta = c.theta(self.hardware)
        out: dict[str, Any] = {name: max(mem, cmp) for name, (mem, cmp) in groups.items()}
        out["allreduce"] = r["ar_bytes"] * theta[10] + r["ar_calls"] * theta[11]
        layers = self.model.num_layers
        out["overhead"] = (c.step_overhead_s + c.request_overhead_s * batch.num_reqs
                           + layers * (c.layer_overhead_mixed_s if batch.num_prefill_tokens
                                       else c.layer_overhead_decode_s))
        for name, (mem, cmp) in groups.items():
            out[f"{name}_mem_s"] = mem
            out[f"{name}_compute_s"] = cmp
        out["bounds"] = {name: ("memory" if mem >= cmp else "compute")
                         for name, (mem, cmp) in groups.items()}
        return out

    def features(self, batch: StepBatch) -> tuple[float, ...]:
        """Feature vector ``f`` with ``step_time_s(batch) == dot(theta, f)``.

        ``theta = self.coefficients.theta(hardware)`` (see :data:`FEATURE_NAMES`).
        The ``max`` of each kernel group makes the model piecewise linear: each group's
        memory or compute features are switched on by the regime the *current*
        coefficients put it in. A calibration fits ``theta >= 0`` by non-negative
        least squares, rebuilds the model with :meth:`from_linear`, recomputes the
        features (regimes may move) and repeats until the regimes stop changing.
        """
        if batch.num_tokens <= 0:
            return (0.0,) * len(FEATURE_NAMES)
        r = self._raw(batch)
        c = self.coefficients
        wmem = pmm = dmm = 0.0
        for mem_key, p_key, d_key in (("dense_mem", "dense_p", "dense_d"),
                                      ("expert_mem", "expert_p", "expert_d")):
            mem, p, d = r[mem_key], r[p_key], r[d_key]
            if mem / c.weight_bw_eff >= p / c.mfu_prefill + d / c.mfu_decode:
                wmem += mem
            else:
                pmm += p
                dmm += d
        kv = ap = ad = 0.0
        if r["kv_mem"] / c.kv_bw_eff >= r["attn_p"] / c.attn_prefill_eff + r["attn_d"] / c.attn_decode_eff:
            kv = r["kv_mem"]
        else:
            ap, ad = r["attn_p"], r["attn_d"]
        layers = float(self.model.num_layers)
        mixed = batch.num_prefill_tokens > 0
        return (1.0, float(batch.num_reqs), layers if mixed else 0.0, 0.0 if mixed else layers,
                wmem, kv, pmm, dmm, ap, ad, r["ar_bytes"], r["ar_calls"])

    @classmethod
    def from_linear(cls, hardware: HardwareSpec, model: ModelSpec, tp: int,
                    theta: "tuple[float, ...] | list[float]", *,
                    base: Coefficients | None = None) -> "RooflineStepTimeModel":
        """A model whose coefficients are the fitted feature weights ``theta``."""
        return cls(hardware, model, tp, Coefficients.from_theta(theta, base=base))

    def describe(self) -> str:
        """One line: model, GPU, TP and the key per-rank sizes."""
        m = self.model
        dense_gib = self._c["dense_bytes"] / (1 << 30)
        return (f"{m.name} on {self.tp}x {self.hardware.display_name}: "
                f"{dense_gib:.2f} GiB dense weights/GPU, "
                f"{m.kv_bytes_per_token(self.tp) / 1024:.1f} KiB KV/token/GPU")
