"""The ``sim`` backend: the CPU twin of vLLM's scheduler (``tuner.sim.engine.Simulator``).

A thin adapter: the twin already speaks ``TraceRequest`` and returns ``ReplayResult``;
this class only fits it into the :class:`~tuner.replay.Backend` call order and keeps the
twin's construction (which indexes the requests) out of the timed ``run``.

One engine (``dp = replicas = 1``) runs the single-engine ``Simulator`` (unchanged, and
not slowed); a data-parallel deployment or a fleet runs ``tuner.sim.fleet``'s
``FleetSimulator`` with the backend option ``router`` (a ``RouterSettings``; a profile's
or a study's dict form is read into one where it is loaded, not here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuner.replay._backend import Backend, ProgressCallback

if TYPE_CHECKING:
    from tuner.records import ReplayResult
    from tuner.sim.fleet import RouterSettings
    from tuner.sim.settings import SchedulerSettings, SimOptions
    from tuner.trace import TraceRequest


class SimBackend(Backend):
    """Replays on the twin. Option ``router``: the fleet's router (see the module doc)."""

    name = "sim"
    accepts_array_hashes = True  # SimRequest takes anything with tolist(), at arrival
    accepts_hash_ids = True  # interned once per trace: the twin's cache indexes arrays

    def __init__(self, router: "RouterSettings | None" = None, pd: Any = None) -> None:
        from tuner.sim.fleet import RouterSettings

        if router is None:
            router = RouterSettings()
        elif not isinstance(router, RouterSettings):
            raise TypeError(f"router {router!r}: expected RouterSettings (read a dict form "
                            "with RouterSettings.from_dict where it is loaded)")
        self.router: RouterSettings = router
        self.pd = pd  # a tuner.perf.pd_link.PDLayout: disaggregated pools (tuner.replay._disagg)
        self._simulator: Any = None

    @property
    def streams_fleets(self) -> bool:
        """Whether a fleet replay may stream the trace (``tuner.replay._stream``): behind
        every router (the prefix-aware one's block counts are renumbered with the engines'
        ids), but not a P/D replay behind dynamo (its KV router per pool)."""
        return self.streams_pd

    @property
    def streams_pd(self) -> bool:
        """Whether this backend's one-engine-looking replay may stream: not a P/D replay
        behind the dynamo router (its KV router per pool indexes hash ids)."""
        return self.pd is None or getattr(self.pd, "router", "") != "dynamo"

    def prepare(self, requests: Sequence["TraceRequest"], settings: "SchedulerSettings",
                target: Any, load: Any, options: "SimOptions") -> None:
        from tuner.sim.engine import Simulator

        deployment = target.target
        if self.pd is not None:
            from tuner.replay._disagg import pd_simulator

            self._simulator = pd_simulator(requests, settings, target, load, options, self.pd)
            return
        if deployment.num_engines > 1:
            from tuner.sim.fleet.simulator import FleetSimulator

            self._simulator = FleetSimulator(
                requests, settings, target.cache, target.step_time,
                dp=deployment.dp, replicas=deployment.replicas, moe=target.model.is_moe,
                router=self.router, options=options, load=load, num_gpus=target.num_gpus,
                num_hash_ids=getattr(requests, "num_hash_ids", None))
            return
        self._simulator = Simulator(
            requests, settings, target.cache, target.step_time,
            options=options, load=load, num_gpus=target.num_gpus,
            num_hash_ids=getattr(requests, "num_hash_ids", None))

    @property
    def simulator(self) -> Any:
        """The prepared simulator (a ``Simulator``, ``FleetSimulator`` or ``PDSimulator``):
        a check that watches its engines (``tuner.fidelity.pd_parity``) hooks them before
        ``run``."""
        assert self._simulator is not None, "SimBackend.simulator before prepare()"
        return self._simulator

    def run(self, progress: ProgressCallback | None = None) -> "ReplayResult":
        assert self._simulator is not None, "SimBackend.run() called before prepare()"
        return self._simulator.run(progress=progress)
