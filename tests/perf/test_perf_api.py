"""tuner.perf's public names resolve from the package, and loading the clock loads no fit."""

from __future__ import annotations

import importlib
import subprocess
import sys

import tuner.perf


def test_every_public_name_resolves_to_its_module() -> None:
    for name in tuner.perf.__all__:
        module = importlib.import_module(tuner.perf._LAZY[name])
        assert getattr(tuner.perf, name) is getattr(module, name), name


def test_the_step_time_model_loads_without_the_fits() -> None:
    """The vLLM-core driver unpickles the model: it must not drag the fitters (NumPy
    solvers, benchmark replays) or the presets in with it."""
    code = ("import sys, tuner.perf.step_time; "
            "print(sorted(m for m in sys.modules if m.startswith('tuner.perf.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    loaded = eval(out)  # noqa: S307 (our own printed list)
    assert "tuner.perf.fit.coefficients" in loaded
    assert not [m for m in loaded if m.startswith(("tuner.perf.fit.to_", "tuner.perf.presets",
                                                   "tuner.perf.fit.least_squares"))], loaded
