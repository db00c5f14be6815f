"""Calibration files: step-time coefficients fitted for one (GPU, model, TP).

``tuner calibrate`` (a later stage) fits :class:`~tuner.perf.step_time.Coefficients`
against step times measured on a real vLLM server and writes them here;
``Target.calibration`` points the twin at the file. Layout (YAML)::

    hardware: mi355x              # preset name or hardware YAML it was fitted on
    model: llama-3.1-70b          # preset name or config path
    tp: 8
    coefficients:                 # any subset of Coefficients' fields; the rest keep
      weight_bw_eff: 0.77         # their defaults
      mfu_prefill: 0.52
      step_overhead_s: 0.00031
    fit:                          # free-form provenance, kept verbatim
      vllm_version: 0.33.0
      num_steps: 4210
      rmse_ms: 0.41

Every error names the file and the field (``ConfigError``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import ConfigError
from tuner.loaders import load_yaml
from tuner.outputs import write_text
from tuner.perf.fit.coefficients import Coefficients


@dataclass(frozen=True, slots=True)
class Calibration:
    """Coefficients plus what they were fitted for."""

    hardware: str  # hardware preset name (or YAML path) the fit used
    model: str  # model preset name (or config path) the fit used
    tp: int  # tensor-parallel size of the fit (step times depend on it)
    coefficients: Coefficients  # the file's values over the generic defaults
    fit: dict[str, Any] = field(default_factory=dict)  # provenance: data, error, version
    #: the coefficients exactly as the file gives them (a subset): ``resolve_target``
    #: lays them over the target GPU's own defaults, not over the generic ones
    overrides: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "model": self.model, "tp": self.tp,
                "coefficients": self.overrides or self.coefficients.to_dict(),
                "fit": dict(self.fit)}

    def applied_to(self, base: Coefficients) -> Coefficients:
        """``base`` (the GPU's defaults) with this file's coefficients laid over it."""
        return Coefficients.from_dict(self.overrides or self.coefficients.to_dict(),
                                      base=base, source="calibration")


def load_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration YAML.

    Raises:
        ConfigError: missing/unreadable file, invalid YAML, missing or invalid field;
            the message starts with the path and names the field.
    """
    p = Path(path).expanduser()
    data = load_yaml(p, "calibration file").data
    return calibration_from_dict(data, source=str(p))


def calibration_from_dict(data: Any, *, source: str = "calibration") -> Calibration:
    """Validate a parsed calibration mapping (see the module docstring)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a calibration file must hold a mapping with hardware, "
                          "model, tp and coefficients")
    for key in ("hardware", "model"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ConfigError(f"{source}: field {key!r} must be a non-empty string, "
                              f"got {data.get(key)!r}")
    tp = data.get("tp")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"{source}: field 'tp' must be a positive integer, got {tp!r}")
    coeffs = data.get("coefficients")
    if not isinstance(coeffs, dict):
        raise ConfigError(f"{source}: field 'coefficients' must be a mapping of coefficient "
                          f"names to numbers, got {coeffs!r}")
    coefficients = Coefficients.from_dict(coeffs, source=source)
    fit = data.get("fit", {}) or {}
    if not isinstance(fit, dict):
        raise ConfigError(f"{source}: field 'fit' must be a mapping, got {fit!r}")
    unknown = sorted(set(data) - {"hardware", "model", "tp", "coefficients", "fit"})
    if unknown:
        raise ConfigError(f"{source}: unknown top-level field(s) {unknown}; expected "
                          "hardware, model, tp, coefficients, fit")
    return Calibration(hardware=data["hardware"], model=data["model"], tp=tp,
                       coefficients=coefficients, fit=fit, overrides=dict(coeffs))


def save_calibration(path: str | Path, calibration: Calibration) -> Path:
    """Write ``calibration`` as YAML atomically (temp file in the same folder, rename)."""
    return write_text(path, yaml.safe_dump(calibration.to_dict(), sort_keys=False), mode=0o644)
