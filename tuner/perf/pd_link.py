"""The link between a prefill pool and a decode pool, and the twin's ``PDSettings``.

vLLM's NIXL connector moves each decode rank's shard of a request's KV blocks from the
prefill rank(s) holding those heads (``nixl/tp_mapping.py``), GPU memory to GPU memory:
over the scale-up fabric when both pools sit on one node (AMD Infinity Fabric / xGMI,
NVIDIA NVLink through NVSwitch), over each GPU's RDMA NIC across nodes (UCX picks the
path). Every figure below carries its source; a figure that is an engineering estimate
says so. Per direction, per GPU.

A pair of GPUs on an AMD 8-GPU baseboard is joined by ONE Infinity Fabric link (the
seven links of each GPU form a full mesh), so a rank-to-rank read gets one link's rate;
an NVSwitch node gives any pair the GPU's whole NVLink rate.

:class:`PDLayout` is the user's description (``--pd P:D``, ``--prefill-tp``,
``--decode-tp``, ``--prefill-hardware``, ``--pd-link``); :func:`pd_settings` resolves
it with the two pools' resolved targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tuner.errors import ConfigError
from tuner.sim.disagg.settings import PDSettings

if TYPE_CHECKING:
    from tuner.perf.presets import ResolvedTarget

__all__ = ["GPUS_PER_NODE", "PDLayout", "PREFILL_SCHEDULER_FIELDS", "PoolLink", "parse_pd", "pd_link",
           "pd_settings"]

PDLink = Literal["auto", "same-node", "cross-node"]

#: GPUs per node on every preset's platform (AMD Instinct 8-GPU UBB; NVIDIA HGX/DGX 8-GPU
#: baseboards): a deployment of more GPUs spans nodes.
GPUS_PER_NODE = 8
#: Share of the raw rate a large one-sided RDMA READ / fabric copy reaches: an engineering
#: estimate (0.9), not a measurement; a calibration on a cluster replaces it.
TRANSFER_EFFICIENCY = 0.9
#: Fixed cost of one request's transfer (NIXL transfer handle, RDMA READ round trip,
#: completion notification to the prefill side): engineering estimates, not measured.
CROSS_NODE_LATENCY_S = 30e-6
SAME_NODE_LATENCY_S = 15e-6


@dataclass(frozen=True, slots=True)
class PoolLink:
    """One GPU's path to the other pool, per direction."""

    name: str
    bytes_per_s: float  # raw, one direction (efficiency applied in pd_settings)
    latency_s: float
    source: str


def _nic(source: str) -> PoolLink:
    return PoolLink("400 Gb/s RDMA NIC per GPU", 400e9 / 8, CROSS_NODE_LATENCY_S, source)


#: hardware preset -> (same-node link, cross-node link)
POOL_LINKS: dict[str, tuple[PoolLink, PoolLink]] = {
    "mi355x": (PoolLink("Infinity Fabric (xGMI) link", 153.6e9 / 2, SAME_NODE_LATENCY_S,
                        "AMD Instinct MI355X datasheet: 7 Infinity Fabric links, 153.6 GB/s "
                        "peak per link (bidirectional), one link per GPU pair"),
               _nic("AMD Instinct MI355X platforms: one AMD Pensando Pollara 400 AI NIC "
                    "(400 Gb/s) per GPU")),
    "mi325x": (PoolLink("Infinity Fabric (xGMI) link", 128e9 / 2, SAME_NODE_LATENCY_S,
                        "AMD Instinct MI325X datasheet: 7 Infinity Fabric links, 128 GB/s "
                        "peak per link (bidirectional), one link per GPU pair"),
               _nic("assumption: one 400 Gb/s RDMA NIC per GPU (the MI300-series "
                    "reference platforms' scale-out)")),
    "mi300x": (PoolLink("Infinity Fabric (xGMI) link", 128e9 / 2, SAME_NODE_LATENCY_S,
                        "AMD Instinct MI300X datasheet: 7 Infinity Fabric links, 896 GB/s "
                        "aggregate (128 GB/s per link, bidirectional)"),
               _nic("assumption: one 400 Gb/s RDMA NIC per GPU (the MI300-series "
                    "reference platforms' scale-out)")),
    "h100": (PoolLink("NVLink 4 (NVSwitch)", 900e9 / 2, SAME_NODE_LATENCY_S,
                      "NVIDIA H100 SXM datasheet: NVLink 900 GB/s (bidirectional)"),
             _nic("NVIDIA DGX H100 datasheet: 8x single-port ConnectX-7, 400 Gb/s each, "
                  "one per GPU")),
    "h200": (PoolLink("NVLink 4 (NVSwitch)", 900e9 / 2, SAME_NODE_LATENCY_S,
                      "NVIDIA H200 SXM datasheet: NVLink 900 GB/s (bidirectional)"),
             _nic("NVIDIA DGX H200 datasheet: 8x single-port ConnectX-7, 400 Gb/s each, "
                  "one per GPU")),
    "b200": (PoolLink("NVLink 5 (NVSwitch)", 1.8e12 / 2, SAME_NODE_LATENCY_S,
                      "NVIDIA DGX B200 datasheet: NVLink 1.8 TB/s per GPU (bidirectional)"),
             _nic("NVIDIA DGX B200 datasheet: 8x single-port ConnectX-7 VPI, 400 Gb/s "
                  "each, one per GPU")),
}


@dataclass(frozen=True, slots=True)
class PDLayout:
    """A disaggregated deployment as the user asks for it (None: the main target's)."""

    num_prefill: int  # --pd P:D, P
    num_decode: int  # --pd P:D, D
    prefill_tp: int | None = None  # --prefill-tp (None: --tp)
    decode_tp: int | None = None  # --decode-tp (None: --tp)
    prefill_hardware: str | None = None  # --prefill-hardware (None: --hardware)
    link: PDLink = "auto"  # --pd-link
    #: --pd-router: the proxy's choices (``tuner.sim.disagg.routers.PD_ROUTERS``)
    router: str = "vllm-proxy"
    #: --pd-transfer-mode: vLLM's ``transfer_mode``, "pull" (``NixlConnector``) or "push"
    #: (``NixlPushConnector``)
    transfer_mode: str = "pull"

    #: the prefill instances' own scheduler limits (``--prefill-max-num-batched-tokens``,
    #: ``--prefill-max-num-seqs``; None: the deployment's ``--max-num-batched-tokens`` /
    #: ``--max-num-seqs``). Why only these two: a prefill instance serves every request
    #: with ``max_tokens=1``, so its token budget (the chunk a long prompt is cut into, and
    #: so TTFT against prefill throughput) and its running limit (concurrent prefills and
    #: the blocks they hold until read) are the knobs whose best values differ from the
    #: decode pool's; the other scheduler fields act the same on both.
    prefill_max_num_batched_tokens: int | None = None
    prefill_max_num_seqs: int | None = None

    def __post_init__(self) -> None:
        for name in PREFILL_SCHEDULER_FIELDS:
            value = getattr(self, "prefill_" + name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ConfigError(f"--prefill-{name.replace('_', '-')} {value!r}: an "
                                  "integer >= 1")

    def prefill_overrides(self) -> dict[str, int]:
        """The prefill pool's scheduler fields that differ from the deployment's."""
        return {name: getattr(self, "prefill_" + name) for name in PREFILL_SCHEDULER_FIELDS
                if getattr(self, "prefill_" + name) is not None}

    def to_dict(self) -> dict[str, object]:
        # the per-pool limits only where set, so records of layouts without them stay the same
        return {"num_prefill": self.num_prefill, "num_decode": self.num_decode,
                "prefill_tp": self.prefill_tp, "decode_tp": self.decode_tp,
                "prefill_hardware": self.prefill_hardware, "link": self.link,
                "router": self.router,
                # push only where set: pull records stay as they were
                **({} if self.transfer_mode == "pull" else {"transfer_mode": self.transfer_mode}),
                **{"prefill_" + k: v for k, v in self.prefill_overrides().items()}}


#: ``SchedulerSettings`` fields a P/D layout may set for its prefill pool alone
#: (:attr:`PDLayout.prefill_max_num_batched_tokens`, ...).
PREFILL_SCHEDULER_FIELDS: tuple[str, ...] = ("max_num_batched_tokens", "max_num_seqs")


def parse_pd(text: str) -> tuple[int, int]:
    """``"1:3"`` -> ``(1, 3)``; ConfigError names the flag and the fix."""
    parts = str(text).split(":")
    try:
        p, d = (int(x) for x in parts) if len(parts) == 2 else (0, 0)
    except ValueError:
        p = d = 0
    if p < 1 or d < 1:
        raise ConfigError(f"--pd {text!r}: expected PREFILL:DECODE instance counts, "
                          "each an integer >= 1 (e.g. --pd 1:3)")
    return p, d


def pd_link(prefill_hardware: str, decode_hardware: str, num_gpus: int,
            link: PDLink = "auto") -> PoolLink:
    """The link a read crosses: same node when asked (or, for ``auto``, when both pools
    are one preset and fit on one node), else the NIC."""
    hw = decode_hardware.lower()
    links = POOL_LINKS.get(hw)
    if links is None:
        links = (PoolLink("same-node fabric (unknown)", 50e9, SAME_NODE_LATENCY_S,
                          f"default for hardware {decode_hardware!r} without a pool-link "
                          "entry: the NIC's rate"), _nic("default: 400 Gb/s NIC per GPU"))
    same = prefill_hardware.lower() == hw
    if link == "same-node":
        if not same:
            raise ConfigError(f"--pd-link same-node: the pools are different GPUs "
                              f"({prefill_hardware} and {decode_hardware}); they meet over "
                              "the NIC (--pd-link cross-node)")
        if num_gpus > GPUS_PER_NODE:
            raise ConfigError(f"--pd-link same-node: the deployment has {num_gpus} GPUs, "
                              f"more than one node's {GPUS_PER_NODE}")
        return links[0]
    if link == "cross-node" or not same or num_gpus > GPUS_PER_NODE:
        return links[1]
    return links[0]


def pd_settings(layout: PDLayout, prefill: "ResolvedTarget",
                decode: "ResolvedTarget") -> PDSettings:
    """The twin's ``PDSettings`` for ``layout`` on the two resolved pools."""
    p_tp, d_tp = prefill.target.tp, decode.target.tp
    num_gpus = layout.num_prefill * p_tp + layout.num_decode * d_tp
    link = pd_link(prefill.hardware.name, decode.hardware.name, num_gpus, layout.link)
    settings = PDSettings(
        num_prefill=layout.num_prefill, num_decode=layout.num_decode,
        prefill_tp=p_tp, decode_tp=d_tp, block_size=decode.cache.block_size,
        bytes_per_token_rank=decode.model.kv_bytes_per_token(d_tp),
        link_bytes_per_s=link.bytes_per_s * TRANSFER_EFFICIENCY,
        link_latency_s=link.latency_s, link_name=link.name, router=layout.router,
        variant=layout.transfer_mode)
    settings.validate()
    return settings
