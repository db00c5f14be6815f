"""``Target``: the deployment a replay models (GPU, model, parallelism, KV cache).

A ``Target`` is what the user names on the command line (``--hardware mi355x --model
llama-3.1-70b --tp 8``). ``tuner.perf.presets.resolve_target`` turns it into the concrete
pieces the twin needs: a step-time model, the KV-cache shape and the GPU count.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

from typing import TYPE_CHECKING

from tuner.errors import ConfigError

if TYPE_CHECKING:
    from tuner.perf.clock_variant import ClockVariant

#: Memory one engine's twin (scheduler, KV block pool, queues) takes in a replay: about
#: 4.8 MB measured at --replicas 10000 (48 GB), rounded up for larger KV caches.
ENGINE_BYTES = 8 << 20
#: Memory the twin keeps per KV block (block pool arrays, free queue, hash map slots),
#: rounded up: ``--num-gpu-blocks 10**9`` tried to allocate 3.7 GiB for one array alone.
BLOCK_BYTES = 64
#: Engines one replay models at most, whatever the memory (each is stepped in turn).
MAX_ENGINES = 4096
#: The widest tensor-parallel group any preset hardware forms (GPUs per engine).
MAX_TP = 1024


def memory_limit_bytes() -> int:
    """What this process may use: the machine's memory, or a lower ``ulimit -v``."""
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        phys = 16 << 30
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return min(phys, soft) if soft not in (resource.RLIM_INFINITY, -1) and soft > 0 else phys


def max_engines() -> int:
    """Engines (dp x replicas) a replay may model here: half the memory at ENGINE_BYTES
    each, at most :data:`MAX_ENGINES`."""
    return max(1, min(MAX_ENGINES, memory_limit_bytes() // 2 // ENGINE_BYTES))


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
    #: the step-time model with its parts scaled (``tuner.perf.clock_variant``): only the
    #: robust check's replays set it (``tuner.tune.robust``); None = the nominal clock
    clock: "ClockVariant | None" = None
    #: vLLM ``--kv-offloading-size`` (GiB of host memory for the CPU KV tier, over all TP
    #: ranks of an engine); None = no tier (docs/kv-offloading.md)
    kv_offloading_size: float | None = None
    #: vLLM ``--kv-offloading-backend``: native (OffloadingConnector, exact) or lmcache
    #: (modelled as the same capacity tier, not LMCache's own code)
    kv_offloading_backend: str = "native"
    #: the CPU pool's ``eviction_policy`` (kv_connector_extra_config): lru or arc
    kv_offloading_eviction_policy: str = "lru"
    #: GPU blocks per CPU chunk (kv_connector_extra_config ``blocks_per_chunk``)
    kv_offloading_blocks_per_chunk: int = 1
    #: vLLM ``--api-server-count``: API server processes in front of each replica's engine
    #: core (tokenise, detokenise, stream; tuner/perf/api_server.py), priced on the client
    #: side of a replay's summary; None = vLLM's default (the DP size), 0 = left out
    api_server_count: int | None = None

    def __post_init__(self) -> None:
        """Refuse a deployment the twin cannot hold before anything is built for it
        (``--replicas 10000`` allocated 48 GB and ended in a MemoryError traceback)."""
        for name in ("tp", "dp", "replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"--{name} {value!r}: must be an integer >= 1")
        count = self.api_server_count
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                                  or count < 0):
            raise ConfigError(f"--api-server-count {count!r}: must be an integer >= 0")
        if self.tp > MAX_TP:
            raise ConfigError(f"--tp {self.tp}: more GPUs per engine than any hardware has "
                              f"(at most {MAX_TP})")
        cap = max_engines()
        if self.num_gpu_blocks is not None:
            most = max(2, memory_limit_bytes() // 2 // (BLOCK_BYTES * self.dp * self.replicas))
            if not isinstance(self.num_gpu_blocks, int) or not 2 <= self.num_gpu_blocks <= most:
                raise ConfigError(
                    f"--num-gpu-blocks {self.num_gpu_blocks}: must be 2 to {most:,} here (the "
                    f"twin keeps about {BLOCK_BYTES} bytes per block and engine; half of "
                    f"{memory_limit_bytes() / 2**30:.1f} GiB)")
        if self.dp * self.replicas > cap:
            raise ConfigError(
                f"--dp {self.dp} x --replicas {self.replicas} = {self.dp * self.replicas:,} "
                f"engines: this machine can model at most {cap:,} (each engine's scheduler and "
                f"KV cache take up to {ENGINE_BYTES >> 20} MB, half of "
                f"{memory_limit_bytes() / 2**30:.1f} GiB); model fewer engines")

    @property
    def num_engines(self) -> int:
        """Engines (schedulers with their own KV cache) the deployment runs: dp x replicas."""
        return self.dp * self.replicas

    @property
    def num_gpus(self) -> int:
        return self.tp * self.dp * self.replicas
