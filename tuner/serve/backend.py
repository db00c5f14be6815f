"""The ``vllm-serve`` backend: replay a trace against a real ``vllm serve`` (ground truth).

Two ways to get a server (:class:`~tuner.serve.server.ServerOptions`):

* launch: ``vllm_python=`` + ``model=`` start ``python -m vllm.entrypoints.openai.api_server``
  with the replay's scheduler settings as flags (on vLLM <= 0.33 a non-zero
  cache-aware-admission window goes through ``tuner.vllm_plugin`` via ``--scheduler-cls``),
  prefix caching on, a free port and a log file; the server is stopped after the replay,
  on Ctrl-C and at interpreter exit, its whole process group included;
* attach: ``endpoint=`` replays against a running server; its settings are its own, and
  the cache config visible in ``/metrics`` is checked against the replay's block size.

The records are the same ``ReplayResult`` every backend produces, so
``tuner.metrics.summarize`` reads them unchanged; what a client cannot observe is listed
in ``tuner/serve/client.py`` and docs/ground-truth.md.

Example::

    result = tuner.replay.run("trace.parquet", settings, backend="vllm-serve",
                              target=Target(model="tests/data/tiny-llama", block_size=32,
                                            num_gpu_blocks=512, hardware="..."),
                              server=ServerOptions(vllm_python=PY, model="tests/data/tiny-llama",
                                                   load_format="dummy"))
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuner import vllm_compat
from tuner.errors import ConfigError
from tuner.replay import Backend, ProgressCallback
from tuner.serve.client import ReplayPlan, ServerDiedError, ServerReplay, prompt_tokens
from tuner.serve.server import ServerOptions, VllmServer
from tuner.sim.load import ClosedLoop, OpenLoop

if TYPE_CHECKING:
    from tuner.records import ReplayResult
    from tuner.sim.settings import SchedulerSettings, SimOptions
    from tuner.trace import TraceRequest

__all__ = ["ServerDiedError", "ServerOptions", "VllmServeBackend", "VllmServer",
           "prompt_tokens", "replay_on_server"]


class VllmServeBackend(Backend):
    """Replays on a live server; see the module docstring.

    Args:
        server: how to launch or reach the server (``ServerOptions``); keyword shortcuts
            ``endpoint=``, ``vllm_python=``, ``model=`` ... build one.
        thread_outputs: feed each turn's real output into the next turn's prompt.
        running: an already started :class:`VllmServer` to reuse (not stopped by close).
    """

    name = "vllm-serve"

    def __init__(self, server: ServerOptions | None = None, *, thread_outputs: bool = False,
                 running: VllmServer | None = None, **server_fields: Any) -> None:
        known = {f.name for f in dataclasses.fields(ServerOptions)}
        unknown = sorted(set(server_fields) - known)
        if unknown:
            raise ConfigError(f"vllm-serve: unknown option(s) {unknown}; known: "
                              f"{', '.join(sorted(known | {'server', 'thread_outputs', 'running'}))}")
        if server is None and not server_fields and running is None:
            options = options_from_env()
        else:
            options = server or ServerOptions()
        if server_fields:
            options = dataclasses.replace(options, **server_fields)
        if running is None and (options.model or not options.launches):
            options.validate()  # else once prepare() has filled the model from the target
        self.options = options
        self.thread_outputs = thread_outputs
        self._running = running
        self.server: VllmServer | None = running
        self._plan: ReplayPlan | None = None
        self._notes: list[str] = []

    def prepare(self, requests: Sequence["TraceRequest"], settings: "SchedulerSettings",
                target: Any, load: Any, options: "SimOptions") -> None:
        cache = target.cache
        o = self.options
        if o.launches and self._running is None:
            if not o.model and os.path.exists(str(target.target.model)):
                o = dataclasses.replace(o, model=str(target.target.model))  # a config folder
            o.validate()
            # The server's KV shape follows the target unless the options say otherwise.
            if o.async_scheduling is None:  # the engine the replay resolved for the target
                o = dataclasses.replace(o, async_scheduling=options.async_scheduling)
            o = dataclasses.replace(
                o, block_size=o.block_size or cache.block_size, tp=target.tp if o.tp == 1 else o.tp,
                num_gpu_blocks=o.num_gpu_blocks or getattr(target.target, "num_gpu_blocks", None),
                max_model_len=o.max_model_len or getattr(target.target, "max_model_len", None))
            if o.block_size != cache.block_size:
                raise ConfigError(f"server block size {o.block_size} != the replay's KV block "
                                  f"size {cache.block_size}: pass --block-size to both")
            self.options = o
            self.async_scheduling = o.async_scheduling
            self.server = VllmServer(o).start(settings)
            self._notes.append(f"vllm serve {self.server.vllm_version} launched in "
                               f"{self.server.startup_s:.1f} s (log {self.server.log_path})")
        elif self.server is None:
            self.async_scheduling = None  # an attached server's mode is its own
            self.server = VllmServer(o).start(settings)
            self._notes += self.server.check_settings(settings, cache.block_size)
        elif self._running.options.launches:  # reused: the mode it was launched with
            self.async_scheduling = self._running.options.async_scheduling
        self._notes += self.server.notes
        self._plan = ReplayPlan(requests=list(requests), block_size=cache.block_size,
                                load=load if isinstance(load, (OpenLoop, ClosedLoop)) else OpenLoop(),
                                num_gpus=int(getattr(target, "num_gpus", 1)),
                                thread_outputs=self.thread_outputs,
                                use_priority=settings.policy == "priority")

    def run(self, progress: ProgressCallback | None = None) -> "ReplayResult":
        assert self._plan is not None and self.server is not None, "prepare() first"
        try:
            result = ServerReplay(self.server, self._plan, progress).run()
        except ServerDiedError as exc:
            exc.partial.notes[:0] = self._notes
            raise
        result.notes[:0] = self._notes
        return result

    def close(self) -> None:
        """Stop the server this backend launched (a reused or attached one is left running)."""
        if self.server is not None and self.server is not self._running:
            self.server.stop()


def options_from_env() -> ServerOptions:
    """Server options for ``--backend vllm-serve`` without explicit options.

    ``$TUNER_VLLM_ENDPOINT`` attaches to that URL; otherwise the server is launched with
    ``$TUNER_VLLM_PYTHON`` (or ``$TUNER_VLLM032_PYTHON``) and the target's model when that
    is a path (a ``config.json`` folder is served with ``--load-format dummy``).
    """
    endpoint = os.environ.get("TUNER_VLLM_ENDPOINT")
    if endpoint:
        return ServerOptions(endpoint=endpoint)
    python = vllm_compat.vllm_python_from_env("serve")
    return ServerOptions(vllm_python=python, load_format="dummy")


def replay_on_server(server: VllmServer, requests: Sequence["TraceRequest"], *,
                     block_size: int, load: OpenLoop | ClosedLoop | None = None,
                     num_gpus: int = 1, thread_outputs: bool = False,
                     progress: ProgressCallback | None = None) -> "ReplayResult":
    """Replay ``requests`` (hashes at ``block_size``) on a started server, without
    launching or stopping anything (calibration, validation and tests share one server)."""
    plan = ReplayPlan(requests=list(requests), block_size=block_size, load=load or OpenLoop(),
                      num_gpus=num_gpus, thread_outputs=thread_outputs)
    return ServerReplay(server, plan, progress).run()
