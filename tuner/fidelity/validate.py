"""Predicted (the twin) against measured (a real ``vllm serve``), per configuration.

``tuner validate`` replays the baseline and a profile on the server and on the twin and
prints both side by side with the error of the prediction; ``confirm_on_server`` does the
same for the tuner's Pareto finalists (``tuner tune --confirm-top K``).

Layering (tests/test_layering.py): ``tuner.fidelity`` sits downstream of ``tuner.metrics``,
so replays are summarised with :func:`tuner.metrics.summarize` unless a caller passes its
own ``summarize``; it is upstream of ``tuner.profile``, so a profile arrives loaded
(anything with ``.scheduler`` and ``.pareto_settings()``).

Like for like: when any compared configuration needs the scheduler plugin (a non-zero
cache-aware-admission window on vLLM <= 0.33, which runs synchronous scheduling), every
launched server of the comparison gets ``--no-async-scheduling``, so the comparison
measures the settings, not the scheduling mode. Each configuration gets its own fresh
server (an empty prefix cache), one after the other.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import BackendError, ConfigError
from tuner.metrics import summarize as summarize_replay
from tuner.perf.api_server import replay_api_server
from tuner.replay import TraceLike, run
from tuner.serve.client import ServerDiedError
from tuner.serve.server import ServerOptions
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.settings import SchedulerSettings
from tuner.perf.target import Target

#: Summary fields compared, in print order (all "lower is better" except the rates).
COMPARED: tuple[str, ...] = (
    "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "itl_p50_s", "itl_p90_s",
    "e2e_p90_s", "p90_interactivity", "output_throughput_per_gpu", "total_throughput_per_gpu",
    "prefix_cache_hit_rate", "preemptions", "num_finished")

Summarize = Callable[[Any], Any]


@dataclass(slots=True)
class Comparison:
    """One configuration: twin prediction, server measurement, relative error."""

    name: str  # "baseline", "profile", "pareto-1", ...
    settings: SchedulerSettings
    predicted: dict[str, float]
    measured: dict[str, float]
    error_pct: dict[str, float]  # 100 * (predicted - measured) / measured (nan if measured is 0)
    status: str = "ok"  # "ok", or "error" when the server run failed (measured is partial/empty)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "settings": self.settings.to_dict(),
                "predicted": self.predicted, "measured": self.measured,
                "error_pct": self.error_pct, "status": self.status, "notes": self.notes}


def _pick(summary: Any) -> dict[str, float]:
    return {k: float(getattr(summary, k)) for k in COMPARED if hasattr(summary, k)}


def _errors(predicted: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    out = {}
    for k, m in measured.items():
        p = predicted.get(k, math.nan)
        out[k] = 100.0 * (p - m) / m if m and math.isfinite(m) and math.isfinite(p) else math.nan
    return out


def _check_reachable(name: str, url: str, timeout_s: float = 10.0) -> None:
    """Fail fast when an attach-mode server does not answer ``GET /health``."""
    import asyncio

    from tuner.serve.http import Endpoint, HttpError, get

    try:
        status, _ = asyncio.run(asyncio.wait_for(get(Endpoint.parse(url), "/health"), timeout_s))
    except (HttpError, OSError, ValueError, asyncio.TimeoutError) as exc:
        raise BackendError(f"{name} server at {url} does not answer "
                           f"({str(exc) or 'no answer in %.0f s' % timeout_s}); start it, or "
                           "use --launch to start one per configuration") from None
    if status != 200:
        raise BackendError(f"{name} server at {url}: GET /health answered {status}")


def compare_on_server(configs: Sequence[tuple[str, SchedulerSettings]], trace: TraceLike, *,
                      server: ServerOptions, target: Target,
                      summarize: Summarize = summarize_replay,
                      load: OpenLoop | ClosedLoop | None = None,
                      endpoints: dict[str, str] | None = None, thread_outputs: bool = False,
                      progress: Callable[[str], None] | None = None) -> list[Comparison]:
    """Replay each named configuration on the twin and on a real server.

    Args:
        configs: ``(name, settings)`` pairs, compared in order.
        trace: the trace (path, ``Trace`` or requests).
        server: launch options (one fresh server per configuration) or, for attach mode,
            a template whose ``endpoint`` is overridden per name by ``endpoints``.
        target: the deployment the twin models (use the calibration of this server).
        summarize: ``ReplayResult`` -> summary with the :data:`COMPARED` fields
            (default :func:`tuner.metrics.summarize`).
        load: open loop (default) or closed loop, the same for both sides.
        endpoints: attach mode: configuration name -> URL of a server already running
            with those settings. A name without an endpoint is predicted only.
        thread_outputs: thread real outputs into the next turn (server side only).
        progress: called with one line per finished side.

    Returns:
        One :class:`Comparison` per configuration; a failed server run is kept with
        ``status="error"`` (and the partial measurement when the server died).
    """
    say = progress or (lambda _m: None)
    if endpoints is None and not server.launches:
        endpoints = {name: str(server.endpoint) for name, _ in configs[:1]}
    for name, url in (endpoints or {}).items():
        _check_reachable(name, url)  # seconds, before minutes of twin replays
    if server.launches and server.async_scheduling is None and any(
            s.cache_aware_admission_window > 0 for _, s in configs):
        server = dataclasses.replace(server, async_scheduling=False)
    out: list[Comparison] = []
    for name, settings in configs:
        twin = run(trace, settings, backend="sim", target=target, load=load)
        # the client's view, as the server's is: the twin's engine behind the API server
        # (tuner.perf.api_server; a caller's own summarize gets the replay alone)
        predicted = _pick(summarize_replay(twin, api_server=replay_api_server(target, "sim"))
                          if summarize is summarize_replay else summarize(twin))
        say(f"{name}: twin done")
        notes: list[str] = []
        status = "ok"
        if server.launches:
            opts: ServerOptions | None = server
        elif endpoints and name in endpoints:
            opts = dataclasses.replace(server, endpoint=endpoints[name])
        else:
            opts = None
        measured: dict[str, float] = {}
        if opts is None:
            status, notes = "predicted-only", ["no server for this configuration"]
        else:
            try:
                result = run(trace, settings, backend="vllm-serve", target=target, load=load,
                             server=opts, thread_outputs=thread_outputs)
                measured = _pick(summarize(result))
                notes = list(result.notes)
            except ServerDiedError as exc:
                status, notes = "error", [str(exc).splitlines()[0], *exc.partial.notes]
                measured = _pick(summarize(exc.partial))
            except BackendError as exc:
                status, notes = "error", [str(exc).splitlines()[0]]
            say(f"{name}: server {status}")
        out.append(Comparison(name=name, settings=settings, predicted=predicted,
                              measured=measured, error_pct=_errors(predicted, measured),
                              status=status, notes=notes))
    return out


def validate(profile: Any, trace: TraceLike, *, server: ServerOptions, target: Target,
             summarize: Summarize = summarize_replay,
             baseline: SchedulerSettings | None = None,
             load: OpenLoop | ClosedLoop | None = None,
             endpoints: dict[str, str] | None = None, thread_outputs: bool = False,
             progress: Callable[[str], None] | None = None) -> list[Comparison]:
    """``tuner validate``: baseline and profile, predicted against measured.

    Args:
        profile: a loaded ``tuner.profile.Profile`` (its ``.scheduler`` is replayed).
        baseline: the settings to compare against (default: vLLM's defaults for the
            target, as ``tuner replay`` uses).
        endpoints: attach mode, ``{"profile": URL, "baseline": URL}`` (either may be missing).
    """
    from tuner.perf.presets import resolve_target

    if baseline is None:
        baseline = resolve_target(target).default_settings
    configs = [("baseline", baseline), ("profile", profile.scheduler)]
    if endpoints is None and not server.launches:
        endpoints = {"profile": str(server.endpoint)}
    return compare_on_server(configs, trace, server=server, target=target, summarize=summarize,
                             load=load, endpoints=endpoints, thread_outputs=thread_outputs,
                             progress=progress)


def confirm_on_server(profile_or_pareto_settings: Any, trace: TraceLike,
                      server_options: ServerOptions, *, target: Target,
                      summarize: Summarize = summarize_replay, top_k: int | None = None,
                      load: OpenLoop | ClosedLoop | None = None, thread_outputs: bool = False,
                      progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Re-run the twin's finalists on a real server: predicted against measured.

    Args:
        profile_or_pareto_settings: a ``Profile`` (its stored Pareto set, or its chosen
            settings when the set is empty), or a sequence of ``SchedulerSettings`` /
            dicts with a ``"settings"`` mapping (the tune result's Pareto points), best first.
        trace: the trace the finalists were tuned on (or its held-out part).
        server_options: launch options (one fresh server per finalist); an attach-mode
            ``endpoint`` is refused, because one running server has one set of settings.
        target: the deployment the twin modelled.
        summarize: as in :func:`compare_on_server` (default :func:`tuner.metrics.summarize`).
        top_k: confirm only the first K finalists.

    Returns:
        One dict per finalist: ``name``, ``settings``, ``predicted``, ``measured``,
        ``error_pct`` (per compared metric), ``status`` and ``notes``.
    """
    if not server_options.launches:
        raise ConfigError("confirming several finalists needs --launch (a server per "
                          "configuration); an --endpoint has only its own settings")
    settings = _finalists(profile_or_pareto_settings)
    if top_k is not None:
        settings = settings[:top_k]
    if not settings:
        raise ConfigError("no finalists to confirm (empty Pareto set)")
    configs = [(f"pareto-{i + 1}", s) for i, s in enumerate(settings)]
    rows = compare_on_server(configs, trace, server=server_options, target=target,
                             summarize=summarize, load=load, thread_outputs=thread_outputs,
                             progress=progress)
    return [r.to_dict() for r in rows]


def _finalists(obj: Any) -> list[SchedulerSettings]:
    if hasattr(obj, "pareto_settings") and hasattr(obj, "scheduler"):
        return list(obj.pareto_settings()) or [obj.scheduler]
    if isinstance(obj, SchedulerSettings):
        return [obj]
    out = []
    for item in obj:
        if isinstance(item, SchedulerSettings):
            out.append(item)
        elif isinstance(item, dict) and isinstance(item.get("settings"), dict):
            out.append(SchedulerSettings.from_dict(item["settings"]))
        elif isinstance(item, dict):
            out.append(SchedulerSettings.from_dict(item))
        elif hasattr(item, "settings"):
            out.append(item.settings)
        else:
            raise ConfigError(f"cannot read scheduler settings from {type(item).__name__}")
    return out
