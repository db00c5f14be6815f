"""``check_scheduler_invariants``: the walk behind ``Scheduler.check_invariants``.

vLLM 0.33.0 closes ``schedule()`` with a block of asserts (scheduler.py 1620-1639); the
twin states the same rules, and the ones its fast path adds, as one walk over the
scheduler, its decode group and its KV cache. Tests call it after every step; replays run
it only under the debug flag, so it lives beside the scheduler rather than in it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tuner.sim.async_update import check_async_invariants
from tuner.sim.kv_cache_manager import KVCacheManager
from tuner.sim.request import RequestStatus, SimRequest

if TYPE_CHECKING:
    from tuner.sim.decode_group import DecodeGroup

__all__ = ["check_scheduler_invariants"]

_RUNNING = RequestStatus.RUNNING
_WAITING = RequestStatus.WAITING
_PREEMPTED = RequestStatus.PREEMPTED


class InvariantHost(Protocol):
    """What the walk reads from its scheduler (``tuner.sim.scheduler.Scheduler``); a
    protocol, so this module does not import the scheduler that calls it."""

    running: list[SimRequest]
    max_num_running_reqs: int  # max_num_seqs
    async_scheduling: bool
    deferred_waiting: set[SimRequest]

    @property
    def group(self) -> DecodeGroup | None: ...

    @property
    def kv_cache_manager(self) -> KVCacheManager: ...

    @property
    def waiting(self) -> Any: ...  # the request queue (FCFS deque or priority heap)

    @property
    def kv_holding(self) -> Any: ...  # the connector's kv_holding_waiting queue


def check_scheduler_invariants(scheduler: InvariantHost) -> None:
    """Walk the scheduler's, the group's and the cache's invariants. Reads only: group
    members are checked through the group's lag accessors, not materialised, so a
    checked replay takes exactly the path of an unchecked one."""
    group = scheduler.group
    if group is not None:
        group.check_invariants()
    live = list(scheduler.running) + list(scheduler.waiting) + list(scheduler.kv_holding)
    scheduler.kv_cache_manager.check_invariants(live)
    assert len(scheduler.running) <= scheduler.max_num_running_reqs, "running > max_num_seqs"
    for request in scheduler.waiting:
        assert request.status in (_WAITING, _PREEMPTED), f"{request!r} in waiting"
        assert request.num_blocks == 0, f"waiting {request!r} holds blocks"
    if scheduler.async_scheduling:
        check_async_invariants(scheduler, group)
    output_tokens = group.output_tokens if group is not None else _num_output_tokens
    for request in scheduler.running:
        assert request.status == _RUNNING, f"{request!r} in running"
        assert output_tokens(request) < request.max_tokens, f"{request!r} past max_tokens"


def _num_output_tokens(request: SimRequest) -> int:
    return request.num_output_tokens
