"""``tuner.replay.run``: one trace, one set of settings, one backend -> ``ReplayResult``.

This is the single entry point the CLI and the tuner share. It owns the steps every
backend needs done the same way: load the trace, resolve the deployment target, pick the
GPU's vLLM defaults when no settings are given, re-block the prefix hashes from the
trace's hash block size to the KV block size, then drive the backend through its call
order (``prepare`` -> ``run`` -> ``close``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Union

from tuner.errors import ConfigError
from tuner.progress import Progress, check_progress, fraction_callback
from tuner.replay._backend import Backend, ProgressCallback, create_backend
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.settings import SchedulerSettings, SimOptions
from tuner.perf.target import Target
from tuner.trace.reblock import reblock_request_hashes

if TYPE_CHECKING:
    from tuner.records import ReplayResult
    from tuner.replay._kv_requests import InternedRequests
    from tuner.trace import Trace, TraceRequest

TraceLike = Union["Trace", str, "os.PathLike[str]", Sequence["TraceRequest"]]


def load_requests(trace: TraceLike, *, hash_block_size: int | None = None,
                  arrays: bool = False) -> tuple[list["TraceRequest"], int | None]:
    """The trace's requests in arrival order and the block size of their hashes.

    Args:
        trace: a ``Trace``, a path to a trace (file or directory), or ``TraceRequest``s.
        hash_block_size: block size of the hashes of a plain request sequence; None
            means "already at the KV block size". Ignored for a ``Trace`` or path,
            whose metadata says it.
        arrays: a ``Trace``'s hashes as ``uint64`` views into one flat array a column
            (``tuner.replay._kv_requests.load_trace_arrays``) instead of tuples of Python
            ints: what :func:`intern_requests` reads fastest (the agentic hour's 13 M
            hashes as ints cost seconds to build and again to read back).
    """
    if isinstance(trace, (str, os.PathLike)):
        from tuner.trace import read_trace

        trace = read_trace(trace)
    if arrays and hasattr(trace, "metadata") and hasattr(trace, "lazy"):
        from tuner.replay._kv_requests import load_trace_arrays

        requests = load_trace_arrays(trace)
        size = int(trace.metadata.hash_block_size)
    elif hasattr(trace, "metadata") and hasattr(trace, "requests"):
        requests = list(trace.requests())
        size = int(trace.metadata.hash_block_size)
    else:
        requests = list(trace)
        size = hash_block_size
    requests.sort(key=lambda r: r.arrival_s)  # stable: ties keep trace order
    return requests, size


def reblock_request(request: "TraceRequest", from_block_size: int,
                    to_block_size: int) -> "TraceRequest":
    """``request`` with prompt and output block hashes at ``to_block_size`` tokens.

    Prompt: exactly ``floor(input_len / B)`` full-block hashes (vLLM hashes only full
    blocks); output: the full blocks its generated tokens complete, from KV block index
    ``floor(input_len / B)`` on (what the twin's ``SimRequest`` expects). The rules are
    :func:`tuner.trace.reblock.reblock_request_hashes`'s, shared with ``Trace.reblocked``.
    """
    if from_block_size == to_block_size and len(request.block_hashes) == (
            request.input_len // to_block_size):
        return request
    prompt, output = reblock_request_hashes(
        request.block_hashes, request.output_block_hashes, request.input_len,
        request.output_len, from_block_size, to_block_size)
    return dataclasses.replace(request, block_hashes=prompt, output_block_hashes=output)


def intern_requests(trace: TraceLike, block_size: int, *,
                    hash_block_size: int | None = None) -> "InternedRequests":
    """The trace's requests in arrival order at ``block_size`` tokens a KV block, every
    hash interned to a dense id: what the twin replays, loaded once.

    The one way to hold a trace ready for many replays (the tuner's windows, a report's
    replays): :func:`run` and :func:`prepare` replay the returned list (or a
    ``window(start, stop)`` of it) as it is. Hashes are ``uint64`` array views, never
    Python ints (``tuner.replay._kv_requests``).

    Args:
        trace: as :func:`load_requests`; an ``InternedRequests`` already at
            ``block_size`` is returned as it is.
        block_size: the KV block size (``ResolvedTarget.cache.block_size``).
        hash_block_size: as :func:`load_requests`, for a plain request sequence.

    Raises:
        ConfigError: the trace has no requests, or the block sizes do not divide.
        TraceSchemaError: the trace file is not a valid trace.
    """
    from tuner.replay._kv_requests import InternedRequests, kv_request_ids

    if isinstance(trace, InternedRequests) and trace.block_size == block_size:
        return trace
    return kv_request_ids(*_array_requests(trace, hash_block_size), block_size)


def _array_requests(trace: TraceLike, hash_block_size: int | None
                    ) -> tuple[list["TraceRequest"], int | None]:
    """:func:`load_requests` with a ``Trace``'s hashes as views into flat ``uint64``
    arrays (``tuner.replay._kv_requests.load_trace_arrays``); refuses an empty trace."""
    from tuner.replay._kv_requests import load_trace_arrays

    if isinstance(trace, (str, os.PathLike)):
        from tuner.trace import read_trace

        trace = read_trace(trace)
    if hasattr(trace, "metadata") and hasattr(trace, "lazy"):
        requests, size = load_trace_arrays(trace), int(trace.metadata.hash_block_size)
    else:
        requests, size = load_requests(trace, hash_block_size=hash_block_size)
    if not requests:
        raise ConfigError("the trace has no requests to replay")
    return requests, size


def _kv_requests(trace: TraceLike, hash_block_size: int | None, block_size: int, *,
                 arrays: bool, hash_ids: bool = False,
                 stream: bool = True) -> list["TraceRequest"]:
    """The trace's requests in arrival order, hashes re-blocked to ``block_size``.

    ``arrays``: hashes as ``uint64`` arrays through the vectorised path (memory-light, for
    backends that accept them), else tuples of ints. ``hash_ids`` (with ``arrays``):
    interned to dense ids: for a ``Trace`` (or a path) a ``TraceArrivals`` stream that
    reads and interns as the replay goes (``tuner.replay._stream``: memory follows live
    requests), else :func:`intern_requests`'s list.
    """
    if arrays:
        from tuner.replay._kv_requests import kv_requests

        if isinstance(trace, (str, os.PathLike)):
            from tuner.trace import read_trace

            trace = read_trace(trace)
        if hash_ids:
            if stream and hasattr(trace, "metadata") and hasattr(trace, "stored"):
                from tuner.replay._stream import TraceArrivals

                return TraceArrivals(trace, block_size)  # type: ignore[return-value]
            return intern_requests(trace, block_size, hash_block_size=hash_block_size)
        return kv_requests(*_array_requests(trace, hash_block_size), block_size)
    requests, size = load_requests(trace, hash_block_size=hash_block_size)
    if not requests:
        raise ConfigError("the trace has no requests to replay")
    if size is not None and size != block_size:
        requests = [reblock_request(r, size, block_size) for r in requests]
    return requests


def prepare(trace: TraceLike, settings: SchedulerSettings | None = None, *,
            backend: str = "sim", target: Target = Target(),
            load: OpenLoop | ClosedLoop | None = OpenLoop(), options: SimOptions = SimOptions(),
            hash_block_size: int | None = None, **backend_options: Any) -> Backend:
    """A backend ready to ``run()`` ``trace`` under ``settings``: the one preparation path.

    Resolves the target, picks the GPU's vLLM defaults when ``settings`` is None,
    validates the settings, resolves the scheduling mode (``target.async_scheduling``,
    None = what vLLM 0.33.0 runs on the target's platform, ``tuner.vllm_compat``) into
    ``options.async_scheduling`` (the target decides it, whatever ``options`` said), loads the trace in the form the backend accepts (re-blocked
    to the KV block size; arrays or hash ids where it takes them) and calls the backend's
    ``prepare``. :func:`run` and the parity checks (``tuner.fidelity.parity``) both come
    through here, so a twin replay and a vLLM-core replay of one case see the same inputs.
    The caller runs the backend and must ``close()`` it; on an error here it is closed.

    Arguments and errors: as :func:`run`.
    """
    from tuner.perf.presets import resolve_target

    resolved = resolve_target(target, scheduler_settings=settings)
    if settings is None:
        settings = resolved.default_settings
    settings.validate(max_model_len=resolved.cache.max_model_len)
    load = OpenLoop() if load is None else load
    options = dataclasses.replace(options, async_scheduling=resolved.async_scheduling,
                                  kv_offload=options.kv_offload or resolved.kv_offload)
    if options.speculative is not None:  # drafts: the mode vLLM allows, verify pricing
        from tuner.perf.spec_decode import spec_deployment
        resolved, options = spec_deployment(resolved, options)
    instance = create_backend(backend, **backend_options)
    instance.async_scheduling = options.async_scheduling
    try:
        requests = _kv_requests(trace, hash_block_size, resolved.cache.block_size,
                                arrays=instance.accepts_array_hashes,
                                hash_ids=instance.accepts_hash_ids,
                                stream=(resolved.target.num_engines == 1
                                        and getattr(instance, "streams_pd", True))
                                or getattr(instance, "streams_fleets", False))
        instance.prepare(requests, settings, resolved, load, options)
    except BaseException:
        instance.close()
        raise
    return instance


def run(trace: TraceLike, settings: SchedulerSettings | None = None, *, backend: str = "sim",
        target: Target = Target(), load: OpenLoop | ClosedLoop | None = OpenLoop(),
        options: SimOptions = SimOptions(),
        progress: "Progress | ProgressCallback | None" = None,
        hash_block_size: int | None = None,
        **backend_options: Any) -> "ReplayResult":
    """Replay ``trace`` under ``settings`` on ``backend`` and return its records.

    Args:
        trace: a ``Trace``, a path to one, or a sequence of ``TraceRequest``.
        settings: scheduler settings; None = vLLM's defaults for the target GPU
            (``resolve_target(target).default_settings``).
        backend: a registered backend name (``tuner.replay.available_backends()``).
        target: the deployment to model (hardware, model, TP, DP, replicas, KV cache).
        load: ``OpenLoop(speedup=...)`` (default ``OpenLoop()``: the trace's own arrival
            times; None means the same) or ``ClosedLoop(concurrency)``.
        options: twin options (``record_steps``, ``check_invariants``, ...).
        progress: a :class:`tuner.progress.Progress` sink (one stage, ``replay``, of total
            1.0), or a callback taking the fraction done in [0, 1]; None = silent.
        hash_block_size: for a plain request sequence, the block size of its hashes
            (None = already at the KV block size).
        **backend_options: passed to the backend's factory.

    Returns:
        The backend's ``ReplayResult`` (feed it to ``tuner.metrics.summarize``), its
        ``async_scheduling`` the mode replayed.

    Raises:
        ConfigError: unknown/unavailable backend, invalid settings or target, block sizes
            that do not divide one another.
        TraceSchemaError: the trace file is not a valid trace.
        BackendError: the backend failed.
    """
    instance = prepare(trace, settings, backend=backend, target=target, load=load,
                       options=options, hash_block_size=hash_block_size, **backend_options)
    return run_prepared(instance, progress)


def run_prepared(instance: Any,
                 progress: "Progress | ProgressCallback | None" = None) -> "ReplayResult":
    """The second half of :func:`run`: run a backend from :func:`prepare`, close it, and
    return its records with ``async_scheduling`` set. Callers that touch the prepared
    backend before it runs (``tuner.tune.early_stop.watch``) use the two halves."""
    try:
        if callable(progress):
            result = instance.run(progress)
        else:
            result = instance.run(fraction_callback(check_progress(progress), "replay"))
    finally:
        instance.close()
    if result.async_scheduling is None:
        result.async_scheduling = instance.async_scheduling
    return result
