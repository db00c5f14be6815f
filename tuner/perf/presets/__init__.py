"""Presets: turn a :class:`~tuner.perf.target.Target` into what the twin runs with.

``resolve_target`` loads the hardware and model presets (or files), applies dtype
overrides and a calibration file, builds the step-time model, and sizes the KV cache
the way vLLM would on that deployment (or takes ``Target.num_gpu_blocks``).

Data files live beside this module: ``hardware/<name>.yaml`` and
``models/<name>.json`` (Hugging Face ``config.json`` files, see ``models/SOURCES.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.errors import ConfigError
from tuner.perf.fit.calibration_file import Calibration, load_calibration, save_calibration
from tuner.perf.capacity import KVCapacity, kv_capacity, num_gpu_blocks
from tuner.perf.hardware import HardwareSpec, list_hardware, load_hardware
from tuner.perf.models import ModelSpec, list_models, load_model
from tuner.sim.settings import CacheSettings, SchedulerSettings
from tuner.perf.fit.coefficients import Coefficients

if TYPE_CHECKING:
    from tuner.sim.kv_connector.settings import OffloadSettings
from tuner.perf.fit.published import default_coefficients
from tuner.perf.step_time import RooflineStepTimeModel, StepTimeModel
from tuner.perf.target import Target
from tuner.vllm_compat import resolve_async_scheduling

__all__ = [
    "Calibration", "Coefficients", "HardwareSpec", "KVCapacity", "ModelSpec",
    "ResolvedTarget", "default_scheduler_settings", "kv_capacity", "list_hardware",
    "list_models", "load_calibration", "load_hardware", "load_model", "num_gpu_blocks",
    "resolve_target", "save_calibration",
]


@dataclass(frozen=True, slots=True)
class ResolvedTarget:
    """A ``Target`` made concrete: the pieces one replay engine needs."""

    target: Target  # what the user asked for
    hardware: HardwareSpec
    model: ModelSpec  # with Target's dtype overrides applied
    step_time: StepTimeModel  # per engine (one TP group)
    cache: CacheSettings  # per engine: block size, num_gpu_blocks, prefix caching, max_model_len
    num_gpus: int  # tp x dp x replicas
    default_settings: SchedulerSettings  # ``vllm serve`` defaults on this GPU
    description: str  # one line for logs and reports
    capacity: KVCapacity | None = None  # the memory budget behind cache (None if overridden)
    #: what priced the steps: "analytic", or "aic (<system> vLLM <version>)" (measured tables)
    step_time_source: str = "analytic"

    @property
    def tp(self) -> int:
        return self.target.tp

    @property
    def dp(self) -> int:
        return self.target.dp

    @property
    def async_scheduling(self) -> bool:
        """The engine's scheduling mode, as vLLM 0.33.0 resolves ``target.async_scheduling``
        on this GPU's platform (``tuner.vllm_compat.resolve_async_scheduling``)."""
        return resolve_async_scheduling(self.target.async_scheduling,
                                        platform=self.hardware.vllm_platform)
    def replicas(self) -> int:
        return self.target.replicas

    @property
    def kv_offload(self) -> "OffloadSettings | None":
        """The CPU KV tier ``--kv-offloading-size`` asks for (None: none), sized and
        timed for this GPU (``tuner.perf.host_link``)."""
        t = self.target
        if t.kv_offloading_size is None:
            return None
        if t.num_engines > 1:
            raise ConfigError("--kv-offloading-size with --dp or --replicas > 1: the CPU "
                              "tier is modelled for one engine only (docs/kv-offloading.md)")
        from tuner.perf.host_link import offload_settings

        return offload_settings(
            size_gib=t.kv_offloading_size, backend=t.kv_offloading_backend,
            policy=t.kv_offloading_eviction_policy,
            blocks_per_chunk=t.kv_offloading_blocks_per_chunk,
            hardware_name=self.hardware.name, tp=t.tp,
            bytes_per_block=int(self.cache.block_size * self.model.kv_bytes_per_token(t.tp)))


def default_scheduler_settings(hardware: str | HardwareSpec) -> SchedulerSettings:
    """``SchedulerSettings.vllm_defaults`` for the GPU's memory (batch caps by size)."""
    hw = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)
    return hw.batch_defaults()


def resolve_target(target: Target, *,
                   scheduler_settings: SchedulerSettings | None = None) -> ResolvedTarget:
    """Load presets, build the step-time model and size the KV cache for ``target``.

    ``scheduler_settings`` matter only for the activation reserve of the KV sizing
    (vLLM profiles a forward of ``max_num_batched_tokens`` tokens and a sampler run
    of ``max_num_seqs`` rows); ``None`` means vLLM's defaults for this GPU.

    Raises:
        ConfigError: unknown preset, bad file, a calibration fitted for another
            target, a model that does not fit, or a KV cache smaller than one
            ``max_model_len`` sequence (vLLM refuses to start then, too).
    """
    for name in ("tp", "dp", "replicas"):
        value = getattr(target, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r} must be a positive integer")
    hardware = load_hardware(target.hardware)
    model = load_model(target.model).with_dtypes(weight_dtype=target.weight_dtype,
                                                 kv_cache_dtype=target.kv_cache_dtype,
                                                 quantization=target.quantization)
    if target.enable_expert_parallel and not model.is_moe:
        raise ConfigError(f"--enable-expert-parallel: {model.name} is not a mixture-of-experts "
                          "model (it has no experts to shard)")
    coefficients = default_coefficients(hardware)
    if target.calibration:
        calibration = load_calibration(target.calibration)
        _check_calibration_matches(calibration, target, hardware, model)
        coefficients = calibration.applied_to(coefficients)
    step_time, source = _step_time_model(target, hardware, model, coefficients)

    block_size = target.block_size or hardware.block_size_for(model.backend_kind)
    defaults = hardware.batch_defaults()
    sched = scheduler_settings or defaults
    max_model_len = target.max_model_len or model.max_position_embeddings
    if max_model_len < 1:
        raise ConfigError(f"max_model_len={max_model_len} must be >= 1")
    capacity: KVCapacity | None = None
    if target.num_gpu_blocks is not None:
        blocks = target.num_gpu_blocks
    else:
        capacity = kv_capacity(hardware, model, target.tp, block_size,
                               target.gpu_memory_utilization,
                               max_num_batched_tokens=sched.max_num_batched_tokens,
                               max_num_seqs=sched.max_num_seqs,
                               expert_parallel_size=step_time.expert_layout.ep
                               if isinstance(step_time, RooflineStepTimeModel) else 1)
        blocks = capacity.num_gpu_blocks
        if capacity.num_tokens < max_model_len:
            raise ConfigError(
                f"max_model_len={max_model_len} needs {max_model_len} KV tokens but "
                f"{model.name} on {target.tp}x {hardware.name} has room for "
                f"{capacity.num_tokens}; pass a smaller --max-model-len, a larger --tp or "
                "--gpu-memory-utilization (vLLM refuses to start here too)")
    if target.clock is not None:  # the robust check's replays (tuner.tune.robust)
        from tuner.perf.clock_variant import with_variant

        step_time = with_variant(step_time, target.clock)
    cache = CacheSettings(block_size=block_size, num_gpu_blocks=blocks,
                          enable_prefix_caching=True, max_model_len=max_model_len)
    cache.validate()
    tokens = (blocks - 1) * block_size
    description = (
        f"{model.name} ({_weights(model)} weights, {model.kv_dtype} KV) on "
        f"{target.num_gpus}x {hardware.display_name} (TP{target.tp} x DP{target.dp}"
        + (f" x {target.replicas} replicas" if target.replicas > 1 else "")
        + (", EP" if target.enable_expert_parallel and model.is_moe else "") + "), "
        f"{hardware.backend_for(model.backend_kind)} block {block_size}, {blocks:,} blocks = {tokens / 1e6:.2f}M tokens/engine"
        + (" (override)" if capacity is None else "")
        + (", calibrated" if target.calibration else "")
        + f", step time: {source}"
        + ("" if target.clock is None or target.clock.nominal
           else f" (clock variant: {target.clock.describe()})"))
    return ResolvedTarget(target=target, hardware=hardware, model=model, step_time=step_time,
                          cache=cache, num_gpus=target.num_gpus, default_settings=defaults,
                          description=description, capacity=capacity,
                          step_time_source=source)


def _step_time_model(target: Target, hardware: HardwareSpec, model: ModelSpec,
                     coefficients: Coefficients) -> tuple[StepTimeModel, str]:
    """The step-time model for ``target.step_time_source`` and the source that priced it
    (``analytic``, or ``aic (<system> vLLM <version>)``).

    ``auto`` takes aiconfigurator-core's measured tables when the package is installed,
    they cover the GPU and model (:func:`tuner.perf.measured.aic_coverage`) and no
    calibration file is given (a calibration fits the analytic model to a real server);
    otherwise the analytic model. ``aic`` refuses, in one line, what ``auto`` falls back from.
    """
    from tuner.perf import measured

    wanted = (target.step_time_source or "auto").lower()
    if wanted not in measured.STEP_TIME_SOURCES:
        raise ConfigError(f"step_time_source={wanted!r}: use one of "
                          f"{', '.join(measured.STEP_TIME_SOURCES)}")
    if wanted != "analytic":
        why = measured.aic_coverage(hardware, model)
        if why is None and not measured.aic_available():
            why = "aiconfigurator-core is not installed: pip install -e '.[aic]'"
        if why is None and target.calibration and wanted == "auto":
            why = "a calibration file prices the analytic model"
        if why is None:
            try:  # a shape the tables lack surfaces only when the engine is asked
                tables = measured.aic_tables(hardware.name, model, target.tp, dp=target.dp,
                                             expert_parallel=target.enable_expert_parallel)
            except ConfigError as exc:
                why = str(exc)
            else:
                step = measured.MeasuredStepTimeModel(
                    hardware, model, target.tp, coefficients, tables, dp=target.dp,
                    expert_parallel=target.enable_expert_parallel)
                return step, f"aic ({step.tables_source})"
        if wanted == "aic":
            raise ConfigError(f"--step-time-source aic: {why}")
    return RooflineStepTimeModel(hardware, model, target.tp, coefficients, dp=target.dp,
                                 expert_parallel=target.enable_expert_parallel), "analytic"


def _same_name(a: str, b: str) -> bool:
    def norm(x: str) -> str:
        p = Path(x.strip().lower())
        if p.name in ("config.json",):
            p = p.parent
        return p.stem if p.suffix in (".json", ".yaml", ".yml") else p.name

    return norm(a) == norm(b)


def _check_calibration_matches(cal: Calibration, target: Target, hardware: HardwareSpec,
                               model: ModelSpec) -> None:
    """Coefficients fitted on another GPU, model or TP would silently mislead."""
    where = target.calibration
    if not (_same_name(cal.hardware, target.hardware) or _same_name(cal.hardware, hardware.name)):
        raise ConfigError(f"{where}: field 'hardware' is {cal.hardware!r} but the target "
                          f"hardware is {target.hardware!r}; calibrate for this GPU")
    if not (_same_name(cal.model, target.model) or _same_name(cal.model, model.name)):
        raise ConfigError(f"{where}: field 'model' is {cal.model!r} but the target model is "
                          f"{target.model!r}; calibrate for this model")
    if cal.tp != target.tp:
        raise ConfigError(f"{where}: field 'tp' is {cal.tp} but the target runs tp="
                          f"{target.tp}; calibrate for this tensor-parallel size")



def _weights(model: ModelSpec) -> str:
    """``fp8`` or, where experts differ from the rest, ``bf16+fp4 experts``."""
    if model.is_moe and model.expert_weight_dtype != model.weight_dtype:
        return f"{model.weight_dtype}+{model.expert_weight_dtype} experts"
    return model.weight_dtype
