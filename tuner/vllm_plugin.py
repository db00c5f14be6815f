"""``--scheduler-cls tuner.vllm_plugin.CacheAwareScheduler``: PR #54625 for released vLLM.

A thin re-export of :mod:`tuner.profile.vllm_plugin` under a short, stable import path.
Like that module it imports only vLLM and the standard library, so a ``vllm serve``
process can load it without tuner's other dependencies. See docs/vllm-plugin.md.
"""

from tuner.profile.vllm_plugin import (  # noqa: F401
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
