"""The host link per GPU (the path KV offloading moves blocks over), and the twin's
``OffloadSettings`` from ``--kv-offloading-size``.

Each figure below carries its source. vLLM's CPU offloading copies each TP rank's shard
of a block between that rank's HBM and pinned host memory, so what bounds a transfer is
one GPU's host link, per direction (PCIe is full duplex: loads use host -> device,
stores device -> host, and do not slow each other). The ranks move in parallel, so a
job's time is one rank's shard over one link.

Assumption stated, not measured: every GPU has its own x16 link to host memory (the
platforms below give each GPU a Gen5 x16 host interface; a platform whose PCIe switch
shares one uplink between two GPUs halves the rate, which a calibration would show).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import ConfigError
from tuner.sim.kv_connector.settings import OffloadSettings

__all__ = ["HOST_LINKS", "HostLink", "host_link_for", "offload_settings"]

#: PCIe 5.0: 32 GT/s per lane, 128b/130b encoding (PCI-SIG, PCI Express Base
#: Specification Revision 5.0, 2019; pcisig.com/specifications): x16 = 32e9 * 16 * 128/130
#: / 8 = 63.0 GB/s per direction.
PCIE5_X16_RAW = 32e9 * 16 * (128 / 130) / 8
#: Share of the raw rate a large pinned DMA reaches after TLP/DLLP overhead: an
#: engineering estimate (0.85; 256-byte max payload with 24-28 bytes of TLP framing is
#: ~0.9 before flow control), not a measurement; calibrate on a node.
PCIE_DMA_EFFICIENCY = 0.85
#: NVLink-C2C between Grace and Hopper/Blackwell: 900 GB/s bidirectional (NVIDIA GH200
#: Grace Hopper Superchip datasheet, 2023), 450 GB/s per direction.
NVLINK_C2C_RAW = 450e9
#: Per-job fixed cost (DMA submission, completion event, worker poll): an engineering
#: estimate, 10 us, not a measurement.
JOB_LATENCY_S = 10e-6


@dataclass(frozen=True, slots=True)
class HostLink:
    """One GPU's link to host memory, per direction."""

    name: str  # e.g. "PCIe 5.0 x16"
    bytes_per_s: float  # effective, one direction
    latency_s: float  # fixed cost per transfer job
    source: str  # where the platform's link comes from


_PCIE5 = dict(name="PCIe 5.0 x16", bytes_per_s=PCIE5_X16_RAW * PCIE_DMA_EFFICIENCY,
              latency_s=JOB_LATENCY_S)

#: hardware preset -> its host link (the platform's host interface, per GPU).
HOST_LINKS: dict[str, HostLink] = {
    "mi355x": HostLink(**_PCIE5, source="AMD Instinct MI355X datasheet: host interface "
                       "PCIe 5.0 x16 (amd.com/en/products/accelerators/instinct/mi350/mi355x)"),
    "mi325x": HostLink(**_PCIE5, source="AMD Instinct MI325X datasheet: bus type PCIe 5.0 x16 "
                       "(amd.com/en/products/accelerators/instinct/mi300/mi325x)"),
    "mi300x": HostLink(**_PCIE5, source="AMD Instinct MI300X datasheet: bus type PCIe 5.0 x16, "
                       "128 GB/s bidirectional (amd.com/en/products/accelerators/instinct/mi300/mi300x)"),
    "h100": HostLink(**_PCIE5, source="NVIDIA H100 Tensor Core GPU datasheet: PCIe Gen5 "
                     "128 GB/s (bidirectional x16; nvidia.com/en-us/data-center/h100)"),
    "h200": HostLink(**_PCIE5, source="NVIDIA H200 Tensor Core GPU datasheet: PCIe Gen5 "
                     "128 GB/s (bidirectional x16; nvidia.com/en-us/data-center/h200)"),
    "b200": HostLink(**_PCIE5, source="NVIDIA DGX B200 / HGX B200 specifications: GPUs on "
                     "PCIe Gen5 x16 to the host (nvidia.com/en-us/data-center/dgx-b200)"),
    "gh200": HostLink("NVLink-C2C", NVLINK_C2C_RAW, JOB_LATENCY_S,
                      "NVIDIA GH200 Grace Hopper Superchip datasheet: NVLink-C2C 900 GB/s "
                      "bidirectional"),
    "gb200": HostLink("NVLink-C2C", NVLINK_C2C_RAW, JOB_LATENCY_S,
                      "NVIDIA GB200 NVL72 specifications: NVLink-C2C 900 GB/s bidirectional "
                      "per Grace-Blackwell pair"),
}


def host_link_for(hardware_name: str) -> HostLink:
    """The preset's host link; a custom hardware YAML gets PCIe 5.0 x16 (stated in the
    summary's notes by the caller)."""
    return HOST_LINKS.get(hardware_name.lower(), HostLink(
        **_PCIE5, source="default for hardware without a host-link entry: PCIe 5.0 x16"))


#: vLLM's CPU pool rounds each chunk up to the page size (cpu/spec.py
#: BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE).
PAGE_BYTES = 4096


#: The largest ``--kv-offloading-size`` accepted: vLLM pins the pool in host RAM, and
#: no single host carries 64 TiB; a larger figure is a typo, not a configuration.
MAX_OFFLOAD_GIB = 1 << 16


def offload_settings(*, size_gib: float | None, backend: str, policy: str,
                     blocks_per_chunk: int, hardware_name: str, tp: int,
                     bytes_per_block: int) -> OffloadSettings | None:
    """``OffloadSettings`` as vLLM 0.33.0 sizes the pool (``CPUOffloadingSpec``:
    ``num_chunks = cpu_bytes_to_use // round_up(block bytes x world_size x
    blocks_per_chunk, page)``, ``cpu_bytes_to_use = kv_offloading_size GiB``); None when
    ``size_gib`` is None."""
    if size_gib is None:
        return None
    if not size_gib > 0:
        raise ConfigError(f"--kv-offloading-size {size_gib}: must be > 0 GiB")
    if not size_gib <= MAX_OFFLOAD_GIB:
        raise ConfigError(f"--kv-offloading-size {size_gib}: more than {MAX_OFFLOAD_GIB} GiB, "
                          "beyond any host's memory (vLLM pins it in host RAM)")
    chunk_bytes = bytes_per_block * tp * blocks_per_chunk
    aligned = -(-chunk_bytes // PAGE_BYTES) * PAGE_BYTES
    num_chunks = int(size_gib * (1 << 30)) // aligned
    link = host_link_for(hardware_name)
    settings = OffloadSettings(
        num_chunks=num_chunks, blocks_per_chunk=blocks_per_chunk, policy=policy,
        backend=backend, bytes_per_block=bytes_per_block,
        load_bytes_per_s=link.bytes_per_s, store_bytes_per_s=link.bytes_per_s,
        latency_s=link.latency_s, num_workers=tp)
    settings.validate()
    return settings
