"""``PDSettings``: what the twin needs to replay a disaggregated prefill/decode deployment.

Plain numbers only (``tuner.sim`` comes before ``tuner.perf`` in the stage order): the
replay layer resolves ``--pd P:D``, the two pools' TP and hardware and the link between
the pools (``tuner.perf.pd_link``) into them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import ConfigError

__all__ = ["PDSettings", "TRANSFER_MODES"]

#: vLLM 0.33.0's NIXL transfer modes (``_TRANSFER_MODE`` of its two scheduler classes)
TRANSFER_MODES = ("pull", "push")


@dataclass(frozen=True, slots=True)
class PDSettings:
    """A P:D deployment and the KV transfer between its pools (vLLM's NixlConnector or
    NixlPushConnector)."""

    num_prefill: int  # prefill instances (each one TP group), >= 1
    num_decode: int  # decode instances, >= 1
    prefill_tp: int = 1  # GPUs per prefill instance
    decode_tp: int = 1  # GPUs per decode instance
    block_size: int = 16  # KV block size in tokens (both pools; NIXL reads whole blocks)
    #: KV bytes of one token on ONE decode rank (its heads' shard, every attention layer):
    #: what each decode rank reads for each token it pulls
    bytes_per_token_rank: float = 0.0
    link_bytes_per_s: float = 0.0  # per GPU, one direction (NIC, xGMI or NVLink), > 0
    link_latency_s: float = 0.0  # fixed cost per transfer (handshake, RDMA READ setup, notif)
    link_name: str = ""  # e.g. "400 Gb/s NIC per GPU" (for the summary)
    #: vLLM's ``transfer_mode``: "pull", the decoder reads (``NixlConnector``,
    #: ``tuner.sim.disagg.nixl``); "push", the prefill instance writes
    #: (``NixlPushConnector``, ``tuner.sim.disagg.nixl_push``)
    variant: str = "pull"
    #: the proxy's prefill/decode choices: a ``tuner.sim.disagg.routers.PD_ROUTERS`` name
    router: str = "vllm-proxy"

    def validate(self) -> None:
        for name in ("num_prefill", "num_decode", "prefill_tp", "decode_tp", "block_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"disaggregation: {name}={getattr(self, name)} must be >= 1")
        if not self.link_bytes_per_s > 0:
            raise ConfigError("disaggregation: the link between the pools needs a bandwidth > 0")
        if self.bytes_per_token_rank < 0 or self.link_latency_s < 0:
            raise ConfigError("disaggregation: KV bytes and link latency must be >= 0")
        if self.variant not in TRANSFER_MODES:
            raise ConfigError(f"--pd-transfer-mode {self.variant!r}: use one of "
                              f"{', '.join(TRANSFER_MODES)}")
        from tuner.sim.disagg.routers import PD_ROUTERS

        if self.router not in PD_ROUTERS:
            raise ConfigError(f"--pd-router {self.router!r}: use one of "
                              f"{', '.join(PD_ROUTERS)}")

    @property
    def fan_in(self) -> float:
        """How many decode ranks one prefill rank serves (>= 1): heterogeneous TP
        (``nixl/tp_mapping.py``) maps each decode rank to the prefill ranks holding its
        heads; with fewer prefill ranks each prefill NIC sends ``decode_tp /
        prefill_tp`` shards, with more each decode rank still receives one shard over
        its own NIC."""
        return max(1.0, self.decode_tp / self.prefill_tp)

    def transfer_s(self, num_blocks: int) -> float:
        """Seconds to move ``num_blocks`` KV blocks into every decode rank, pulled or
        pushed (the ranks transfer in parallel, so one rank's shard over the busiest NIC
        is the transfer's time)."""
        bytes_rank = num_blocks * self.block_size * self.bytes_per_token_rank
        return self.link_latency_s + bytes_rank * self.fan_in / self.link_bytes_per_s

    def transfer_bytes(self, num_blocks: int) -> float:
        """Bytes moved over all decode ranks for ``num_blocks`` blocks."""
        return num_blocks * self.block_size * self.bytes_per_token_rank * self.decode_tp
