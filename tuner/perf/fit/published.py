"""The shipped fit to published serving results (``presets/fitted/published.yaml``).

``tuner calibrate --from-benchmarks`` writes that file (bench/calibration_fit.py
reports how well it predicts every row, in sample and leave-one-series-out). Per GPU it
holds the coefficients the fit moved away from the hardware preset's priors, and the
vLLM/ROCm/AITER versions the rows were measured with. A GPU the fit has no rows for
keeps its priors.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import ConfigError
from tuner.perf.fit.coefficients import Coefficients
from tuner.perf.hardware import HardwareSpec

FITTED_PATH = Path(__file__).parents[1] / "presets" / "fitted" / "published.yaml"


@functools.lru_cache(maxsize=4)
def load_fitted(path: str = str(FITTED_PATH)) -> dict[str, Any]:
    """The parsed fit file (``{}`` when absent); cached: it is read once per process."""
    p = Path(path)
    if not p.is_file():
        return {}
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: invalid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("hardware", {}), dict):
        raise ConfigError(f"{p}: a fit file must map 'hardware' to per-GPU entries")
    return data


def default_coefficients(hardware: HardwareSpec, *, path: str | None = None) -> Coefficients:
    """The GPU's priors with the shipped fit laid over them (the replay default)."""
    entry = load_fitted(path or str(FITTED_PATH)).get("hardware", {}).get(hardware.name)
    if not entry:
        return hardware.coefficients
    return Coefficients.from_dict(entry.get("coefficients") or {}, base=hardware.coefficients,
                                  source=f"{path or FITTED_PATH}: hardware.{hardware.name}")
