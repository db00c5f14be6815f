"""How far the twin's predictions are from vLLM: parity, calibrate, validate.

* :mod:`tuner.fidelity.parity` -- ``tuner fidelity``: the twin against vLLM's own
  ``Scheduler`` (the ``vllm-core`` backend), step by step;
* :mod:`tuner.fidelity.calibrate` -- ``tuner calibrate``: time probe batches on a live
  server and fit the step-time model's coefficients;
* :mod:`tuner.fidelity.validate` -- ``tuner validate`` / ``tuner tune --confirm-top``:
  replay configurations on the twin and on a real server, predicted against measured.
* :mod:`tuner.fidelity.runs` -- what the commands decide before measuring, for notebooks:
  :func:`calibrate_server` (a calibration server's settings and scheduling mode) and
  :func:`twin_options_for` (the twin's options matching an installed vLLM).

This package sits downstream of ``tuner.serve`` and ``tuner.metrics``
(tests/test_layering.py), so it drives servers and summarises replays itself. The names
below are loaded on first use: importing the package starts nothing and imports no
server code. The functions ``calibrate`` and ``validate`` share their modules' names, so
they are not re-exported here (a package attribute cannot be both); import them from
their modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner._lazy import lazy_getattr

if TYPE_CHECKING:
    from tuner.fidelity.calibrate import CalibrationResult, ProbePlan
    from tuner.fidelity.parity import ParityReport, compare_steps, run_parity, run_parity_many
    from tuner.fidelity.runs import calibrate_server, probe_settings, twin_options_for
    from tuner.fidelity.validate import Comparison, compare_on_server, confirm_on_server

_LAZY = {
    "ParityReport": "tuner.fidelity.parity",
    "compare_steps": "tuner.fidelity.parity",
    "run_parity": "tuner.fidelity.parity",
    "run_parity_many": "tuner.fidelity.parity",
    "ProbePlan": "tuner.fidelity.calibrate",
    "CalibrationResult": "tuner.fidelity.calibrate",
    "Comparison": "tuner.fidelity.validate",
    "compare_on_server": "tuner.fidelity.validate",
    "confirm_on_server": "tuner.fidelity.validate",
    "calibrate_server": "tuner.fidelity.runs",
    "probe_settings": "tuner.fidelity.runs",
    "twin_options_for": "tuner.fidelity.runs",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY, globals())
