"""Replay a trace on a backend: the CPU twin (``sim``), vLLM's ``Scheduler``
(``vllm-core``) or a live ``vllm serve`` (``vllm-serve``, in :mod:`tuner.serve`).

Public API::

    result = tuner.replay.run("trace.parquet", settings, target=Target(...))
    summary = tuner.metrics.summarize(result)

Backends implement :class:`Backend` (call order in its docstring) and are found through
a lazy registry (:func:`register_backend`, :func:`available_backends`).
"""

from __future__ import annotations

from tuner.replay._backend import (
    Backend,
    ProgressCallback,
    available_backends,
    create_backend,
    register_backend,
)
from tuner.replay._ideal import IdealHitRate, ideal_hit_rate
from tuner.replay._run import load_requests, prepare, reblock_request, run
from tuner.replay._settings import parse_settings

__all__ = [
    "Backend",
    "IdealHitRate",
    "ProgressCallback",
    "available_backends",
    "create_backend",
    "ideal_hit_rate",
    "load_requests",
    "parse_settings",
    "prepare",
    "reblock_request",
    "register_backend",
    "run",
]
