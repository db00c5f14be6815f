"""What the fleet loop needs from an engine beyond the single-engine ``StepEngine``.

A fleet engine also answers the questions the deployment's front ends ask (vLLM's DP
load balancer reads the rank's published ``(waiting, running, kv usage)``; a KV-aware
router reads the rank's KV events and sees a response's first token), reports which
requests finished in a step (the router and the balancer count in-flight requests), and
in a lockstep MoE group takes the group's DP step counter and records dummy steps.

``FleetTwinEngine`` is the twin's ``TwinEngine`` with those calls; the vLLM-core driver
has its own (``tuner.vllm_core.dp_driver``).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from tuner.records import RequestTable
from tuner.sim.engine import TwinEngine
from tuner.sim.loop import StepEngine
from tuner.sim.request import SimRequest
from tuner.sim.scheduler import Scheduler
from tuner.sim.settings import SimOptions

__all__ = ["FleetEngine", "FleetTwinEngine", "cached_prefix_blocks"]


class FleetEngine(StepEngine, Protocol):
    """A :class:`~tuner.sim.loop.StepEngine` that can serve in a fleet."""

    num_added: int  # requests given to it (add_request)
    num_dummy_steps: int  # lockstep steps it ran without work of its own

    def request_counts(self) -> tuple[int, int, float]:
        """``(waiting, running, kv_usage)`` now: what the rank publishes to the DP
        coordinator (vLLM ``get_request_counts`` and ``get_kv_cache_usage``)."""

    def cached_prefix_blocks(self, source: Any) -> int:
        """Leading KV blocks of ``source``'s prompt held in this engine's prefix cache
        (what a router following its KV events knows)."""

    def has_first_token(self, index: int) -> bool:
        """Whether request ``index`` (given to this engine) has produced its first token
        (streamed back to the router); True once it finished."""

    def take_finished(self) -> list[int]:
        """Trace positions of the requests finished since the last call."""

    def align_step_counter(self, counter: int) -> None:
        """Lockstep: the DP group's step counter before this step (vLLM
        ``DPEngineCoreProc.step_counter``, which the prefill throttle reads)."""

    def dummy_step(self, start_s: float, duration_s: float) -> None:
        """Lockstep: a dummy batch ran from ``start_s`` (nothing of its own to run)."""


def cached_prefix_blocks(first_holder: np.ndarray, hashes: Any) -> int:
    """Length of the leading run of ``hashes`` (dense ids) that has a cached block."""
    ids = np.asarray(hashes, dtype=np.int64)
    if ids.size == 0:
        return 0
    missing = (first_holder[ids] < 0).nonzero()[0]
    return int(missing[0]) if missing.size else int(ids.size)


class FleetTwinEngine(TwinEngine):
    """The twin's engine as one engine of a fleet (see the module doc)."""

    def __init__(self, scheduler: Scheduler, block_size: int, options: SimOptions,
                 table: RequestTable) -> None:
        super().__init__(scheduler, block_size, options, table)
        self.num_added = 0
        self.num_dummy_steps = 0
        self._finished: list[int] = []

    def add_request(self, index: int, source: Any, arrival_s: float, *,
                    prompt_only: bool = False) -> None:
        super().add_request(index, source, arrival_s, prompt_only=prompt_only)
        self.num_added += 1

    def _record(self, request: SimRequest, status: Any) -> None:
        super()._record(request, status)
        if status == "finished":
            self._finished.append(request.index)

    def request_counts(self) -> tuple[int, int, float]:
        scheduler = self.scheduler
        return (len(scheduler.waiting), len(scheduler.running),
                scheduler.kv_cache_manager.usage)

    def cached_prefix_blocks(self, source: Any) -> int:
        pool = self.scheduler.kv_cache_manager.block_pool
        return cached_prefix_blocks(pool.first_holder, source.block_hashes)

    def has_first_token(self, index: int) -> bool:
        request = self.live.get(index)
        if request is None:  # finished: callers ask only about requests it was given
            return True
        return request.first_token_s == request.first_token_s  # not nan

    def take_finished(self) -> list[int]:
        out, self._finished = self._finished, []
        return out

    def align_step_counter(self, counter: int) -> None:
        self.scheduler.dp_step_counter = counter

    def dummy_step(self, start_s: float, duration_s: float) -> None:
        self.num_dummy_steps += 1
