"""Disaggregated prefill and decode: pools of twin engines and vLLM's NIXL connector.

* :mod:`tuner.sim.disagg.settings`: ``PDSettings`` (the P:D shape, the transfer figures).
* :mod:`tuner.sim.disagg.nixl`: the scheduler side of vLLM 0.33.0's
  ``NixlPullConnectorScheduler``, one connector per role, through the twin's connector
  interface (``tuner.sim.kv_connector.base``).
* :mod:`tuner.sim.disagg.nixl_push`: the push variant (``NixlPushConnectorScheduler``,
  ``PDSettings.variant == "push"``): the prefill instance writes, on its own link.
* :mod:`tuner.sim.disagg.engines`: prefill and decode instances (fleet engines).
* :mod:`tuner.sim.disagg.routers`: the proxy's prefill and decode choices (vLLM's example
  proxy, llm-d's P/D scheduler, Dynamo's KV router), ``PD_ROUTERS`` by name.
* :mod:`tuner.sim.disagg.loop`: the fleet loop with two pools and the proxy's flow.
* :mod:`tuner.sim.disagg.simulator`: ``PDSimulator``, the replay, and its TTFT split.

docs/disaggregation.md describes the model and what it leaves out.
"""

from tuner.sim.disagg.routers import PD_ROUTERS, PDRouter, PDView, make_pd_router
from tuner.sim.disagg.settings import PDSettings

__all__ = ["PD_ROUTERS", "PDRouter", "PDSettings", "PDView", "make_pd_router"]
