"""The two roles of a twin engine in a P:D deployment (``tuner.sim.fleet.engines``' fleet
engine, with the proxy's view of a request).

* :class:`PrefillEngine`: gets each request as vLLM's example proxy sends it to a
  prefill instance (``max_tokens=1``, ``kv_transfer_params.do_remote_decode``): the
  prompt, one output token. When that token is produced the request goes back to the
  proxy (a *handoff*) instead of into the records; its blocks stay held by the
  :class:`~tuner.sim.disagg.nixl.NixlPrefillConnector` until the decoder has read them.
* :class:`DecodeEngine`: gets the original request (with ``do_remote_prefill``) and the
  request's arrival time at the proxy, so its record is the user's: TTFT from the
  arrival to the decoder's first token, queueing from the arrival to the prefill
  instance's first schedule.
"""

from __future__ import annotations

from typing import Any

from tuner.records import RequestTable
from tuner.sim.disagg.nixl import NixlDecodeConnector, NixlPrefillConnector
from tuner.sim.disagg.nixl_push import NixlPushDecodeConnector, NixlPushPrefillConnector
from tuner.sim.disagg.settings import PDSettings
from tuner.sim.fleet.engines import FleetTwinEngine
from tuner.sim.request import RequestStatus, SimRequest
from tuner.sim.scheduler import Scheduler
from tuner.sim.settings import SimOptions

__all__ = ["DecodeEngine", "Handoff", "PrefillEngine", "fence_decoder",
           "replace_kv_cache_manager"]

#: ``(trace index, source, arrival at the proxy)``
Handoff = tuple[int, Any, float]


def fence_decoder(scheduler: Scheduler, num_hash_ids: int | None) -> None:
    """Give a fresh decode scheduler vLLM's deferred block frees under async scheduling.

    vLLM sets ``defer_block_free`` for a ``kv_consumer`` connector when batches overlap
    (v1/core/sched/scheduler.py:189-195 @ 0.33.0): a freed request's blocks wait for its
    last in-flight step, so a read cannot land in blocks a step still writes. The
    decoder's connector is attached after the scheduler chose its manager (the plain
    one without a CPU tier), so the fenced one (``tuner.sim.kv_connector.block_fence``)
    replaces it here, before anything is allocated. A prefill instance is a
    ``kv_producer``: it frees at once, as the plain manager does.
    """
    from tuner.sim.kv_connector.block_fence import FencedKVCacheManager

    replace_kv_cache_manager(scheduler, FencedKVCacheManager, num_hash_ids)
    scheduler.fenced = True


def replace_kv_cache_manager(scheduler: Any, cls: type, num_hash_ids: int | None) -> Any:
    """Swap a fresh scheduler's ``KVCacheManager`` for a ``cls`` one over the same cache
    (a pool engine's role-specific manager: the decoder's fenced frees, the prefill
    instance's held blocks), keeping the mode-dependent fields the scheduler set on the
    old one; before anything is allocated or bound. Returns the new manager."""
    cache, old = scheduler.cache, scheduler.kv_cache_manager
    kvm = cls(num_gpu_blocks=cache.num_gpu_blocks, block_size=cache.block_size,
              enable_caching=cache.enable_prefix_caching, max_model_len=cache.max_model_len,
              watermark=scheduler.settings.watermark, num_hash_ids=num_hash_ids)
    kvm.register_on_free = old.register_on_free
    kvm.num_lookahead_tokens = old.num_lookahead_tokens
    scheduler.kv_cache_manager = kvm
    return kvm


class _PoolEngine(FleetTwinEngine):
    """A fleet engine that also sums its GPU's busy time (the pool's utilisation)."""

    busy_s = 0.0  # seconds of steps that scheduled tokens

    def start(self, step: Any, start_s: float, duration_s: float) -> None:
        super().start(step, start_s, duration_s)
        if step[0].total_num_scheduled_tokens:
            self.busy_s += duration_s


class PrefillEngine(_PoolEngine):
    """A prefill instance (see the module doc)."""

    def __init__(self, scheduler: Scheduler, block_size: int, options: SimOptions,
                 table: RequestTable, settings: PDSettings | None = None) -> None:
        pool = scheduler.kv_cache_manager.block_pool
        if settings is not None and settings.variant == "push":  # NixlPushConnector
            scheduler.connector = NixlPushPrefillConnector(pool, settings)
        else:
            scheduler.connector = NixlPrefillConnector(pool)
        super().__init__(scheduler, block_size, options, table)
        # The scheduler's walk counts only live requests as block holders; held blocks
        # have one more, so this engine runs its own walk (check_holds) instead.
        self.check_holds, self.check = self.check, False
        self.sources: dict[int, Any] = {}  # trace index -> source, until handed off
        self._handoffs: list[Handoff] = []
        #: trace index -> (first scheduled, prefill done, cached tokens, preemptions)
        self.prefill_times: dict[int, tuple[float, float, int, int]] = {}

    def add_request(self, index: int, source: Any, arrival_s: float, *,
                    prompt_only: bool = True) -> None:
        """The request as the proxy sends it here, ``max_tokens=1``: always prompt only
        (the flag is the fleet engine's signature)."""
        self.sources[index] = source
        super().add_request(index, source, arrival_s, prompt_only=True)

    def _record(self, request: SimRequest, status: Any) -> None:
        if status != "finished":  # never reached the decoder: the prefill's outcome
            self.sources.pop(request.index, None)
            super()._record(request, status)
            return
        self._finished.append(request.index)
        self.prefill_times[request.index] = (
            request.first_scheduled_s, request.finish_s, max(0, request.num_cached_tokens),
            request.num_preemptions)
        self._handoffs.append((request.index, self.sources.pop(request.index),
                               request.arrival_s))

    def update(self, step: Any, end_s: float) -> int:
        """As the twin's; 0 finished for the loop's in-flight count (a handed-off request
        is finished for the user only when its decoder finishes it)."""
        super().update(step, end_s)
        if self.check_holds:
            self.check_invariants()
        return 0

    def check_invariants(self) -> None:
        """The block pool's invariants, and every block's ref count = its live holders
        plus one per held (read-pending) copy."""
        scheduler = self.scheduler
        pool = scheduler.kv_cache_manager.block_pool
        pool.check_invariants()
        owners: dict[int, int] = {}
        live = list(scheduler.running) + list(scheduler.waiting) + list(scheduler.kv_holding)
        for ids in [r.blocks for r in live] + [b.tolist() for b in self.connector.held()]:
            for block in ids:
                owners[block] = owners.get(block, 0) + 1
        for block in range(1, pool.num_gpu_blocks):
            assert pool.ref_cnt[block] == owners.get(block, 0), (
                f"block {block}: ref_cnt {pool.ref_cnt[block]} != holders + holds "
                f"{owners.get(block, 0)} (tuner bug)")

    def take_handoffs(self) -> list[Handoff]:
        """Requests whose prefill finished since the last call (for the proxy)."""
        out, self._handoffs = self._handoffs, []
        return out

    def read_done(self, index: int, end_s: float) -> None:
        self.connector.read_done(index, end_s)

    def finish(self) -> None:
        """The replay ended: every read has ended, so the held blocks are free."""
        self.connector.release_until(float("inf"))
        super().finish()

    def has_requests(self) -> bool:
        # push: held blocks keep the engine stepping (``has_pending_push_work``)
        return self.scheduler.has_requests() or self.connector.has_pending_work()


class DecodeEngine(_PoolEngine):
    """A decode instance (see the module doc).

    Aborts (``aborts``: trace index -> the client's abort time, shared by the pool): the
    engine core takes an abort from its input queue before its next ``schedule()``, as
    vLLM's busy loop does, so one whose time has come is applied there
    (:meth:`apply_aborts`) if the request's read was in flight at that time
    (``WAITING_FOR_REMOTE_KVS`` with the read launched); an abort at any other stage is
    not replayed (docs/disaggregation.md).
    """

    def __init__(self, scheduler: Scheduler, block_size: int, options: SimOptions,
                 table: RequestTable, settings: PDSettings, on_read: Any,
                 prefill_times: dict[int, tuple[float, float, int, int]],
                 aborts: dict[int, float] | None = None) -> None:
        kind = NixlPushDecodeConnector if settings.variant == "push" else NixlDecodeConnector
        scheduler.connector = kind(settings, on_read)
        scheduler.connector.free_blocks = lambda r: scheduler.kv_cache_manager.free(r)
        super().__init__(scheduler, block_size, options, table)
        self.prefill_times = prefill_times
        self.aborts = aborts if aborts is not None else {}
        scheduler.connector.abort_times = self.aborts  # an abort wakes an idle decoder
        self._num_aborted = 0  # since the last update (the loop's in-flight count)
        # An aborted request whose read is in flight still holds its blocks, which the
        # scheduler's walk does not know: this engine runs the walk (check_invariants).
        self.check_holds, self.check = self.check, False

    def add_request(self, index: int, source: Any, arrival_s: float) -> None:
        """A request the proxy hands off after its prefill carries ``do_remote_prefill``;
        one the router sent here alone (llm-d's decode-only decision) has no
        ``kv_transfer_params``: the decoder computes its prompt."""
        if index not in self.prefill_times:
            self.connector.compute_locally(str(source.request_id))
        super().add_request(index, source, arrival_s)

    def schedule(self, now_s: float) -> Any:
        if self.aborts:
            self.apply_aborts(now_s)
        return super().schedule(now_s)

    def apply_aborts(self, now_s: float) -> list[str]:
        """Abort every loading request whose abort time is due (class doc); returns
        their ids, in the kv_holding queue's order."""
        scheduler, connector = self.scheduler, self.connector
        aborts = self.aborts
        done: list[str] = []
        for request in list(scheduler.kv_holding):
            when = aborts.get(request.index)
            if when is None or when > now_s:
                continue
            start = connector.read_start_s.get(request.request_id)
            if start is None or start > when:
                continue  # not in transfer when the client left: not replayed
            reported = request.request_id in scheduler.finished_recving
            del aborts[request.index]
            self._abort(request, now_s, in_flight=not reported)
            done.append(request.request_id)
        return done

    def _abort(self, request: SimRequest, now_s: float, *, in_flight: bool) -> None:
        """vLLM's ``finish_requests(FINISHED_ABORTED)`` for a ``WAITING_FOR_REMOTE_KVS``
        request (v1/core/sched/scheduler.py:3014-3027 @ 0.33.0): out of the queue, its
        blocks held until the read is reported (freed at once if it already was)."""
        scheduler = self.scheduler
        scheduler.kv_holding.remove_requests([request])
        scheduler.loading.discard(request.request_id)
        request.status = RequestStatus.FINISHED
        request.finish_s = now_s
        self.connector.request_finished(request)
        self.connector.aborted(request)
        if in_flight:
            self.connector.abort(request)
        else:
            scheduler.finished_recving.discard(request.request_id)
            scheduler.kv_cache_manager.free(request)
        del self.live[request.index]
        self._record(request, "aborted")
        self._finished.append(request.index)  # the router sees the response end
        self._num_aborted += 1

    def update(self, step: Any, end_s: float) -> int:
        """As the twin's, plus the requests aborted since (out of the in-flight count)."""
        n = super().update(step, end_s)
        if self.check_holds:
            self.check_invariants()
        n, self._num_aborted = n + self._num_aborted, 0
        return n

    def check_invariants(self) -> None:
        """The scheduler's walk, with the blocks of aborted requests whose read is still
        in flight counted as held."""
        scheduler = self.scheduler
        held = list(self.connector._aborted.values())
        if not held:
            scheduler.check_invariants()
            return
        live = [*scheduler.running, *scheduler.waiting, *scheduler.kv_holding, *held]
        scheduler.kv_cache_manager.check_invariants(live)

    def _record(self, request: SimRequest, status: Any) -> None:
        first_sched, _, cached, preemptions = self.prefill_times.get(  # decode only: its own
            request.index, (request.first_scheduled_s, 0.0, max(0, request.num_cached_tokens), 0))
        self.table.record(
            request.index, status, request.arrival_s, output_len=request.num_output_tokens,
            first_scheduled_s=first_sched, first_token_s=request.first_token_s,
            finish_s=request.finish_s, num_cached_tokens=cached,
            num_preemptions=preemptions + request.num_preemptions)
        if status == "finished":
            self._finished.append(request.index)
