"""Replay a trace on a backend: the CPU twin (``sim``), vLLM's ``Scheduler``
(``vllm-core``) or a live ``vllm serve`` (``vllm-serve``, in :mod:`tuner.serve`).

Public API::

    result = tuner.replay.run("trace.parquet", settings, target=Target(...))
    summary = tuner.metrics.summarize(result)

Backends implement :class:`Backend` (call order in its docstring) and are found through
a lazy registry (:func:`register_backend`, :func:`available_backends`).

Request loading has one owner, this package: :func:`load_requests` (the records in
arrival order), :func:`reblock_request` (one record at the KV block size) and
:func:`intern_requests` (the whole trace at the KV block size with dense hash ids, an
:class:`InternedRequests` that :func:`run` replays as it is, so a caller replaying many
windows interns once). Other packages use these names, never the private modules.
"""

from __future__ import annotations

from tuner.replay._backend import (
    Backend,
    ProgressCallback,
    available_backends,
    create_backend,
    register_backend,
)
from tuner.replay._disagg import pd_pools, prefill_settings
from tuner.replay._ideal import IdealHitRate, ideal_hit_rate
from tuner.replay._kv_requests import InternedRequests, dense_hash_ids
from tuner.replay._run import (TraceLike, intern_requests, load_requests, prepare,
                               reblock_request, run, run_prepared)
from tuner.replay._settings import parse_settings

__all__ = [
    "Backend",
    "IdealHitRate",
    "InternedRequests",
    "ProgressCallback",
    "TraceLike",
    "available_backends",
    "create_backend",
    "dense_hash_ids",
    "ideal_hit_rate",
    "intern_requests",
    "load_requests",
    "parse_settings",
    "pd_pools",
    "prefill_settings",
    "prepare",
    "reblock_request",
    "register_backend",
    "run",
    "run_prepared",
]
