"""How far the twin's predictions are from vLLM: calibrate, validate (and parity).

* :mod:`tuner.fidelity.calibrate` -- ``tuner calibrate``: time probe batches on a live
  server and fit the step-time model's coefficients;
* :mod:`tuner.fidelity.validate` -- ``tuner validate`` / ``tuner tune --confirm-top``:
  replay configurations on the twin and on a real server, predicted against measured.

This package sits downstream of ``tuner.serve`` and ``tuner.metrics``
(tests/test_layering.py), so it drives servers and summarises replays itself. The names
below are loaded on first use: importing the package starts nothing and imports no
server code. The functions ``calibrate`` and ``validate`` share their modules' names, so
they are not re-exported here (a package attribute cannot be both); import them from
their modules.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ProbePlan": "tuner.fidelity.calibrate",
    "CalibrationResult": "tuner.fidelity.calibrate",
    "Comparison": "tuner.fidelity.validate",
    "compare_on_server": "tuner.fidelity.validate",
    "confirm_on_server": "tuner.fidelity.validate",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tuner.fidelity' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
