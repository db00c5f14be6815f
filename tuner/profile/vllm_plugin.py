"""The vLLM scheduler plugin, seen from the ``profile`` stage (re-export).

The implementation is :mod:`tuner.vllm_plugin`, outside ``tuner.profile`` so that
``vllm serve --scheduler-cls tuner.vllm_plugin.CacheAwareScheduler`` imports only vLLM and
the standard library. Importing this module needs vLLM installed.
"""

from tuner.vllm_plugin import (  # noqa: F401
    AdmissionConfig,
    CacheAwareAdmissionMixin,
    CacheAwareAsyncScheduler,
    CacheAwareScheduler,
    UnsupportedVllmVersionError,
    check_supported,
    num_cached_tokens,
    reorder_waiting_by_cached_prefix,
    resolve_config,
    vllm_minor_version,
)

__all__ = [
    "AdmissionConfig",
    "CacheAwareAdmissionMixin",
    "CacheAwareAsyncScheduler",
    "CacheAwareScheduler",
    "UnsupportedVllmVersionError",
    "check_supported",
    "num_cached_tokens",
    "reorder_waiting_by_cached_prefix",
    "resolve_config",
    "vllm_minor_version",
]
