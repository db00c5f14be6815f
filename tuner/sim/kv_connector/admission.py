"""The waiting loop with a KV connector: vLLM 0.33.0's ``schedule()`` 1049-1616 with the
connector branches the plain loop (``Scheduler._schedule_waiting``) leaves out.

Why a second loop: the plain loop is the twin's hottest admission code and has no
connector; this one runs only when a connector is configured, so replays without one
pay nothing and keep their records. What it adds (scheduler.py @ 0.33.0):

* the ``kv_holding`` queue (``kv_holding_waiting``), drained before ``waiting``: requests
  that hold blocks while their KV loads (``WAITING_FOR_REMOTE_KVS``); a skipped one goes
  back to its front;
* ``_handle_blocked_waiting_request``: a loading request is skipped until its load is
  reported (``finished_recving``), then ``_update_waiting_for_remote_kv`` registers its
  blocks and, for a whole-sequence hit, recomputes the last token;
* ``get_num_new_matched_tokens`` after the local prefix hit; ``None`` skips the request
  this step (a deferred lookup); an async load allocates the local and external tokens'
  blocks without registering them (``delay_cache_blocks``), keeping the blocks that
  in-flight prefills still need free (``_inflight_prefill_reserved_blocks``), calls
  ``update_state_after_alloc`` and parks the request in ``kv_holding``;
* the connector's query/hit counters beside the local ones.

The rest is the plain loop line for line (async re-admission gate, prefill deferral,
chunking, head-of-line blocking, the cache-aware reorder runs before it as usual).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.sim._step_rules import blocks_needed, clamp_new_tokens
from tuner.sim.request import RequestStatus

if TYPE_CHECKING:
    from tuner.sim.request import SimRequest

    from tuner.sim.scheduler_output import SchedulerOutput

__all__ = ["schedule_waiting_with_connector"]

_WAITING = RequestStatus.WAITING
_PREEMPTED = RequestStatus.PREEMPTED
_RUNNING = RequestStatus.RUNNING
_NO_BLOCKS = np.empty(0, dtype=np.int64)


def _reserved_blocks(scheduler: Any, skipped: "list[SimRequest]") -> int:
    """``_inflight_prefill_reserved_blocks``: blocks in-flight prefills (running prefill
    chunks and loading requests) still need to hold their whole sequence. ``skipped``:
    the loading requests this step's loop has set aside (they go back to ``kv_holding``
    at its end, but vLLM's ``_inflight_prefills`` holds them all along)."""
    bs = scheduler.block_size
    max_len = scheduler.max_model_len
    total = 0
    for request in scheduler.running:
        if request.is_prefill_chunk:
            total += max(0, blocks_needed(min(request.num_tokens, max_len),
                                          request.num_blocks, bs))
    for queue in (scheduler.kv_holding, skipped):
        for request in queue:
            total += max(0, blocks_needed(min(request.num_tokens, max_len),
                                          request.num_blocks, bs))
    return total


def _promote(scheduler: Any, request: "SimRequest") -> None:
    """``_update_waiting_for_remote_kv``: the load arrived; register the blocks."""
    scheduler.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
    if request.num_computed_tokens == request.num_tokens:
        request.num_computed_tokens = request.num_tokens - 1
    scheduler.finished_recving.discard(request.request_id)
    scheduler.loading.discard(request.request_id)
    request.status = _PREEMPTED if request.num_preemptions else _WAITING


def schedule_waiting_with_connector(scheduler: Any, out: "SchedulerOutput",
                                    token_budget: int, threshold: int, defer: bool) -> bool:
    """Admit waiting requests with the connector consulted; True if a prefill was admitted."""
    connector = scheduler.connector
    assert connector is not None
    waiting, holding, running = scheduler.waiting, scheduler.kv_holding, scheduler.running
    kvm = scheduler.kv_cache_manager
    chunked = scheduler.settings.enable_chunked_prefill
    full_fit = scheduler.settings.scheduler_reserve_full_isl
    prefill_admitted = False
    skipped_waiting: list["SimRequest"] = []
    skipped_holding: list["SimRequest"] = []

    def skip(queue: Any, request: "SimRequest") -> None:
        queue.pop_request()
        scheduler.deferred_waiting.add(request)
        (skipped_holding if request.num_blocks else skipped_waiting).append(request)

    while token_budget > 0:
        queue = holding if holding else waiting
        if not queue:
            break
        if len(running) >= scheduler.max_num_running_reqs:
            break
        request = queue.peek_request()
        if request.request_id in scheduler.loading:
            if request.request_id not in scheduler.finished_recving:
                skip(queue, request)
                continue
            _promote(scheduler, request)
        if request.num_stale_output_tokens:
            skip(queue, request)
            continue
        load_async = False
        num_external = 0
        if request.num_computed_tokens == 0:
            hit_blocks, num_local = kvm.get_computed_blocks(request)
            ext, load_async = connector.get_num_new_matched_tokens(request, num_local)
            if ext is None:
                skip(queue, request)
                continue
            num_external = ext
            num_computed = num_local + num_external
            fresh = True
        else:  # a load arrived: the KV is there, nothing to look up
            hit_blocks, num_local = _NO_BLOCKS, 0
            num_computed = request.num_computed_tokens
            fresh = False
        if load_async:
            num_new = 0
        else:
            needs_prefill = num_computed < request.num_tokens - 1
            if defer and needs_prefill:
                break
            num_new = clamp_new_tokens(request.num_tokens - num_computed, threshold,
                                       token_budget, chunked)
            if num_new <= 0:
                break
        if load_async:
            ok = kvm.allocate_slots(request, num_external, num_local, hit_blocks,
                                    full_sequence_must_fit=full_fit,
                                    has_scheduled_reqs=bool(running),
                                    reserved_blocks=_reserved_blocks(scheduler, skipped_holding),
                                    delay_cache_blocks=True)
        else:  # every external hit loads asynchronously (sync_load_budget_bytes = 0)
            ok = kvm.allocate_slots(request, num_new, num_local, hit_blocks,
                                    full_sequence_must_fit=full_fit,
                                    has_scheduled_reqs=bool(running))
        if not ok:
            break
        if load_async:
            connector.update_state_after_alloc(request, num_external)
        if fresh:  # the stats of an admission that allocated (1463-1507)
            connector.count_query(request, num_local)
            kvm.unwatch(request)
            if request.num_preemptions == 0:
                scheduler.prefix_cache_queries += request.num_tokens
                scheduler.prefix_cache_hits += num_local
        if load_async:
            request.num_computed_tokens = num_computed
            scheduler.loading.add(request.request_id)
            skip(queue, request)
            continue
        queue.pop_request()
        scheduler.deferred_waiting.discard(request)
        running.append(request)
        request.seq = scheduler._next_seq
        scheduler._next_seq += 1
        if scheduler.group is not None:  # the fast path's running non-members
            scheduler.group.admitted(request)
        request.status = _RUNNING
        request.num_computed_tokens = num_computed
        out.individual.append((request, num_new))
        # The local (GPU) hit, as the plain loop records it; CPU hits are the connector's.
        out.admitted.append((request, num_local if fresh else connector.local_hit(request)))
        out.total_num_scheduled_tokens += num_new
        token_budget -= num_new
        if num_computed < request.num_tokens - 1:
            prefill_admitted = True
        if num_computed + num_new < request.num_tokens:
            # vLLM adds it to _inflight_prefills now (1593): the next admission's
            # reservation counts it (``_reserved_blocks``); _update_after_schedule
            # sets the same value at the end of the step.
            request.is_prefill_chunk = True
    if skipped_holding:
        holding.prepend_requests(skipped_holding)
    if skipped_waiting:
        waiting.prepend_requests(skipped_waiting)
    return prefill_admitted
