"""The ``sim`` backend: the CPU twin of vLLM's scheduler (``tuner.sim.engine.Simulator``).

A thin adapter: the twin already speaks ``TraceRequest`` and returns ``ReplayResult``;
this class only fits it into the :class:`~tuner.replay.Backend` call order and keeps the
twin's construction (which indexes the requests) out of the timed ``run``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuner.replay._backend import Backend, ProgressCallback

if TYPE_CHECKING:
    from tuner.records import ReplayResult
    from tuner.sim.settings import SchedulerSettings, SimOptions
    from tuner.trace import TraceRequest


class SimBackend(Backend):
    """Replays on the twin. Takes no backend options."""

    name = "sim"
    accepts_array_hashes = True  # SimRequest takes anything with tolist(), at arrival
    accepts_hash_ids = True  # interned once per trace: the twin's cache indexes arrays

    def __init__(self) -> None:
        self._simulator: Any = None

    def prepare(self, requests: Sequence["TraceRequest"], settings: "SchedulerSettings",
                target: Any, load: Any, options: "SimOptions") -> None:
        from tuner.sim.engine import Simulator

        self._simulator = Simulator(
            requests, settings, target.cache, target.step_time,
            options=options, load=load, num_gpus=target.num_gpus,
            num_hash_ids=getattr(requests, "num_hash_ids", None))

    def run(self, progress: ProgressCallback | None = None) -> "ReplayResult":
        assert self._simulator is not None, "SimBackend.run() called before prepare()"
        return self._simulator.run(progress=progress)
