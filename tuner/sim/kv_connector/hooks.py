"""The scheduler's connector hooks, kept here so ``tuner.sim.scheduler`` only calls them
(one line each) and a replay without a connector never reaches this module's code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from tuner.sim.kv_connector.offloading import OffloadingConnector

if TYPE_CHECKING:
    from tuner.sim.kv_connector.settings import OffloadSettings
    from tuner.sim.request import SimRequest

    from tuner.sim.scheduler_output import SchedulerOutput
    from tuner.sim.settings import CacheSettings

__all__ = ["connector_has_work", "connector_update", "empty_wait_s", "make_connector",
           "wait_for_transfers"]


def make_connector(settings: "OffloadSettings | None",
                   cache: "CacheSettings") -> OffloadingConnector | None:
    """The connector ``SimOptions.kv_offload`` asks for (None: none). ``lmcache`` runs the
    same pool and link as ``native``: a modelled capacity tier, not LMCache's own code."""
    if settings is None:
        return None
    return OffloadingConnector(settings, block_size=cache.block_size,
                               enable_prefix_caching=cache.enable_prefix_caching)


def kv_cache_manager_class(options: Any) -> type:
    """``KVCacheManager``, or with a connector under async scheduling the one that defers
    frees behind in-flight steps (vLLM's ``defer_block_free``: ``block_fence``)."""
    if options.kv_offload is not None and options.async_scheduling:
        from tuner.sim.kv_connector.block_fence import FencedKVCacheManager
        return FencedKVCacheManager
    from tuner.sim.kv_cache_manager import KVCacheManager
    return KVCacheManager


def connector_has_work(scheduler: Any) -> bool:
    """``has_requests`` with a connector: requests waiting for KV count, and so do
    requests finished since the last step (their last stores are built next step, as
    vLLM steps once more for ``finished_req_ids``)."""
    connector = scheduler.connector
    return (bool(scheduler.running) or bool(scheduler.waiting) or bool(scheduler.kv_holding)
            or bool(connector is not None and connector._finished_ids))


def connector_update(scheduler: Any,
                     update: Callable[["SchedulerOutput", float, dict[float, int]],
                                      "list[SimRequest]"],
                     out: "SchedulerOutput", now_s: float,
                     gaps: dict[float, int]) -> "list[SimRequest]":
    """``update_from_output`` with a connector: the step's outputs, then
    ``request_finished`` for each finished request and the worker's finished transfers
    (``_update_from_kv_xfer_finished``). Under async scheduling the deferred block
    frees whose step this update processes drain first (``block_fence``)."""
    if scheduler.fenced:
        scheduler.kv_cache_manager.step_processed(out)
    finished = update(out, now_s, gaps)
    connector = scheduler.connector
    assert connector is not None
    for request in finished:
        connector.request_finished(request)
    recving = connector.update_connector_output(now_s)
    if recving:
        scheduler.finished_recving |= recving
    return finished


def wait_for_transfers(scheduler: Any, now_s: float, next_arrival_s: float) -> float:
    """GPU seconds of an empty step: until the next transfer ends or the next request
    arrives, whichever is first (vLLM spins through empty steps meanwhile).

    An arrival already due (``next_arrival_s <= now_s``) is one the load holds back (a
    closed loop at its concurrency: it comes only when a request finishes), so it does
    not end the wait: counting it made every empty step last 0 s, the clock stood still
    at a transfer's start and the replay never ended (a closed loop whose waiting
    requests need the blocks a load in flight holds)."""
    connector = scheduler.connector
    assert connector is not None
    return empty_wait_s(connector.next_event_s(now_s), now_s, next_arrival_s)


def empty_wait_s(next_event_s: float, now_s: float, next_arrival_s: float) -> float:
    """The wait rule of :func:`wait_for_transfers` (vLLM's side, ``tuner.vllm_core.
    offloading``, applies the same one): until the next transfer ends or the next
    arrival still to come."""
    arrival = next_arrival_s if next_arrival_s > now_s else float("inf")
    return max(0.0, min(next_event_s, arrival) - now_s)
