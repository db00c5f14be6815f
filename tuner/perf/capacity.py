"""KV-cache capacity: how many blocks vLLM would allocate on the target.

Mirrors vLLM 0.33.0's start-up profiling (``gpu_worker.determine_available_memory``
and ``kv_cache_planning``; spec §5.6), per GPU:

    requested = ceil(memory x gpu_memory_utilization)
    kv_bytes  = requested - weights - activation peak - non-torch memory - CUDA graphs
    num_gpu_blocks = kv_bytes // (block_size x KV bytes per token per GPU)

vLLM *measures* the activation peak with a dummy forward of ``max_num_batched_tokens``
tokens plus a sampler run over ``max_num_seqs`` rows; tuner estimates it:

* forward activations: ``max_num_batched_tokens x act_bytes x (4 x hidden + 3 x
  mlp_width / tp)``, with ``mlp_width`` the dense intermediate size or, for MoE, top-k
  expert widths (residual, normed input, attention output and QKV ~ 4 hidden-wide
  tensors; gate/up output and the activated product ~ 3 intermediate-wide ones);
* sampler: ``max_num_seqs x vocab x 4 bytes x 2`` (fp32 logits and one working copy);
* non-torch memory: a fixed 1.5 GiB (runtime, RCCL/NCCL and custom all-reduce
  buffers; vLLM logs 0.5-2 GiB).

* CUDA/HIP graphs: a fixed 1 GiB. vLLM 0.33.0 profiles the graph memory
  (``profile_cudagraph_memory``) and subtracts it because
  ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults to 1 (``envs.py``; the
  worker code, ``gpu_worker.py`` 707-757, wins over spec §5.6's "only if"); vLLM logs
  a few hundred MiB to ~2 GiB for graph capture.

``Target.num_gpu_blocks`` (``--num-gpu-blocks-override``) replaces the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.errors import ConfigError
from tuner.perf.hardware import GIB, HardwareSpec
from tuner.perf.models import DTYPE_BYTES, ModelSpec

NON_TORCH_BYTES = int(1.5 * GIB)  # fixed non-torch reserve (see module docstring)
CUDAGRAPH_BYTES = 1 * GIB  # CUDA/HIP graph memory estimate vLLM 0.33 subtracts by default
ACT_HIDDEN_TENSORS = 4  # hidden-wide activation tensors live at the peak
ACT_MLP_TENSORS = 3  # intermediate-wide tensors live at the peak (gate+up, product)
SAMPLER_COPIES = 2  # fp32 logits + one working copy


@dataclass(frozen=True, slots=True)
class KVCapacity:
    """Memory budget of one GPU and the block count it yields (bytes per GPU)."""

    num_gpu_blocks: int  # blocks vLLM would allocate (block 0 becomes the null block)
    block_size: int  # tokens per block
    bytes_per_block: float  # block_size x KV bytes per token per GPU
    requested_bytes: int  # ceil(memory x gpu_memory_utilization)
    weight_bytes: float  # this rank's share of the weights
    activation_bytes: float  # estimated forward + sampler peak
    non_torch_bytes: int
    cudagraph_bytes: int  # graph-capture memory subtracted before the KV cache
    kv_bytes: float  # what is left for the KV cache

    @property
    def num_tokens(self) -> int:
        """KV cache size in tokens, as vLLM logs it ("GPU KV cache size: N tokens")."""
        return self.num_gpu_blocks * self.block_size


def activation_bytes(model: ModelSpec, tp: int, *, max_num_batched_tokens: int,
                     max_num_seqs: int) -> float:
    """Estimated profiling peak of activations and sampler (see module docstring)."""
    mlp_width = max(model.intermediate_size,
                    model.num_experts_per_tok * model.moe_intermediate_size)
    act_b = DTYPE_BYTES[model.act_dtype]
    forward = max_num_batched_tokens * act_b * (
        ACT_HIDDEN_TENSORS * model.hidden_size + ACT_MLP_TENSORS * mlp_width / tp)
    sampler = max_num_seqs * model.vocab_size * 4.0 * SAMPLER_COPIES
    return forward + sampler


def kv_capacity(hardware: HardwareSpec, model: ModelSpec, tp: int, block_size: int,
                gpu_memory_utilization: float = 0.92, *, max_num_batched_tokens: int = 8192,
                max_num_seqs: int = 1024, expert_parallel_size: int = 1) -> KVCapacity:
    """The per-GPU memory budget and ``num_gpu_blocks`` (see module docstring).

    ``expert_parallel_size`` > 1 (``--enable-expert-parallel``, ``tp x dp`` ranks) holds
    ``1/EP`` of the routed experts per GPU instead of a ``1/tp`` slice of each.

    Raises:
        ConfigError: bad arguments, or the weights and activations leave no room for
            one block (the message says how much is missing and suggests a larger TP).
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ConfigError(f"gpu_memory_utilization={gpu_memory_utilization} must be in (0, 1]")
    if block_size < 1 or tp < 1:
        raise ConfigError(f"block_size={block_size} and tp={tp} must be >= 1")
    requested = math.ceil(hardware.memory_bytes * gpu_memory_utilization)
    by_group = model.weight_bytes_per_gpu(tp)
    if expert_parallel_size > 1:
        by_group["experts"] = by_group["experts"] * tp / expert_parallel_size
    weights = sum(by_group.values())
    act = activation_bytes(model, tp, max_num_batched_tokens=max_num_batched_tokens,
                           max_num_seqs=max_num_seqs)
    kv_bytes = requested - weights - act - NON_TORCH_BYTES - CUDAGRAPH_BYTES
    per_block = block_size * model.kv_bytes_per_token(tp)
    if kv_bytes < per_block:
        raise ConfigError(
            f"{model.name} does not fit on {tp}x {hardware.name}: weights "
            f"{weights / GIB:.1f} GiB + activations {act / GIB:.1f} GiB + non-torch "
            f"{NON_TORCH_BYTES / GIB:.1f} GiB + graphs {CUDAGRAPH_BYTES / GIB:.1f} GiB per GPU "
            f"exceed {requested / GIB:.1f} GiB "
            f"(gpu_memory_utilization={gpu_memory_utilization}); raise --tp or "
            "--gpu-memory-utilization")
    return KVCapacity(
        num_gpu_blocks=int(kv_bytes // per_block), block_size=block_size,
        bytes_per_block=per_block, requested_bytes=requested, weight_bytes=weights,
        activation_bytes=act, non_torch_bytes=NON_TORCH_BYTES,
        cudagraph_bytes=CUDAGRAPH_BYTES, kv_bytes=kv_bytes)


def num_gpu_blocks(hardware: HardwareSpec, model: ModelSpec, tp: int, block_size: int,
                   gpu_memory_utilization: float = 0.92, *, max_num_batched_tokens: int = 8192,
                   max_num_seqs: int = 1024) -> int:
    """vLLM's ``num_gpu_blocks`` for this target (see :func:`kv_capacity`)."""
    return kv_capacity(hardware, model, tp, block_size, gpu_memory_utilization,
                       max_num_batched_tokens=max_num_batched_tokens,
                       max_num_seqs=max_num_seqs).num_gpu_blocks
