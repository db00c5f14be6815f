"""A live ``vllm serve``: launch or attach, drive it with a trace, read its ``/metrics``.

Modules, one job each:

* :mod:`tuner.serve.server` -- :class:`ServerOptions` and :class:`VllmServer`: launch a
  server with a replay's settings as flags (or attach to a running one) and always stop
  what was launched, its whole process group included;
* :mod:`tuner.serve.client` -- :class:`ServerReplay`: the streaming replay, open or closed
  loop, one ``/v1/completions`` stream per request;
* :mod:`tuner.serve.http` -- the minimal asyncio HTTP/1.1 client both of them use;
* :mod:`tuner.serve.prometheus` -- the ``/metrics`` text-exposition parser and deltas;
* :mod:`tuner.serve.api_cost` -- the API server's CPU cost per request and token, measured
  on a launched server (the costs the twin's API server layer charges);
* :mod:`tuner.serve.backend` -- the ``vllm-serve`` replay backend
  (``tuner.replay.run(..., backend="vllm-serve", server=ServerOptions(...))``).

The names below are loaded on first use, so ``import tuner.serve`` costs nothing until a
server is wanted (the registry in ``tuner.replay`` imports the backend the same way).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner._lazy import lazy_getattr

if TYPE_CHECKING:
    from tuner.serve.backend import VllmServeBackend, options_from_env, replay_on_server
    from tuner.serve.client import ReplayPlan, ServerDiedError, ServerReplay
    from tuner.serve.prometheus import MetricsSnapshot, parse_exposition
    from tuner.serve.server import ServerOptions, VllmServer, settings_args

_LAZY = {
    "ServerOptions": "tuner.serve.server",
    "VllmServer": "tuner.serve.server",
    "settings_args": "tuner.serve.server",
    "ServerDiedError": "tuner.serve.client",
    "ServerReplay": "tuner.serve.client",
    "ReplayPlan": "tuner.serve.client",
    "VllmServeBackend": "tuner.serve.backend",
    "replay_on_server": "tuner.serve.backend",
    "options_from_env": "tuner.serve.backend",
    "MetricsSnapshot": "tuner.serve.prometheus",
    "parse_exposition": "tuner.serve.prometheus",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY, globals())
