"""Host memory per node: the budget a searched CPU KV tier must fit (``--host-memory-gb``).

vLLM 0.33.0 allocates ``--kv-offloading-size`` GiB per engine
(config/vllm.py:1151-1186 sets ``cpu_bytes_to_use = kv_offloading_size * 2**30`` for the
``OffloadingConnector``; the CPU spec splits it over the engine's TP ranks, so the engine
as a whole pins that many bytes whatever its TP). A node that runs several engines pins
it once per engine.

Defaults exist only where a vendor's reference system states one memory size; the AMD
presets ship on OEM servers (an MI355X/MI3xx UBB board in many chassis, memory as ordered),
so there the flag is required when tier sizes are searched.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPUS_PER_NODE", "HOST_MEMORY", "NodeMemory", "engines_per_node", "host_memory_for"]

#: GPUs on one node: the 8-GPU baseboards every preset's servers carry (AMD UBB for
#: MI300X/MI325X/MI355X, NVIDIA HGX/DGX for H100/H200/B200).
GPUS_PER_NODE = 8


@dataclass(frozen=True, slots=True)
class NodeMemory:
    """One reference node's host memory."""

    gib: float  # system memory of the node, GiB (a datasheet's 2 TB read as 2,048 GiB: DIMM
    # capacities are binary; an upper bound if the vendor meant decimal terabytes)
    gpus: int  # GPUs on that node
    source: str  # the datasheet the figure comes from


#: hardware preset -> its reference node (None: no single vendor figure; pass the flag).
HOST_MEMORY: dict[str, NodeMemory] = {
    "h100": NodeMemory(2048, 8, "NVIDIA DGX H100 datasheet: system memory 2 TB"),
    "h200": NodeMemory(2048, 8, "NVIDIA DGX H200 datasheet: system memory 2 TB"),
    "b200": NodeMemory(2048, 8, "NVIDIA DGX B200 datasheet: system memory 2 TB "
                                "(configurable to 4 TB)"),
    "gh200": NodeMemory(480, 1, "NVIDIA GH200 Grace Hopper Superchip datasheet: up to 480 GB "
                                "LPDDR5X per superchip"),
}


def host_memory_for(hardware_name: str) -> NodeMemory | None:
    """The preset's reference node, or None where no vendor figure is stated."""
    return HOST_MEMORY.get(hardware_name.lower())


def engines_per_node(tp: int, gpus_per_node: int = GPUS_PER_NODE) -> int:
    """Engines of ``tp`` GPUs that share one node (each pins its own tier): a fleet of this
    deployment packs ``gpus_per_node // tp`` of them, at least one."""
    return max(1, gpus_per_node // max(1, tp))
