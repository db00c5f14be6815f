"""Prefill (context) attention: how a FlashAttention-style kernel's time depends on shape.

One formula, used by the step-time model's hot path (as constants folded per deployment,
:func:`prefill_constants`) and by ``bench/aic_kernels.py`` (vectorised, against the
measured vLLM kernels, :func:`prefill_attention_s`). Per layer and TP rank, for a step's
prefill counters (``pairs`` causal query-key pairs, ``npt`` new tokens, ``npr`` requests)::

    compute = f x [pairs + (half + kv / g) x npt] / (eff(d) P)          all tiles, all SMs
            + f / H x S x rows x (keys + half + kv / g) / (eff(d) P)    the last tile's tail

with ``f`` the FLOPs per pair of all heads (4 H d), ``P`` the bf16 peak, ``S`` the SMs/CUs
and ``keys`` the longest prompt's keys (``pairs / npt + npt / (2 npr)``: exact for equal
prompts, cached prefix included). The terms, each a kernel fact:

* ``eff(d) = eff x d / (d + d_sm) x (128 + d_sm) / 128``: every score element costs one
  exponential on top of its ``4 d`` MMA FLOPs, and the exponential unit does not scale
  with the tensor cores, so a small head dim reaches less of the peak. FlashAttention-3
  (arXiv 2407.08608, H100 BF16 forward, 16k) runs head dim 128 at 648 and 256 at 740
  TFLOPS, which gives ``d_sm`` ~ 42; the measured H100/H200 tables give 48-50. On B200 the
  tensor cores doubled and the exponential unit did not: its table gives ~180. ``eff``
  stays the efficiency at head dim 128, so a preset without ``d_sm`` prices as before.
* ``half`` (``attn_prefill_half_tokens``): extra key pairs per query token (the causal
  diagonal tile computed whole, each query tile's prologue and epilogue), so the
  efficiency on an L-token prompt rises as ``L / (L + 2 half)`` (FlashAttention-3 from 430
  to 621 TFLOPS between 512 and 16k tokens, pytorch/benchmark PR 2391).
* ``kv / g`` (``attn_prefill_kv_tokens``): a cost per token and KV head (its K/V tiles
  streamed through each query tile's pipeline); vLLM packs the ``g`` query heads of a KV
  head into one tile (FlashAttention's pack-GQA), so it is shared by them: MHA (and MLA's
  decompressed prefill, ``g = 1``) pays it in full, Llama-70B at TP8 (``g = 8``) an eighth.
* tail (``attn_prefill_tail_rows``): the tiles of the longest prompt's last rows see all
  its keys and finish last on one SM while the others idle, so a lone prompt runs below
  a batch of them (B200 b=1 vs b=8 at 4k tokens: 0.37 vs 0.46 of peak in the tables).

Memory (KV read, against compute; the KV write is the step model's per-token term) is as
before: :class:`tuner.perf.step_time.RooflineStepTimeModel`.
"""

from __future__ import annotations

from typing import Any

from tuner.perf.fit.coefficients import Coefficients

#: The head dim ``attn_prefill_eff`` is quoted at (the serving models' common one).
REFERENCE_HEAD_DIM = 128.0


def head_dim_efficiency(c: Coefficients, head_dim: float) -> float:
    """``attn_prefill_eff`` at ``head_dim``: the MMA share of each score element's cost,
    relative to head dim 128 (1.0 there, and everywhere when ``attn_softmax_head_dim`` is 0)."""
    d_sm = c.attn_softmax_head_dim
    if d_sm <= 0.0 or head_dim <= 0.0:
        return c.attn_prefill_eff
    return c.attn_prefill_eff * (head_dim / (head_dim + d_sm)) * (
        (REFERENCE_HEAD_DIM + d_sm) / REFERENCE_HEAD_DIM)


def prefill_constants(c: Coefficients, peak: float, compute_units: float, pair_flops: float,
                      heads: float, head_dim: float, group: float
                      ) -> tuple[float, float, float, float]:
    """Seconds per causal pair, per new token, per key of the longest prompt, and per
    step (the tail's fixed part), for layers whose pairs cost ``pair_flops`` FLOPs (all
    heads of all such layers: 4 H d each), ``heads`` query heads per rank in one layer,
    ``head_dim`` the head dim the softmax share is taken at, and ``group`` query heads per
    KV head in one tile (1 for MHA and MLA's prefill)."""
    if pair_flops <= 0.0:
        return 0.0, 0.0, 0.0, 0.0
    per_pair = pair_flops / (head_dim_efficiency(c, head_dim) * peak)
    extra = c.attn_prefill_half_tokens + c.attn_prefill_kv_tokens / max(group, 1.0)
    per_key = per_pair * compute_units * c.attn_prefill_tail_rows / max(heads, 1.0)
    return per_pair, per_pair * extra, per_key, per_key * extra


def longest_keys(pairs: Any, npt: Any, npr: Any) -> Any:
    """Keys the longest prompt's last query sees, from a step's counters: ``ctx + s`` for
    equal prompts of ``s`` new tokens over ``ctx`` cached ones (pairs / npt is ctx + (s+1)/2)."""
    return pairs / npt + 0.5 * npt / npr


def prefill_attention_s(c: Coefficients, hw: Any, heads: Any, kv_heads: Any, head_dim: Any,
                        kv_bytes_token: Any, npr: Any, npt: Any, pairs: Any, ctx: Any,
                        maximum: Any = max, fp8_kv: Any = False) -> Any:
    """One layer's prefill attention kernel (floor, KV write, max(KV read, compute)) for
    ``npr`` equal prompts: the step model's terms for one GQA layer, vectorised for the
    measured tables (NumPy arrays with ``maximum=np.maximum``). ``kv_bytes_token`` is the
    K and V bytes of one token over the layer's KV heads; ``ctx`` the tokens already
    cached per prompt; ``fp8_kv`` (per row) reads it at ``kv_fp8_bw_eff``."""
    import numpy as np

    heads = np.asarray(heads, dtype=float)
    head_dim = np.asarray(head_dim, dtype=float)
    bw = c.kv_bw_eff * hw.hbm_bandwidth
    eff = c.attn_prefill_eff * (head_dim / (head_dim + c.attn_softmax_head_dim)) * (
        (REFERENCE_HEAD_DIM + c.attn_softmax_head_dim) / REFERENCE_HEAD_DIM)
    per_pair = 4.0 * heads * head_dim / (eff * hw.peak("bf16"))
    extra = c.attn_prefill_half_tokens + c.attn_prefill_kv_tokens / np.maximum(
        heads / np.asarray(kv_heads, dtype=float), 1.0)
    per_key = per_pair * hw.compute_units * c.attn_prefill_tail_rows / heads
    cmp = (per_pair * (pairs + extra * npt)
           + per_key * (longest_keys(pairs, npt, npr) + extra))
    read_eff = np.where(fp8_kv, c.kv_read_bw_eff("fp8"), c.kv_bw_eff)
    read = npr * (ctx + npt / npr) * kv_bytes_token / (read_eff * hw.hbm_bandwidth)
    write = npt * kv_bytes_token / bw
    return c.attn_floor_s + write + maximum(read, cmp)
