"""Gated DeltaNet (linear-attention) layers of hybrid models (Qwen3.5/3.6, Qwen3-Next).

A GDN layer holds no KV cache: each request carries a fixed recurrent state of
``value_heads x key_dim x value_dim`` elements per layer (fp32 where the config says
``mamba_ssm_dtype: float32``, as Qwen3.6 does). vLLM runs, per layer
(``model_executor/layers/mamba/gdn``-style kernels from flash-linear-attention):

* **decode**: ``causal_conv1d_update`` and ``fused_recurrent_gated_delta_rule``: read
  and write each decode request's state once (memory-bound), plus the short
  convolution over the q/k/v channels;
* **prefill**: ``causal_conv1d_fn`` and ``chunk_gated_delta_rule`` (chunks of 64
  tokens): per token per value head ``4 dk dv`` FLOPs through the state plus
  ``2 C (dk + dv) + 2 C dk`` inside the chunk (``C = 64``: Q K^T, the attention-weighted
  V, the WY transform), and each prefill request's state read and written.

The projections (in_proj_qkvz, in_proj_ba, out_proj) are GEMMs priced with the others.

Constants: fitted by ``bench/aic_kernels.py --fit-priors`` to aiconfigurator-core's
measured vLLM 0.24.0 GDN kernels on H200 (``systems/data/h200_sxm/linear_attention/
vllm/0.24.0/gdn_perf.parquet``, Qwen3.5-27B shapes at 6-48 value heads; the four
kernels summed per (batch, length)): decode median |error| 4.8 %, prefill 20.4 %
(the fit's output, rounded to 3 digits). They
are efficiencies against the GPU's own HBM bandwidth and bf16 peak, applied to every
GPU: there is no public per-kernel GDN measurement for MI355X or MI300X (vLLM's ROCm
path runs the same Triton kernels), so an AMD GDN prediction rests on this H200 shape.
"""

from __future__ import annotations

from tuner.perf.hardware import HardwareSpec
from tuner.perf.models import ModelSpec
from tuner.sim.batch import StepBatch

#: tokens per chunk of vLLM's chunked gated-delta-rule prefill kernel
CHUNK_TOKENS = 64
DECODE_FLOOR_S = 5.31e-6  # per layer, conv update + recurrent kernel, one request
DECODE_STATE_EFF = 0.846  # HBM fraction reading + writing the states at decode
DECODE_CONV_EFF = 1.0  # the conv update hides in the state traffic (fit at its bound)
PREFILL_FLOOR_S = 14.5e-6  # per layer, conv + chunked kernel
PREFILL_STATE_EFF = 0.551  # HBM fraction of the per-request state traffic at prefill
PREFILL_CONV_EFF = 0.578  # HBM fraction of the short convolution (in + out, bf16)
PREFILL_FLOP_EFF = 0.161  # bf16 peak fraction of the chunked scan's FLOPs


def linear_constants(hardware: HardwareSpec, model: ModelSpec,
                     tp: int) -> tuple[float, float, float, float, float]:
    """(decode s per step, per decode request, prefill s per step, per prefill request,
    per prefill token) of all linear-attention layers on one TP rank; zeros without them.
    """
    layers = model.num_linear_layers
    if not layers:
        return 0.0, 0.0, 0.0, 0.0, 0.0
    nv = model.linear_num_value_heads / tp
    nk = model.linear_num_key_heads / tp
    dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
    bw, peak = hardware.hbm_bandwidth, hardware.peak("bf16")
    state_rw = 2.0 * nv * dk * dv * model.linear_state_bytes  # read + write, per request
    conv = 2.0 * (2 * nk * dk + nv * dv) * 2.0  # q/k/v channels in + out, bf16, per token
    c = CHUNK_TOKENS
    flops = nv * (4.0 * dk * dv + 2.0 * c * (dk + dv) + 2.0 * c * dk)  # per token
    per_decode = state_rw / (DECODE_STATE_EFF * bw) + conv / (DECODE_CONV_EFF * bw)
    per_prefill_req = state_rw / (PREFILL_STATE_EFF * bw)
    per_prefill_tok = conv / (PREFILL_CONV_EFF * bw) + flops / (PREFILL_FLOP_EFF * peak)
    return (layers * DECODE_FLOOR_S, layers * per_decode, layers * PREFILL_FLOOR_S,
            layers * per_prefill_req, layers * per_prefill_tok)


def linear_attention_s(k: tuple[float, float, float, float, float], batch: StepBatch) -> float:
    """Seconds of the linear-attention layers for ``batch`` (``k`` from
    :func:`linear_constants`): the decode kernels run when the step has decode requests,
    the chunked ones when it has prefill tokens (a mixed step runs both)."""
    t = 0.0
    ndr = batch.num_decode_reqs
    if ndr:
        t = k[0] + k[1] * ndr
    npt = batch.num_prefill_tokens
    if npt:
        t += k[2] + k[3] * batch.num_prefill_reqs + k[4] * npt
    return t
