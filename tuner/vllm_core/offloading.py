"""vLLM's own CPU offloading connector in the ``vllm-core`` driver, with a fake worker on
the twin's clock.

Runs inside the vLLM Python, like ``tuner.vllm_core.driver``. What is real and what is
faked:

* real: ``OffloadingConnector`` (``distributed/kv_transfer/kv_connector/v1/
  offloading_connector.py`` @ 0.33.0) in the scheduler role, so vLLM's
  ``OffloadingConnectorScheduler`` (``offloading/scheduler.py``) and
  ``CPUOffloadingManager`` with its LRU or ARC policy (``v1/kv_offload/cpu/``) decide
  every lookup, load, store and eviction; vLLM's ``Scheduler`` / ``AsyncScheduler`` (or
  the plugin's cache-aware classes) build and consult it as ``vllm serve`` does
  (``KVConnectorFactory``, role ``kv_both``);
* the pool size: ``cpu_bytes_to_use`` is chosen so vLLM's ``CPUOffloadingSpec`` computes
  exactly the twin's ``num_chunks`` over the driver's fake KV cache (whose blocks are
  128 bytes, so the size in GiB of the real deployment would not give the same count);
* faked: the worker (``OffloadingConnectorWorker`` + the CPU-GPU copies).
  :class:`FakeOffloadingWorker` reads each step's ``OffloadingConnectorMetadata`` when the
  step reaches the GPU and times its jobs as the twin's connector does
  (``tuner.sim.kv_connector.offloading``: loads start with the step, stores at its end,
  one job at a time per direction of the host link, ``OffloadSettings.transfer_s``);
  a job is reported (``OffloadingWorkerMetadata.completed_jobs``, and a load's request
  in ``finished_recving``) at the first update at or after its end. Jobs vLLM asks to
  flush (``jobs_to_flush``) keep their times: the twin does not delay a step for a
  flush either (docs/kv-offloading.md).

:class:`OffloadingFeed` also reads what the parity suite compares: vLLM's
``connector_prefix_cache_stats`` (external queries and hits of first admissions), the
manager's evictions and store failures, deferred lookups, and per step the requests
waiting in ``WAITING_FOR_REMOTE_KVS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FakeOffloadingWorker", "InsertionOrderedSet", "OffloadingFeed", "kv_transfer_config", "offloading_feed"]

_INF = float("inf")
#: vLLM's ``CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT`` (``SharedOffloadRegion``): each
#: chunk's bytes are rounded up to it.
_ALIGNMENT = 4096


def kv_transfer_config(settings: Any, page_size_bytes: int) -> Any:
    """vLLM's ``KVTransferConfig`` for ``settings`` (an ``OffloadSettings``) over blocks
    of ``page_size_bytes`` (the driver's fake KV cache): the pool gets exactly
    ``settings.num_chunks`` chunks (``cpu/spec.py``: ``cpu_bytes_to_use //
    round_up(bytes per chunk, 4096)``)."""
    from vllm.config import KVTransferConfig

    if isinstance(settings, KVTransferConfig):  # built already (the P/D driver's NIXL one)
        return settings
    chunk = -(-page_size_bytes * settings.blocks_per_chunk // _ALIGNMENT) * _ALIGNMENT
    return KVTransferConfig(
        kv_connector="OffloadingConnector", kv_role="kv_both", engine_id="tuner",
        kv_connector_extra_config={"cpu_bytes_to_use": settings.num_chunks * chunk,
                                   "eviction_policy": settings.policy,
                                   "blocks_per_chunk": settings.blocks_per_chunk})


class InsertionOrderedSet(set):
    """A ``set`` that iterates in insertion order.

    Why: vLLM's connector walks ``SchedulerOutput.finished_req_ids``, a plain set of
    request ids, to build the finished requests' last stores and to commit their cache
    accesses (``on_request_finished``), and the policies' order depends on that walk
    (LRU recency, ARC's T2 order). A set of str iterates in an order Python's hash seed
    picks, so vLLM itself differs from run to run there. The driver gives the scheduler
    this set instead, so the walk is the order the requests finished in, which is the
    order the twin uses (``tuner.sim.kv_connector.offloading``).
    """

    __slots__ = ("_order",)

    def __init__(self, items: Any = ()) -> None:
        super().__init__()
        self._order: dict[Any, None] = {}
        for item in items:
            self.add(item)

    def add(self, item: Any) -> None:
        super().add(item)
        self._order[item] = None

    def discard(self, item: Any) -> None:
        super().discard(item)
        self._order.pop(item, None)

    def remove(self, item: Any) -> None:
        super().remove(item)
        del self._order[item]

    def clear(self) -> None:
        super().clear()
        self._order.clear()

    def __iter__(self) -> Any:
        return iter(list(self._order))


@dataclass(slots=True)
class _Job:
    """One transfer the fake worker runs."""

    job_id: int  # vLLM's scheduler-assigned job id
    req_id: str
    is_store: bool
    end_s: float  # when it ends on the link (reported at the first update at or after)


class FakeOffloadingWorker:
    """The worker side of the connector on the twin's clock (see the module doc)."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self._h2d_free_s = 0.0  # when each direction of the host link is next idle
        self._d2h_free_s = 0.0
        self._unreported: list[_Job] = []
        self.load_s = 0.0  # link time of loads / stores (one rank)
        self.store_s = 0.0
        self.wait_s = 0.0  # load launch -> report, summed (waiting-for-KV time)
        self._load_start: dict[int, float] = {}

    def launch(self, meta: Any, start_s: float, duration_s: float) -> None:
        """The step carrying ``meta`` starts on the GPU at ``start_s`` for ``duration_s``."""
        if meta is None:
            return
        transfer_s = self.settings.transfer_s
        # job ids grow in creation order; the twin launches its jobs in that order
        jobs = sorted([(jid, j, False) for jid, j in meta.load_jobs.items()]
                      + [(jid, j, True) for jid, j in meta.store_jobs.items()],
                      key=lambda t: t[0])
        for job_id, job, is_store in jobs:
            spec = job.src_spec if is_store else job.dst_spec
            num_blocks = len(spec.block_ids)
            if is_store:
                begin = max(start_s + duration_s, self._d2h_free_s)
                end = self._d2h_free_s = begin + transfer_s(num_blocks, False)
                self.store_s += end - begin
            else:
                begin = max(start_s, self._h2d_free_s)
                end = self._h2d_free_s = begin + transfer_s(num_blocks, True)
                self.load_s += end - begin
                self._load_start[job_id] = start_s
            self._unreported.append(_Job(job_id, job.req_id, is_store, end))

    def finished(self, now_s: float, num_workers: int) -> Any:
        """The ``KVConnectorOutput`` of the update at ``now_s`` (None: nothing ended)."""
        done = [j for j in self._unreported if j.end_s <= now_s]
        if not done:
            return None
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput

        self._unreported = [j for j in self._unreported if j.end_s > now_s]
        done.sort(key=lambda j: j.job_id)
        recving = set()
        for job in done:
            if not job.is_store:
                recving.add(job.req_id)
                self.wait_s += now_s - self._load_start.pop(job.job_id)
        meta = OffloadingWorkerMetadata(completed_jobs={j.job_id: num_workers for j in done})
        return KVConnectorOutput(finished_recving=recving or None,
                                 kv_connector_worker_meta=meta)

    def has_unreported(self) -> bool:
        return bool(self._unreported)

    def next_event_s(self, now_s: float) -> float:
        ends = [j.end_s for j in self._unreported if j.end_s > now_s]
        return min(ends) if ends else now_s


class OffloadingFeed:
    """Feeds vLLM's scheduler-side offloading connector: the fake worker's outputs in,
    the counters and per-step waiting-for-KV sets out.

    Call order (the driver's ``VllmCoreEngine``): :meth:`scheduled` right after each
    ``schedule()``, :meth:`launch` when the step starts on the GPU, :meth:`output` for
    the step's ``ModelRunnerOutput.kv_connector_output`` at its update, then
    :meth:`after_update` with the update's engine-core outputs.
    """

    def __init__(self, scheduler: Any, settings: Any) -> None:
        connector = scheduler.connector
        assert connector is not None, "the scheduler was built without its connector"
        self.scheduler = scheduler
        self.settings = settings
        self.connector = connector.connector_scheduler
        self.manager = self.connector.manager
        self.tokens_per_chunk = (scheduler.block_size * settings.blocks_per_chunk)
        self.num_workers = self.connector.config.num_workers
        self.worker = FakeOffloadingWorker(settings)
        self.c = {"external_queries": 0, "external_hits": 0, "loaded_tokens": 0,
                  "stored_tokens": 0, "loads": 0, "stores": 0, "deferred_lookups": 0,
                  "store_failures": 0, "evicted_chunks": 0}
        #: per recorded step: the requests in WAITING_FOR_REMOTE_KVS after schedule()
        self._local: dict[str, int] = {}  # request id -> the local hit its last lookup saw
        scheduler.finished_req_ids = InsertionOrderedSet(scheduler.finished_req_ids)
        self._wrap()

    def _wrap(self) -> None:
        """Count what vLLM's connector and manager decide, without changing it."""
        cs, manager, c = self.connector, self.manager, self.c
        lookup, alloc, store = (cs.get_num_new_matched_tokens, cs.update_state_after_alloc,
                                manager.prepare_store)

        local = self._local

        def get_num_new_matched_tokens(request: Any, num_computed: int, *a: Any,
                                       **kw: Any) -> Any:
            local[request.request_id] = num_computed
            hit, is_async = lookup(request, num_computed, *a, **kw)
            if hit is None:
                c["deferred_lookups"] += 1
            return hit, is_async

        def update_state_after_alloc(request: Any, blocks: Any, num_external: int) -> Any:
            if num_external:
                c["loaded_tokens"] += num_external
            return alloc(request, blocks, num_external)

        def prepare_store(*args: Any, **kw: Any) -> Any:
            result = store(*args, **kw)
            if result is None:
                c["store_failures"] += 1
            else:
                c["evicted_chunks"] += len(result.evicted_keys)
            return result

        cs.get_num_new_matched_tokens = get_num_new_matched_tokens
        cs.update_state_after_alloc = update_state_after_alloc
        manager.prepare_store = prepare_store

    def local_hit(self, req_id: str, computed: int) -> int:
        """The local (GPU) prefix hit of a request admitted with ``computed`` tokens: its
        last lookup's (a loaded request's computed tokens include the load), else
        ``computed``. The twin's step records and ``prefix_cache_hits`` count it so."""
        return self._local.get(req_id, computed)

    # ----------------------------------------------------------------- the step
    def scheduled(self, output: Any) -> None:
        """Right after ``schedule()``: count the step's jobs; the next step's finished
        ids go into an :class:`InsertionOrderedSet` (``schedule()`` just made a new set)."""
        self.scheduler.finished_req_ids = InsertionOrderedSet(self.scheduler.finished_req_ids)
        meta = output.kv_connector_metadata
        if meta is not None:
            self.c["loads"] += len(meta.load_jobs)
            self.c["stores"] += len(meta.store_jobs)
            cs = self.connector
            for job_id in meta.store_jobs:
                self.c["stored_tokens"] += len(cs._jobs[job_id].keys) * self.tokens_per_chunk

    def waiting_ids(self) -> tuple[str, ...]:
        from vllm.v1.request import RequestStatus

        return tuple(sorted(rid for rid, r in self.scheduler.requests.items()
                            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS))

    def launch(self, output: Any, start_s: float, duration_s: float) -> None:
        self.worker.launch(output.kv_connector_metadata, start_s, duration_s)

    def output(self, end_s: float) -> Any:
        return self.worker.finished(end_s, self.num_workers)

    def after_update(self, engine_core_outputs: dict[int, Any]) -> None:
        """Sum vLLM's ``connector_prefix_cache_stats`` of this update (first admissions:
        the preempted ones are counted apart by vLLM and left out, as the twin does)."""
        for eco in engine_core_outputs.values():
            stats = getattr(eco, "scheduler_stats", None)
            cps = getattr(stats, "connector_prefix_cache_stats", None)
            if cps is not None:
                self.c["external_queries"] += cps.queries
                self.c["external_hits"] += cps.hits

    # ----------------------------------------------------------------- the loop
    def can_progress(self, output: Any) -> bool:
        """Whether an empty step is a step vLLM runs, followed by a different one: a
        transfer is still to be reported, this step issued one, or it carries finished
        requests (their last stores and ``on_request_finished``, as the twin's step)."""
        meta = output.kv_connector_metadata
        issued = meta is not None and bool(meta.load_jobs or meta.store_jobs)
        return issued or self.worker.has_unreported() or bool(output.finished_req_ids)

    def empty_step_s(self, now_s: float, next_arrival_s: float) -> float:
        """An empty step lasts until the next transfer ends or the next request arrives
        (``tuner.sim.kv_connector.hooks.wait_for_transfers``)."""
        # the twin's rule (tuner.sim.kv_connector.hooks.empty_wait_s), restated here: this
        # module runs inside the vLLM environment and imports nothing of the twin's; an
        # arrival already due is one a closed loop holds back and does not end the wait
        arrival = next_arrival_s if next_arrival_s > now_s else float("inf")
        return max(0.0, min(self.worker.next_event_s(now_s), arrival) - now_s)

    def counters(self) -> dict[str, float]:
        """The twin's ``kv_offload_*`` counters, read from vLLM's side."""
        m = self.manager
        out = {f"kv_offload_{k}": float(v) for k, v in self.c.items()}
        out.update({
            "kv_offload_load_s": self.worker.load_s,
            "kv_offload_store_s": self.worker.store_s,
            "kv_offload_wait_s": self.worker.wait_s,
            "kv_offload_cpu_chunks": float(m._num_chunks),
            "kv_offload_cpu_chunks_used": float(m._num_allocated_chunks - len(m._free_list)),
        })
        return out


def offloading_feed(scheduler: Any, settings: Any) -> OffloadingFeed | None:
    """The feed for a scheduler built with ``settings`` (an ``OffloadSettings``), or None
    without a tier."""
    return None if settings is None else OffloadingFeed(scheduler, settings)
