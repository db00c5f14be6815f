"""``Target``: the deployment a replay models (GPU, model, parallelism, KV cache).

A ``Target`` is what the user names on the command line (``--hardware mi355x --model
llama-3.1-70b --tp 8``). ``tuner.perf.presets.resolve_target`` turns it into the concrete
pieces the twin needs: a step-time model, the KV-cache shape and the GPU count.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Target:
    hardware: str = "mi355x"  # hardware preset name or path to a hardware YAML
    model: str = "llama-3.1-70b"  # model preset name or path to a HF config.json (or its folder)
    tp: int = 1  # tensor-parallel size (GPUs per engine)
    #: vLLM ``--data-parallel-size``: DP ranks inside one deployment (one API server whose
    #: internal load balancer picks the rank; MoE ranks step in lockstep). Each rank is
    #: one TP group with its own scheduler and KV cache (tuner.sim.fleet).
    dp: int = 1
    block_size: int | None = None  # KV block size; None = the hardware/backend default
    num_gpu_blocks: int | None = None  # override the computed KV capacity (vLLM num_gpu_blocks)
    gpu_memory_utilization: float = 0.92  # vLLM 0.33 default
    max_model_len: int | None = None  # None = the model's max_position_embeddings
    calibration: str | None = None  # path to a calibration YAML (tuner calibrate) replacing coefficients
    weight_dtype: str | None = None  # tuner-only override of every linear layer (bf16, fp8, fp4)
    kv_cache_dtype: str | None = None  # vLLM --kv-cache-dtype (auto = the model dtype, fp8, ...)
    quantization: str | None = None  # vLLM --quantization (None/none = the checkpoint's scheme)
    #: auto (measured tables where installed and covered, else analytic), analytic or aic
    step_time_source: str = "auto"
    #: vLLM's ``--async-scheduling/--no-async-scheduling``; None = what vLLM resolves for
    #: this target (``tuner.vllm_compat``: on for GPU targets, off on the CPU platform)
    async_scheduling: bool | None = None
    #: independent copies of the deployment (each TP x DP) behind a router
    #: (``tuner.sim.fleet.RouterSettings``)
    replicas: int = 1
    #: vLLM ``--enable-expert-parallel``: MoE experts sharded over the TP x DP ranks
    #: (dispatch + combine all-to-all when dp > 1, tuner/perf/expert_parallel.py); MoE only
    enable_expert_parallel: bool = False

    @property
    def num_engines(self) -> int:
        """Engines (schedulers with their own KV cache) the deployment runs: dp x replicas."""
        return self.dp * self.replicas

    @property
    def num_gpus(self) -> int:
        return self.tp * self.dp * self.replicas
