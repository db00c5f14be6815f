"""The replay ``Backend`` interface and the lazy registry of backends.

Three backends replay a trace and hand back the same ``ReplayResult`` records: the CPU
twin (``sim``), vLLM's own ``Scheduler`` driven in process (``vllm-core``) and a live
``vllm serve`` (``vllm-serve``). Like Optuna's ``BaseSampler`` the interface is a couple
of abstract methods plus hooks that do nothing by default, and the call order is fixed
(see :class:`Backend`).

The registry maps a name to a factory or to a ``"module:attribute"`` path that is only
imported when the backend is asked for, so ``tuner replay --backend sim`` never imports
vLLM, and the ``vllm-core``/``vllm-serve`` modules can land (or be absent) independently.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Union

from tuner.errors import ConfigError
from tuner.progress import ProgressCallback

if TYPE_CHECKING:
    from tuner.records import ReplayResult
    from tuner.sim.settings import SchedulerSettings, SimOptions
    from tuner.trace import TraceRequest

#: ``ProgressCallback`` (``progress(fraction)``, defined in :mod:`tuner.progress`): the share
#: of the replay done so far, in [0, 1] (the twin reports the fraction of requests issued;
#: backends call it now and then, and with 1.0 at the end).


class Backend(ABC):
    """Replays one trace under one set of scheduler settings.

    Call order (every backend sees exactly this; :func:`tuner.replay.run` drives it):

    1. ``factory(**backend_options)`` builds the backend; options are backend-specific
       (e.g. ``vllm_python=`` for ``vllm-core``, ``endpoint=`` for ``vllm-serve``) and
       a factory refuses unknown ones with :class:`~tuner.errors.ConfigError`.
    2. :meth:`prepare` once, with the requests already re-blocked to the KV block size
       (``target.cache.block_size``) and validated settings. Heavy start-up (a vLLM
       driver, a server launch) belongs here, so its cost stays out of ``run``'s timing.
    3. :meth:`run` once; it returns the records the metrics read.
    4. :meth:`close` always, even when ``prepare`` or ``run`` raised: release processes,
       ports and temporary files. The default does nothing.

    A backend instance is used for one replay only; build a new one per replay.
    """

    #: Registry name (``"sim"``, ``"vllm-core"``, ``"vllm-serve"``).
    name: str = ""
    #: True if :meth:`prepare` accepts ``block_hashes``/``output_block_hashes`` as ``uint64``
    #: numpy arrays (the memory-light path, ``tuner/replay/_kv_requests.py``); otherwise
    #: they come as tuples of ints.
    accepts_array_hashes: bool = False
    #: True if :meth:`prepare` also accepts hashes interned to dense ids: an
    #: ``InternedRequests`` list (``tuner/replay/_kv_requests.py``) carrying
    #: ``num_hash_ids`` (the twin indexes its prefix cache with them).
    accepts_hash_ids: bool = False
    #: The scheduling mode :func:`tuner.replay.prepare` resolved for this replay (vLLM's
    #: ``async_scheduling`` for the target, also in ``options.async_scheduling``); set
    #: before :meth:`prepare`, copied into the result when the backend leaves it unset.
    async_scheduling: bool | None = None

    @abstractmethod
    def prepare(self, requests: Sequence["TraceRequest"], settings: "SchedulerSettings",
                target: Any, load: Any, options: "SimOptions") -> None:
        """Take the replay's inputs and get ready to run.

        Args:
            requests: trace requests in arrival order; ``block_hashes`` and
                ``output_block_hashes`` are at the KV block size ``target.cache.block_size``
                (tuples, or uint64 arrays when ``accepts_array_hashes``).
            settings: the scheduler settings to replay under (validated).
            target: the resolved deployment (``tuner.perf.presets.ResolvedTarget``: step-time
                model, cache shape, GPU count, description).
            load: ``tuner.sim.load.OpenLoop`` or ``ClosedLoop``; every backend honours both.
            options: twin options; other backends read the ones that apply
                (``record_steps``, ``async_scheduling``: the resolved mode every backend
                replays) and ignore the rest.

        Raises:
            ConfigError: the backend cannot replay this combination.
            BackendError: start-up failed.
        """

    @abstractmethod
    def run(self, progress: ProgressCallback | None = None) -> "ReplayResult":
        """Replay the prepared trace and return its records.

        Args:
            progress: called now and then with the fraction done, in [0, 1].

        Raises:
            BackendError: the replay failed part-way.
        """

    def close(self) -> None:
        """Release resources; called once after ``run`` or after a failure. No-op by default."""


BackendFactory = Callable[..., Backend]
_Entry = Union[str, BackendFactory]

#: name -> factory or "module:attribute" (imported on first use).
_REGISTRY: dict[str, _Entry] = {
    "sim": "tuner.replay._sim:SimBackend",
    "vllm-core": "tuner.vllm_core.backend:VllmCoreBackend",
    "vllm-serve": "tuner.serve.backend:VllmServeBackend",
}


def register_backend(name: str, factory: _Entry) -> None:
    """Register (or replace) a backend under ``name``.

    Args:
        name: the ``--backend`` value.
        factory: a callable returning a :class:`Backend`, or a ``"module:attribute"``
            path imported when the backend is first requested.
    """
    if isinstance(factory, str) and ":" not in factory:
        raise ValueError(f"backend path {factory!r} must look like 'package.module:Attribute'")
    _REGISTRY[name] = factory


def _load(name: str) -> BackendFactory:
    """The factory for ``name``; raises ConfigError when unknown or not importable."""
    entry = _REGISTRY.get(name)
    if entry is None:
        raise ConfigError(f"unknown backend {name!r}; available: {', '.join(available_backends())}")
    if not isinstance(entry, str):
        return entry
    module_name, attr = entry.split(":", 1)
    try:
        module = importlib.import_module(module_name)
        factory = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"backend {name!r} is not available here ({type(exc).__name__}: {exc}); "
            f"available: {', '.join(available_backends())}") from None
    _REGISTRY[name] = factory
    return factory


def available_backends() -> list[str]:
    """Names of the registered backends whose code imports in this environment."""
    names = []
    for name, entry in _REGISTRY.items():
        if isinstance(entry, str):
            module_name, attr = entry.split(":", 1)
            try:
                if not hasattr(importlib.import_module(module_name), attr):
                    continue
            except ImportError:
                continue
        names.append(name)
    return names


def create_backend(name: str, **backend_options: Any) -> Backend:
    """Build the backend registered as ``name`` with its options."""
    factory = _load(name)
    try:
        backend = factory(**backend_options)
    except TypeError as exc:
        raise ConfigError(f"backend {name!r} rejected its options "
                          f"{sorted(backend_options)}: {exc}") from None
    if not isinstance(backend, Backend):
        raise TypeError(f"backend factory for {name!r} returned {type(backend).__name__}, "
                        "not a tuner.replay.Backend")
    return backend
