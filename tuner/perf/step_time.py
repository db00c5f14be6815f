"""Step time: how long one scheduler step (one forward pass) takes on the target GPU.

A per-layer, per-kernel model (docs/step-time-model.md has the formulas). Per TP rank::

    step = cpu + gpu
    cpu  = step_overhead + request_overhead x requests        (scheduler, inputs, outputs)
    gpu  = launch gaps (per layer; more with prefill: piecewise graphs)
         + sum over GEMMs  t0[f] + max(bytes / (eta_mem[f] BW),
                                       2 (N + n_half[f]) (K + k_half[f]) (M + m_half[f])
                                       / (eta_compute[f] peak[f]))
           (qkv, o, gate_up, down per layer; router, routed experts over the experts the
            batch touches, shared experts; the LM head once, on one row per request)
         + attention per layer: floor + max(KV bytes / (kv_eff BW), occupancy floor,
           FLOPs / (eff peak)), prefill and decode apart (GQA, MLA, sliding windows);
           Gated DeltaNet layers: recurrent state traffic and chunked scan
           (tuner/perf/linear_attention.py)
         + expert parallelism: whole experts per rank, dispatch + combine all-to-all
           (tuner/perf/expert_parallel.py)
         + all-reduce per call: latency + message / bandwidth(message), custom or library
         + sampling: a few passes over each request's logits

``f`` is the GEMM's kernel format (bf16, fp8, fp8b, fp4, int4; FP8 routed experts run the
fused-MoE family fp8moe: :mod:`tuner.perf.dtypes`), so a
quantized checkpoint is priced by what its kernels reach (MXFP4 decode GEMMs stream far
below HBM peak today), not by a peak ratio. The layers of a model are identical, so the
model prices one layer and multiplies; every per-shape constant is folded into a few
floats in ``__init__`` and ``step_time_s`` is plain float arithmetic on the ``StepBatch``
counters (bench/bench_step_time.py measures it). :meth:`terms` is the explained slow
path; with NumPy arrays for the counters it prices many steps at once (the fits).

All GEMMs of one format in a layer see the same token count M, so the model takes one
``max`` over the format's summed bytes and FLOPs: one comparison per format per step.
Without the tile terms (``k_half = n_half = 0``) every GEMM's maxima cross at the same M
and this equals the sum of per-GEMM maxima exactly; with them a skinny GEMM crosses a
little later than a wide one, and the shared max is the sum's lower bound near the
crossover (M of a few hundred; below it all are memory-bound, above it all compute-bound).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

from tuner.errors import ConfigError
from tuner.perf.fit.coefficients import (Coefficients, GemmCoefficients, tile_rows,
                                         tile_rows_array)
from tuner.perf.dtypes import EXPERT_FORMATS
from tuner.perf.expert_parallel import all2all_constants, expert_layout, expert_terms
from tuner.perf.linear_attention import linear_attention_s, linear_constants
from tuner.perf.hardware import HardwareSpec
from tuner.perf.models import DTYPE_BYTES, ModelSpec
from tuner.perf.prefill_attention import prefill_constants
from tuner.sim.batch import StepBatch

#: Passes over the fp32 logits of one request when sampling (logits write, softmax,
#: top-k/top-p, gather): a parameter-free estimate, small next to the LM head.
SAMPLING_PASSES = 4.0
#: Above this all-reduce message size vLLM leaves its custom (one-/two-shot, QuickReduce)
#: all-reduce for NCCL/RCCL (``custom_all_reduce`` max_size, 8 MiB by default).
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 1024 * 1024
#: Library all-reduce: latency is this many times the custom one's (ring set-up).
LIBRARY_LATENCY_FACTOR = 2.0


def kernel_format(dtype: str) -> str:
    """GEMM kernel format of a weight dtype (fp16/fp32 run the bf16 kernels)."""
    return {"fp16": "bf16", "fp32": "bf16"}.get(dtype, dtype)


def shared_expert_format(model: ModelSpec) -> str:
    """Kernel format of ``model``'s shared experts: plain dense linears in the experts'
    format, and for FP8 experts of a block-scaled checkpoint (``fp8b`` dense or attention
    linears) the block-scaled GEMM, because vLLM quantizes every linear of such a
    checkpoint with its ``weight_block_size`` (``W8A8BlockFp8LinearOp``)."""
    fmt = kernel_format(model.expert_weight_dtype)
    if fmt == "fp8" and "fp8b" in (model.weight_dtype, model.attn_weight_dtype):
        return "fp8b"
    return fmt


def expert_kernel_format(dtype: str) -> str:
    """Kernel format of routed experts whose weights are ``dtype``: FP8 experts run vLLM's
    fused-MoE kernels, a family of their own (``fp8moe``, :data:`EXPERT_FORMATS`); the
    other formats price experts with their dense GEMM coefficients."""
    fmt = kernel_format(dtype)
    return EXPERT_FORMATS.get(fmt, fmt)


class StepTimeModel(ABC):
    """Duration of one engine step for a given batch. One abstract method.

    ``step_time_s`` is the synchronous engine's step (CPU work, then the GPU's).
    ``cpu_s`` is the engine-core CPU part that async scheduling overlaps with the
    previous batch's GPU time (``tuner.sim.loop``); a model without one prices it all
    as GPU time.
    """

    @abstractmethod
    def step_time_s(self, batch: StepBatch) -> float:
        """Seconds the forward pass (plus engine overheads) of ``batch`` takes."""

    def cpu_s(self, batch: StepBatch) -> float:
        """The CPU part of ``step_time_s`` (none unless a model prices one)."""
        return 0.0

    def step_parts_s(self, batch: StepBatch) -> tuple[float, float]:
        """``(cpu, gpu)`` with ``gpu = step_time_s - cpu``: the async clock's prices."""
        cpu = self.cpu_s(batch)
        return cpu, self.step_time_s(batch) - cpu

    #: Whether a DP rank's step in a lockstep depends on the other ranks' tokens (expert
    #: parallelism over DP ranks: every rank's experts serve the whole group's tokens).
    #: When True the fleet prices each rank by :meth:`rank_step_time_s`.
    couples_ranks: bool = False

    def rank_step_time_s(self, batch: StepBatch, group_tokens: int) -> float:
        """One DP rank's step in a lockstep of ranks whose steps all hold ``group_tokens``
        tokens. Ranks priced alone (``couples_ranks`` False, the default) take
        :meth:`step_time_s`."""
        return self.step_time_s(batch)


def add_full_attention(t: float, batch: StepBatch, ndr: int, npt: int, kv_tok: float,
                       dec: tuple[float, float, float], attn_d: float, attn_p: float,
                       attn_p_tok: float = 0.0, tail_s: float = 0.0) -> float:
    """``t`` plus the full-attention layers' time: decode and prefill (KV read against
    causal query-key pairs, plus ``attn_p_tok`` per query token and ``tail_s``, the longest
    prompt's last tile: tuner/perf/prefill_attention.py).

    ``dec`` = (occupancy floor, s per decode request of work-item latency, s per mean
    context token of bandwidth underfill): decode costs the KV read at full bandwidth
    plus the underfill of few work items (``under x context / requests``: a request's
    KV heads read with the bandwidth of too few CTAs), at least the occupancy floor and
    the work items' latency spread over the compute units, against compute
    (docs/step-time-model.md §1).

    It adds to ``t`` in the same order as an inlined sum, so results are bit-identical.
    """
    if ndr:
        dctx = batch.decode_ctx_tokens
        occ, item, under = dec
        mem = kv_tok * dctx + under * dctx / ndr
        if mem < occ:
            mem = occ
        occ = item * ndr
        if mem < occ:
            mem = occ
        cmp = attn_d * dctx
        t += mem if mem > cmp else cmp
    if npt:
        mem = kv_tok * (batch.prefill_ctx_tokens + npt)
        cmp = attn_p * batch.prefill_attn_pairs + attn_p_tok * npt + tail_s
        t += mem if mem > cmp else cmp
    return t


class RooflineStepTimeModel(StepTimeModel):
    """Per-kernel roofline with floors; see the module docstring.

    Everything is per TP rank: the ranks of one engine run in lock step, so one rank's
    time is the step time. ``cpu_s`` and ``gpu_s`` split it for an async-scheduling
    rule (period = max of the two); ``step_time_s`` is their sum (synchronous engine).
    """

    def __init__(self, hardware: HardwareSpec, model: ModelSpec, tp: int = 1,
                 coefficients: Coefficients | None = None, *, dp: int = 1,
                 expert_parallel: bool = False) -> None:
        if tp < 1:
            raise ConfigError(f"tp={tp} must be >= 1")
        if model.num_attention_heads % tp:
            raise ConfigError(f"tp={tp} must divide num_attention_heads="
                              f"{model.num_attention_heads} of {model.name}")
        self.hardware = hardware
        self.model = model
        self.tp = tp
        self.coefficients = c = coefficients or hardware.coefficients
        self.shape = shape = _shape(model, tp)
        bw = hardware.hbm_bandwidth

        def gemm(fmt: str, elems: float, dims: tuple[float, float, float]
                 ) -> tuple[float, float, float]:
            """(memory s, compute s per token, compute s at M=0) for ``elems`` weights in
            GEMMs of ``dims`` = (sum N, sum K, count): bytes stream once, FLOPs are priced
            with the tile terms (``GemmCoefficients.flop_elems``); the tokens are padded to
            the format's M tiles by the caller (``GemmCoefficients.m_tile``)."""
            g: GemmCoefficients = c.gemm_for(fmt)
            # the rate the kernels multiply at: this format's eta_compute x peak, or another
            # format's where the software gets no more from its units (2024 ROCm FP8 ran at
            # the BF16 GEMMs' rate); the tile terms stay the kernels' own
            cfmt = hardware.gemm_compute_as.get(fmt, fmt)
            rate = c.gemm_for(cfmt).eta_compute * hardware.peak(cfmt)
            per_tok = 2.0 * g.flop_elems(elems, *dims) / rate
            return elems * DTYPE_BYTES[fmt] / (g.eta_mem * bw), per_tok, per_tok * g.m_half

        # dense GEMMs (M = tokens), one entry per kernel format, with the format's M tile
        # (0: M as it is; the LM head, M = requests, runs bf16, whose cuBLAS tiles the
        # tile terms smooth; routed experts pad per expert through m_half)
        self._dense = tuple((*gemm(fmt, elems, shape["dims"][fmt]), c.gemm_for(fmt).m_tile)
                            for fmt, elems in sorted(shape["dense"].items()))
        self._lm = gemm(shape["lm_fmt"], shape["lm_elems"], shape["lm_dims"])  # M = requests
        self._moe = model.is_moe
        # experts: TP-split widths, or whole experts over tp x dp ranks with expert
        # parallelism (tuner/perf/expert_parallel.py), fed by the whole DP group's tokens
        self.expert_layout = layout = expert_layout(model, tp, dp, expert_parallel)
        self.couples_ranks = layout.ep > 1 and layout.dp > 1
        if self._moe:
            whole = layout.ep > 1  # whole experts per rank: widths not split over TP
            elems = shape["expert_elems"] * (tp if whole else 1)
            e_mem, e_tok, e_zero = gemm(shape["expert_fmt"], elems,
                                        expert_dims(model, 1 if whole else tp))
            # pairs routed to this rank per token of the DP group: k, or k / EP
            self._e_tok_group = e_tok * model.num_experts_per_tok / layout.ep
            self._e_mem, self._e_half = e_mem, e_zero
            self._e_tok = self._e_tok_group * layout.group_factor  # per token of this rank
            self._num_experts = layout.local_experts
            self._expert_q_one = 1.0 - model.num_experts_per_tok / model.num_experts
            self._expert_q = self._expert_q_one ** layout.group_factor
        else:
            self._e_mem = self._e_tok = self._e_half = self._num_experts = 0.0
            self._e_tok_group = 0.0
            self._expert_q = self._expert_q_one = 1.0
        self._a2a_fixed, self._a2a_tok = all2all_constants(hardware, model, layout)
        # attention (all layers folded in; full and sliding layers apart)
        kv_bw = c.kv_bw_eff * bw
        # reads at the KV format's own efficiency (an fp8 cache dequantises as it reads)
        kv_read_bw = c.kv_read_bw_eff(model.kv_dtype) * bw
        peak_attn = hardware.peak("bf16")
        self._kv_tok = shape["kv_full"] / kv_read_bw  # s per KV token read, all full layers
        self._kv_slide_tok = shape["kv_slide"] / kv_read_bw
        self._kv_write = (shape["kv_full"] + shape["kv_slide"]) / kv_bw
        self._attn_d = shape["pair_d_full"] / (c.attn_decode_eff * peak_attn)
        # prefill: causal pairs at the head dim's efficiency, extra pairs per query token
        # (tiles, pack-GQA's per-KV-head share) and the longest prompt's last tile
        # (tuner/perf/prefill_attention.py; docs/step-time-model.md §1)
        geometry = (hardware.compute_units, shape["heads"], shape["pf_head_dim"],
                    shape["pf_group"])
        (self._attn_p, self._attn_p_tok, self._attn_p_key, self._attn_p_tail
         ) = prefill_constants(c, peak_attn, geometry[0], shape["pair_p_full"], *geometry[1:])
        (self._slide_p, self._slide_p_tok, self._slide_p_key, self._slide_p_tail
         ) = prefill_constants(c, peak_attn, geometry[0], shape["pair_p_slide"], *geometry[1:])
        self._slide_d = shape["pair_d_slide"] / (c.attn_decode_eff * peak_attn)
        # occupancy: split-KV work items = KV heads per rank x KV tokens / chunk; fewer
        # than the GPU's compute units leave bandwidth unused -> a per-step floor
        self._occ_floor = (c.attn_chunk_tokens * hardware.compute_units / max(1.0, shape["kv_units"])
                           ) * self._kv_tok
        # decode work items (request x KV head, every full layer): their latency spread
        # over the compute units, and the bandwidth few of them leave unused
        self._item_d = (model.num_full_layers * max(1.0, shape["kv_units"])
                        * c.attn_decode_item_s / hardware.compute_units)
        self._under_d = self._kv_tok * c.attn_decode_half_items / max(1.0, shape["kv_units"])
        # Gated DeltaNet layers: recurrent state per request, chunked scan at prefill
        self._linear = linear_constants(hardware, model, tp) if model.num_linear_layers else None
        self._window = float(model.sliding_window)
        self._sliding = model.num_sliding_layers > 0
        # all-reduce: calls x (latency + ring share x (msg + half) / (eff x link))
        lat = hardware.allreduce_latency_s if c.allreduce_latency_s is None \
            else c.allreduce_latency_s
        link = hardware.interconnect_bandwidth * c.allreduce_bw_eff
        calls = shape["ar_calls"]
        self._ar_tok = calls * shape["ring"] * shape["ar_bytes_tok"] / link
        self._ar_fixed = calls * (lat + shape["ring"] * c.allreduce_half_bytes / link)
        self._ar_lib_extra = calls * lat * (LIBRARY_LATENCY_FACTOR - 1.0)
        self._ar_lib_tokens = (CUSTOM_ALLREDUCE_MAX_BYTES / shape["ar_bytes_tok"]
                               if calls else float("inf"))
        # the library's own bandwidth above the switch: per-token time it adds (or saves)
        # over the custom all-reduce's (0 when allreduce_lib_bw_eff is None)
        lib_eff = c.allreduce_lib_bw_eff
        self._ar_lib_tok = 0.0 if lib_eff is None else self._ar_tok * (
            c.allreduce_bw_eff / lib_eff - 1.0)
        self._sample = SAMPLING_PASSES * model.vocab_size * 4.0 / bw
        # constant GPU time per step: GEMM floors, attention floors, launch gaps
        layers = model.num_layers
        floors = sum(c.gemm_for(fmt).t0_s * n for fmt, n in shape["kernels"].items())
        floors += layers * c.attn_floor_s + model.num_moe_layers * c.moe_layer_overhead_s
        self._gpu_decode = floors + layers * c.layer_overhead_decode_s
        self._gpu_mixed = floors + layers * c.layer_overhead_mixed_s
        self._cpu_step = c.step_overhead_s
        self._cpu_req = c.request_overhead_s
        self._pack()

    # ------------------------------------------------------------- hot path
    def _pack(self) -> None:
        """One tuple of every constant the hot path reads: a single attribute load and
        an unpack cost less than two dozen attribute loads. Per-step and per-token
        constants that are always added together are pre-summed."""
        fixed = self._cpu_step + self._ar_fixed + self._a2a_fixed
        dense = self._dense
        one = dense[0] if len(dense) == 1 else (0.0, 0.0, 0.0, 0.0)
        self._k = (
            fixed + self._gpu_mixed, fixed + self._gpu_decode,
            self._cpu_req + self._sample,  # per request
            self._kv_write + self._ar_tok + self._a2a_tok,  # per token
            one[0], one[1], one[2], one[3], dense if len(dense) > 1 else (),
            *self._lm, self._moe, self._e_mem, self._e_tok, self._e_half, self._num_experts,
            self._expert_q, self._kv_tok, (self._occ_floor, self._item_d, self._under_d),
            self._attn_d, self._attn_p,
            self._attn_p_tok, self._attn_p_key, self._attn_p_tail,
            bool(self._attn_p_key or (self._sliding and self._slide_p_key)), self._sliding,
            self._ar_lib_tokens, self._ar_lib_extra, self._ar_lib_tok, self._linear)

    def step_time_s(self, batch: StepBatch) -> float:
        npt = batch.num_prefill_tokens
        ndr = batch.num_decode_reqs
        tokens = npt + ndr
        if tokens <= 0:
            return 0.0  # vLLM does not run the model for an empty schedule
        (mixed, decode, per_req, per_tok, d_mem, d_tok, d_zero, d_tile, more, lm_mem, lm_tok,
         lm_zero,
         moe, e_mem, e_tok, e_half, num_experts, expert_q, kv_tok, dec, attn_d, attn_p,
         attn_p_tok, attn_p_key, attn_p_tail, tail_on, sliding, lib_tokens, lib_extra, lib_tok,
         linear) = self._k
        npr = batch.num_prefill_reqs
        reqs = npr + ndr
        t = (mixed if npt else decode) + per_req * reqs + per_tok * tokens
        cmp = d_tok * (tile_rows(tokens, d_tile) if d_tile else tokens) + d_zero
        t += d_mem if d_mem > cmp else cmp
        for mem, tok, zero, tile in more:  # models with GEMMs in more than one format
            cmp = tok * (tile_rows(tokens, tile) if tile else tokens) + zero
            t += mem if mem > cmp else cmp
        cmp = lm_tok * reqs + lm_zero
        t += lm_mem if lm_mem > cmp else cmp
        if moe:
            touched = num_experts * (1.0 - expert_q ** tokens)
            mem = e_mem * touched
            cmp = e_tok * tokens + e_half * touched
            t += mem if mem > cmp else cmp
        # attention: decode part (KV read vs occupancy floor vs compute), prefill part
        # the longest prompt's keys (pairs / npt + npt / (2 npr)): its last tile's tail
        keys = tail = 0.0
        if npt and tail_on:
            keys = batch.prefill_attn_pairs / npt + 0.5 * npt / (npr or 1)
            tail = attn_p_key * keys + attn_p_tail
        t = add_full_attention(t, batch, ndr, npt, kv_tok, dec, attn_d, attn_p, attn_p_tok,
                               tail)
        if sliding:
            t += self._sliding_s(batch, keys)
        if linear:
            t += linear_attention_s(linear, batch)
        if tokens > lib_tokens:
            t += lib_extra + lib_tok * tokens
        return t

    def _sliding_s(self, batch: StepBatch, keys: float = 0.0) -> float:
        """Sliding-window layers: each query sees at most ``window`` keys (conditional
        expressions instead of ``min``: a builtin call costs ~60 ns here)."""
        w = self._window
        ndr, npr, npt = batch.num_decode_reqs, batch.num_prefill_reqs, batch.num_prefill_tokens
        sd = batch.decode_ctx_tokens
        if sd > ndr * w:
            sd = ndr * w
        sp = batch.prefill_ctx_tokens
        if sp > npr * w:
            sp = npr * w
        pp = batch.prefill_attn_pairs
        if pp > npt * w:
            pp = npt * w
        mem = self._kv_slide_tok * (sd + sp + npt)
        cmp = self._slide_p * pp + self._slide_p_tok * npt + self._slide_d * sd
        if keys:  # the longest prompt's last tile sees at most the window's keys
            cmp += self._slide_p_key * (keys if keys < w else w) + self._slide_p_tail
        return mem if mem > cmp else cmp

    def rank_step_time_s(self, batch: StepBatch, group_tokens: int) -> float:
        """One DP rank's step in an expert-parallel lock step: ``batch`` is this rank's,
        ``group_tokens`` the tokens of all DP ranks this step (their experts' work lands
        on every rank). :meth:`step_time_s` is the balanced case, ``group_tokens =
        tokens x dp``; the lock step's time is the slowest rank's. A rank with nothing
        scheduled runs vLLM's dummy batch: pass a one-token decode batch for it.
        Without expert parallelism the ranks are independent and this equals
        :meth:`step_time_s`."""
        t = self.step_time_s(batch)
        layout = self.expert_layout
        tokens = batch.num_prefill_tokens + batch.num_decode_reqs
        if layout.ep == 1 or layout.dp == 1 or tokens <= 0:
            return t
        args = (self._e_mem, self._e_tok_group, self._e_half, self._num_experts,
                self._expert_q_one)
        balanced = expert_terms(*args, tokens * layout.group_factor)
        # all-to-all: a rank waits for the larger of what it sends and what it receives
        recv = group_tokens / layout.dp
        extra_a2a = self._a2a_tok * (recv - tokens) if recv > tokens else 0.0
        return t - balanced + expert_terms(*args, float(group_tokens)) + extra_a2a

    def cpu_s(self, batch: StepBatch) -> float:
        """The engine-core CPU part of the step (what async scheduling overlaps):
        scheduling, input preparation and output processing, per step and per request."""
        if batch.num_tokens <= 0:
            return 0.0
        return self._cpu_step + self._cpu_req * batch.num_reqs

    def step_parts_s(self, batch: StepBatch) -> tuple[float, float]:
        # One step_time_s call and the CPU terms inline (the async replay's hot path).
        ndr = batch.num_decode_reqs
        if batch.num_prefill_tokens + ndr <= 0:
            return 0.0, 0.0
        t = self.step_time_s(batch)
        cpu = self._cpu_step + self._cpu_req * (batch.num_prefill_reqs + ndr)
        return cpu, t - cpu

    def gpu_s(self, batch: StepBatch) -> float:
        """The device part of the step: kernels, launch gaps, all-reduce, sampling."""
        return self.step_time_s(batch) - self.cpu_s(batch)

    def transfer_s(self, batch: StepBatch) -> float:
        """The link part of the step: all-reduce and the expert-parallel all-to-all (what a
        clock variant scales as transfer time, ``tuner.perf.clock_variant``). Off the hot
        path: only the robust check's replays ask."""
        tokens = batch.num_prefill_tokens + batch.num_decode_reqs
        if tokens <= 0:
            return 0.0
        t = self._ar_fixed + self._ar_tok * tokens + self._a2a_fixed + self._a2a_tok * tokens
        if tokens > self._ar_lib_tokens:
            t += self._ar_lib_extra + self._ar_lib_tok * tokens
        return t

    # ------------------------------------------------- slow, explained paths
    def terms(self, npr: Any, ndr: Any, npt: Any, pctx: Any, pairs: Any, dctx: Any, *,
              maximum: Callable[[Any, Any], Any] = max,
              minimum: Callable[[Any, Any], Any] = min) -> dict[str, Any]:
        """Seconds per component for batch counters (floats, or NumPy arrays with
        ``maximum=np.maximum, minimum=np.minimum``); the values sum to the step time.

        Keys: ``cpu``, ``launch`` (GEMM/attention floors and launch gaps), ``gemm``,
        ``lm_head``, ``experts``, ``all2all`` (expert-parallel dispatch and combine),
        ``attention``, ``allreduce``, ``sampling``. Steps
        with no token cost 0 in :meth:`step_time_s`; here they are the caller's to drop.
        """
        tokens = npt + ndr
        reqs = npr + ndr
        has_p = npt > 0
        has_d = ndr > 0
        out: dict[str, Any] = {"cpu": self._cpu_step + self._cpu_req * reqs}
        out["launch"] = self._gpu_decode + (self._gpu_mixed - self._gpu_decode) * has_p
        out["gemm"] = sum(maximum(mem, per_tok * (tile_rows_array(tokens, tile) if tile
                                                  else tokens) + zero)
                          for mem, per_tok, zero, tile in self._dense)
        mem, per_tok, zero = self._lm
        out["lm_head"] = maximum(mem, per_tok * reqs + zero)
        if self._moe:
            touched = self._num_experts * (1.0 - self._expert_q ** tokens)
            out["experts"] = maximum(self._e_mem * touched,
                                     self._e_tok * tokens + self._e_half * touched)
        else:
            out["experts"] = 0.0 * tokens
        out["all2all"] = self._a2a_fixed + self._a2a_tok * tokens
        dec = maximum(maximum(maximum(self._kv_tok * dctx
                                      + self._under_d * dctx / maximum(ndr, 1),
                                      self._occ_floor), self._item_d * ndr),
                      self._attn_d * dctx)
        # the longest prompt's keys (0 without prefill: the counters are floats or arrays)
        keys = (pairs / maximum(npt, 1) + 0.5 * npt / maximum(npr, 1)) * has_p
        pre = maximum(self._kv_tok * (pctx + npt),
                      self._attn_p * pairs + self._attn_p_tok * npt
                      + (self._attn_p_key * keys + self._attn_p_tail) * has_p)
        attn = dec * has_d + pre * has_p + self._kv_write * tokens
        if self._sliding:
            w = self._window
            sd = minimum(dctx, ndr * w)
            sp = minimum(pctx, npr * w)
            pp = minimum(pairs, npt * w)
            attn = attn + maximum(self._kv_slide_tok * (sd + sp + npt),
                                  self._slide_p * pp + self._slide_p_tok * npt
                                  + self._slide_d * sd
                                  + (self._slide_p_key * minimum(keys, w)
                                     + self._slide_p_tail) * has_p)
        if self._linear:
            d0, d1, p0, p1, p2 = self._linear
            attn = attn + (d0 + d1 * ndr) * has_d + (p0 + p1 * npr + p2 * npt) * has_p
        out["attention"] = attn
        out["allreduce"] = (self._ar_fixed + self._ar_tok * tokens
                            + (self._ar_lib_extra + self._ar_lib_tok * tokens)
                            * (tokens > self._ar_lib_tokens))
        out["sampling"] = self._sample * reqs
        return out

    def breakdown(self, batch: StepBatch) -> dict[str, float]:
        """:meth:`terms` of one batch (all zero for an empty one)."""
        if batch.num_tokens <= 0:
            return dict.fromkeys(("cpu", "launch", "gemm", "lm_head", "experts", "all2all",
                                  "attention", "allreduce", "sampling"), 0.0)
        return {k: float(v) for k, v in self.terms(
            batch.num_prefill_reqs, batch.num_decode_reqs, batch.num_prefill_tokens,
            batch.prefill_ctx_tokens, batch.prefill_attn_pairs, batch.decode_ctx_tokens).items()}

    def describe(self) -> str:
        """One line: model, GPU, TP and the key per-rank sizes."""
        m = self.model
        dense_gib = sum(e * DTYPE_BYTES[f] for f, e in self.shape["dense"].items()) / (1 << 30)
        return (f"{m.name} on {self.tp}x {self.hardware.display_name}: "
                f"{dense_gib:.2f} GiB dense weights/GPU, "
                f"{m.kv_bytes_per_token(self.tp) / 1024:.1f} KiB KV/token/GPU")


def _shape(m: ModelSpec, tp: int) -> dict[str, Any]:
    """Per-rank weight elements by kernel format, kernel counts and attention sizes.

    Elements, not bytes: a format's bytes per element and its efficiencies are applied
    by the caller. ``kernels`` counts GEMM launches per step by format (their floors).
    """
    wb = m.weight_bytes_per_gpu(tp)
    attn_f, dense_f = kernel_format(m.attn_weight_dtype), kernel_format(m.weight_dtype)
    act_f = kernel_format(m.act_dtype)
    # routed experts run the fused-MoE kernels; shared experts are plain dense linears
    moe_f = expert_kernel_format(m.expert_weight_dtype)
    dense: dict[str, float] = {}
    kernels: dict[str, float] = {}
    dims: dict[str, tuple[float, float, float]] = {}  # (sum N, sum K, GEMMs) per format
    h = float(m.hidden_size)

    def add(fmt: str, elems: float, launches: float, outs: float = 0.0,
            out_elems: float = 0.0) -> None:
        """``launches`` GEMMs of ``elems`` weights, ``outs`` of them output projections
        (N = hidden, ``out_elems`` of the weights) and the rest input projections
        (K = hidden): the sums of N and K the tile terms need."""
        if elems > 0:
            dense[fmt] = dense.get(fmt, 0.0) + elems
            kernels[fmt] = kernels.get(fmt, 0.0) + launches
            n, k, cnt = dims.get(fmt, (0.0, 0.0, 0.0))
            dims[fmt] = (n + (elems - out_elems) / h + outs * h,
                         k + (launches - outs) * h + out_elems / h, cnt + launches)

    layers = m.num_layers
    # attention projections: GQA qkv + o; MLA q_a, q_b, kv_a, kv_b (absorbed), o (MLA's
    # inner q_b/kv_b priced as if fed by the hidden state: an approximation of their K)
    attn_out = (m.num_layers - m.num_linear_layers) * h * m.num_attention_heads * (
        m.v_head_dim if m.attention == "mla" else m.head_dim) / tp
    attn_out += m.num_linear_layers * h * m.linear_num_value_heads * m.linear_value_head_dim / tp
    add(attn_f, wb["attn"] / DTYPE_BYTES[m.attn_weight_dtype],
        layers * (5 if m.attention == "mla" else 2), layers, attn_out)
    mlp = wb["dense_mlp"] / DTYPE_BYTES[m.weight_dtype]
    add(dense_f, mlp, m.num_dense_layers * 2, m.num_dense_layers, mlp / 3.0)  # gate_up, down
    shared = wb["shared_experts"] / DTYPE_BYTES[m.expert_weight_dtype]
    n_shared = m.num_moe_layers if m.shared_expert_intermediate_size else 0
    add(shared_expert_format(m), shared, n_shared * 2, n_shared, shared / 3.0)
    add(act_f, wb["router"] / DTYPE_BYTES[m.act_dtype], m.num_moe_layers)
    lm_elems = (m.vocab_size * m.hidden_size) / tp
    kernels[act_f] = kernels.get(act_f, 0.0) + 1  # the LM head
    expert_elems = 0.0
    if m.is_moe:
        expert_elems = wb["experts"] / DTYPE_BYTES[m.expert_weight_dtype] / m.num_experts
        kernels[moe_f] = kernels.get(moe_f, 0.0) + 2 * m.num_moe_layers  # fused w13, w2
    heads = m.num_attention_heads / tp
    if m.attention == "mla":
        # prefill: decompressed heads over nope+rope (QK) and v (PV); decode: absorbed
        # form over the latent (kv_lora + rope for QK, kv_lora for PV). AITER's MLA decode
        # kernel pads heads per rank to 16 (vLLM PR #35850), so fewer cost as 16.
        pair_p = 2.0 * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
        pair_d = 2.0 * max(heads, 16.0) * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
        kv_units = max(heads, 16.0) / 16.0  # one latent head, tiled 16 query heads at a time
        # prefill runs MHA over decompressed K/V: head dim (qk + v) / 2 per pair, no packing
        pf_head_dim = (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) / 2.0
        pf_group = 1.0
    else:
        pair_p = pair_d = 4.0 * heads * m.head_dim  # QK^T and PV, 2 FLOPs per MAC
        kv_units = float(m.kv_heads_per_gpu(tp))
        pf_head_dim = float(m.head_dim)
        pf_group = heads / max(kv_units, 1.0)  # query heads per KV head on a rank
    per_layer_kv = m.kv_bytes_per_token_layer(tp)
    full, slide = m.num_full_layers, m.num_sliding_layers
    ar_calls = (2 * layers + 1) if tp > 1 else 0
    return {
        "dense": dense, "kernels": kernels, "dims": dims, "lm_fmt": act_f,
        "lm_elems": lm_elems, "lm_dims": (lm_elems / h, h, 1.0),
        "expert_fmt": moe_f, "expert_elems": expert_elems,
        "kv_full": full * per_layer_kv, "kv_slide": slide * per_layer_kv,
        "pair_p_full": full * pair_p, "pair_d_full": full * pair_d,
        "pair_p_slide": slide * pair_p, "pair_d_slide": slide * pair_d,
        "kv_units": kv_units, "heads": heads, "pf_head_dim": pf_head_dim,
        "pf_group": pf_group, "ar_calls": float(ar_calls), "ring": 2.0 * (tp - 1) / tp,
        "ar_bytes_tok": m.hidden_size * DTYPE_BYTES[m.act_dtype],
    }


def expert_dims(m: ModelSpec, split: int) -> tuple[float, float, float]:
    """(sum N, sum K, GEMMs) of one routed expert's fused w13 (K = hidden, N = 2 I) and
    w2 (N = hidden, K = I) with the intermediate width ``I`` split ``split`` ways."""
    h, i = float(m.hidden_size), m.moe_intermediate_size / split
    return 2.0 * i + h, h + i, 2.0
