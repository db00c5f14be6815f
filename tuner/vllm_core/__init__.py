"""The ``vllm-core`` backend: replays through vLLM's own ``Scheduler`` in a vLLM Python.

Two sides: :mod:`tuner.vllm_core.backend` (tuner's environment) starts
:mod:`tuner.vllm_core.driver` in the Python that has vLLM installed and reads back its
``ReplayResult``; the driver runs vLLM's scheduler as a ``tuner.sim.loop.StepEngine`` on
the replay loop the twin uses. :mod:`tuner.vllm_core.tokens` turns trace block hashes
into token ids (the live-server client uses the same ids).

The driver and ``tokens`` are plain Python, so this package imports nothing at import
time: ``tuner.vllm_core.VllmCoreBackend`` and friends load on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.vllm_core.backend import (DEFAULT_MODEL_DIR, VllmCoreBackend, find_vllm_python,
                                         run_driver, vllm_version)

_LAZY = {name: "tuner.vllm_core.backend" for name in (
    "DEFAULT_MODEL_DIR", "VllmCoreBackend", "find_vllm_python", "run_driver", "vllm_version")}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tuner.vllm_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
