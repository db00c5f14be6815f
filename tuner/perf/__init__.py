"""tuner.perf: the clock of the twin (how long a step takes on the target deployment).

Everything the scheduler twin (``tuner.sim``) does not need to make vLLM's decisions but
the replay needs to put times on them. Three wings:

* **the deployment inputs**: what the user names and what it resolves to (``target``:
  the ``Target``; ``hardware`` and ``models``: GPU and model presets or files;
  ``dtypes``: vLLM's quantization and KV-cache dtype names; ``capacity``: the KV blocks
  vLLM would allocate; ``presets``: ``resolve_target``, which turns a ``Target`` into a
  step-time model, a KV-cache shape and a GPU count);
* **the clock**: the per-kernel step-time model (``step_time``) and its parts
  (``linear_attention``, ``expert_parallel``; ``measured`` and ``measured_grid`` for
  NVIDIA's measured kernel tables);
* **the fits** (``tuner.perf.fit``): the coefficient record and where its values come
  from (the shipped fit to published serving rows, a real server's probes, a user's
  benchmark CSV).

Like ``tuner.sim`` it stays plain Python plus PyYAML (and NumPy for the fits only): the
step-time model is pickled into the vLLM-core driver, which runs inside a vLLM
environment without polars, optuna or click. The names below are importable from
``tuner.perf`` directly and load on first use (so ``import tuner.perf.step_time`` pulls
in nothing else).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner._lazy import lazy_getattr

if TYPE_CHECKING:
    from tuner.perf.capacity import KVCapacity, kv_capacity
    from tuner.perf.fit.calibration_file import Calibration, load_calibration, save_calibration
    from tuner.perf.fit.coefficients import Coefficients, GemmCoefficients
    from tuner.perf.fit.published import default_coefficients
    from tuner.perf.fit.to_benchmarks import fit_benchmarks
    from tuner.perf.fit.to_probes import StepTimeFit, fit_step_time
    from tuner.perf.hardware import HardwareSpec, list_hardware, load_hardware
    from tuner.perf.models import ModelSpec, list_models, load_model
    from tuner.perf.presets import ResolvedTarget, default_scheduler_settings, resolve_target
    from tuner.perf.step_time import RooflineStepTimeModel, StepTimeModel
    from tuner.perf.target import Target

_LAZY = {
    "Target": "tuner.perf.target",
    "ResolvedTarget": "tuner.perf.presets",
    "resolve_target": "tuner.perf.presets",
    "default_scheduler_settings": "tuner.perf.presets",
    "HardwareSpec": "tuner.perf.hardware",
    "list_hardware": "tuner.perf.hardware",
    "load_hardware": "tuner.perf.hardware",
    "ModelSpec": "tuner.perf.models",
    "list_models": "tuner.perf.models",
    "load_model": "tuner.perf.models",
    "KVCapacity": "tuner.perf.capacity",
    "kv_capacity": "tuner.perf.capacity",
    "StepTimeModel": "tuner.perf.step_time",
    "RooflineStepTimeModel": "tuner.perf.step_time",
    "Coefficients": "tuner.perf.fit.coefficients",
    "GemmCoefficients": "tuner.perf.fit.coefficients",
    "default_coefficients": "tuner.perf.fit.published",
    "Calibration": "tuner.perf.fit.calibration_file",
    "load_calibration": "tuner.perf.fit.calibration_file",
    "save_calibration": "tuner.perf.fit.calibration_file",
    "StepTimeFit": "tuner.perf.fit.to_probes",
    "fit_step_time": "tuner.perf.fit.to_probes",
    "fit_benchmarks": "tuner.perf.fit.to_benchmarks",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY, globals())
