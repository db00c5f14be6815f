"""Many engines: vLLM data parallelism inside a deployment, and fleets behind a router.

* :mod:`tuner.sim.fleet.router`: ``RouterSettings`` and the routers in front of
  ``replicas`` copies of a deployment.
* :mod:`tuner.sim.fleet.dp_balancer`: vLLM 0.33.0's internal DP load balancer (the API
  server's choice of a DP rank from the coordinator's stale counts).
* :mod:`tuner.sim.fleet.loop`: one time-ordered loop over many ``StepEngine``s, dense
  ranks independent, MoE ranks in lockstep (waves, dummy batches).
* :mod:`tuner.sim.fleet.simulator`: ``FleetSimulator``, the twin's fleet replay.

Plain Python, like the rest of ``tuner.sim``.
"""

from tuner.sim.fleet.router import (ROUTER_PARAMS, ROUTER_POLICIES, RouterParam,
                                    RouterSettings, make_router)

__all__ = ["ROUTER_PARAMS", "ROUTER_POLICIES", "RouterParam", "RouterSettings", "make_router"]
