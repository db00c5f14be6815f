"""``OffloadingConnector``: vLLM 0.33.0's ``OffloadingConnectorScheduler`` in the twin,
with a fake worker that finishes transfers at the times the host link gives.

Mirrors ``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py`` @ 0.33.0
for one full-attention KV group, no speculative decoding, no partial tails (they need a
recurrent group), ``offload_prompt_only`` (the default: only prompt chunks are stored),
``sync_load_budget_bytes = 0`` (the default: every load is asynchronous) and the
chunk-level store policy:

* keys: the hash id of every ``blocks_per_chunk``-th block (a chunk's last block,
  ``update_offload_keys``), at position ``(i + 1) * tokens_per_chunk``;
* lookup (``_lookup_complete_chunks``): consecutive CPU hits from the chunk holding the
  local hit's end, capped at ``num_tokens``; 0 unless a whole chunk beyond the local hit;
  ``None`` (deferred) if any hit is still being stored (HIT_PENDING), if any hit chunk is
  being loaded for another request, or while the request has transfers in flight;
* a load pins its chunks (``prepare_load``) and moves only the GPU blocks not hit
  locally; loaded chunks are not stored again (``next_stored_chunk_idx = num_chunks``);
* stores (``_build_store_jobs``): each scheduled request, and each request finished in the
  previous update, offers its chunks ``next_stored_chunk_idx ..
  min(offloadable // tokens_per_chunk, allocated blocks // blocks_per_chunk, keys)``
  where offloadable = min(computed + scheduled, num_tokens, num_prompt_tokens); a failed
  ``prepare_store`` (no idle chunk to evict) leaves the index for the next step;
* finished requests: blocks are freed at once (``request_finished`` returns False in
  0.33.0); their last stores are built at the next step from the keys saved at finish.

The fake worker (vLLM's ``OffloadingWorker`` + ``get_finished``): a step's loads start
when the step starts on the GPU, its stores when it ends (the KV they read is written by
that step); each direction of the host link runs one job at a time (PCIe is full duplex:
loads and stores do not share a direction), and a job takes ``latency + blocks x
bytes_per_block / bandwidth`` on each TP rank, in parallel. A job is reported finished at
the first update at or after its end.

Not modelled (docs/kv-offloading.md): the flush of a store whose source blocks are
reallocated (the worker waits for it before the step; the twin does not delay the step),
transfer failures, KV events, and the cache-hit-source histogram.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tuner.sim.kv_connector.base import NO_DECODE_EVENT
from tuner.sim.kv_connector.cpu_manager import make_pool
from tuner.sim.kv_connector.lru_pool import RANK_SPAN
from tuner.sim.kv_connector.policies import ReqContext
from tuner.sim.kv_connector.settings import OffloadSettings

if TYPE_CHECKING:
    from tuner.sim.request import SimRequest
    from tuner.sim.scheduler_output import SchedulerOutput

__all__ = ["OffloadingConnector"]

_INF = float("inf")
_NO_KEYS = np.empty(0, np.int64)


@dataclass(slots=True)
class _Job:
    """One transfer job (vLLM ``TransferJobStatus`` + the fake worker's times)."""

    job_id: int
    req_id: str
    keys: "np.ndarray | list[int]"  # the pool's run type (the LRU pool's are arrays)
    is_store: bool
    num_blocks: int  # GPU blocks moved (per rank)
    start_s: float = -1.0
    end_s: float = _INF  # when the worker reports it (set at launch)


@dataclass(slots=True)
class _ReqState:
    """vLLM ``RequestOffloadState`` for one group."""

    request: "SimRequest"
    ctx: ReqContext = field(default_factory=ReqContext)
    keys: np.ndarray = field(default_factory=lambda: _NO_KEYS)  # offload keys so far
    # (key i: the hash id of the block ending chunk i, at position (i + 1) chunks)
    next_stored: int = 0  # next_stored_chunk_idx
    num_block_ids: int = 0  # len(group_state.block_ids)
    num_local: int = 0  # num_locally_computed_tokens
    jobs: set[int] = field(default_factory=set)
    finished_signaled: bool = False
    finished: bool = False
    load_issued_s: float = -1.0  # when its pending load was launched (wait-for-KV counter)


class OffloadingConnector:
    """The CPU KV tier; implements :class:`tuner.sim.kv_connector.base.KVConnector`."""

    def __init__(self, settings: OffloadSettings, *, block_size: int,
                 enable_prefix_caching: bool = True) -> None:
        settings.validate()
        self.settings = settings
        self.block_size = block_size
        self.bpc = settings.blocks_per_chunk
        self.tokens_per_chunk = block_size * settings.blocks_per_chunk
        self.manager = make_pool(settings.num_chunks, settings.policy)
        # ReqContext.positions (key -> tokens to its chunk's end) is read only by the ARC
        # pool; the LRU pool gets each run's positions as an array beside its keys.
        self._position_map = self.manager.needs_position_map
        self._req: dict[str, _ReqState] = {}
        self._jobs: dict[int, _Job] = {}
        self._batch_jobs: list[_Job] = []  # built by this step, not launched yet
        self._finished_ids: list[str] = []  # finished since the last build (finished_req_ids)
        self._being_loaded: set[int] | None = set() if enable_prefix_caching else None
        self._job_counter = 0
        self._h2d_free_s = 0.0  # when each direction of the link is next idle
        self._d2h_free_s = 0.0
        self._unreported: list[_Job] = []  # launched, not yet reported
        # Counters (docs/kv-offloading.md).
        self.external_queries = 0  # connector_prefix_cache_queries of first admissions
        self.external_hits = 0  # their external hit tokens (loads issued)
        self.loaded_tokens = 0
        self.stored_tokens = 0
        self.num_loads = 0
        self.num_stores = 0
        self.load_s = 0.0  # link time of loads (one rank)
        self.store_s = 0.0
        self.wait_s = 0.0  # request time in WAITING_FOR_REMOTE_KVS (launch -> report)
        self.num_deferred_lookups = 0
        self.num_store_failures = 0

    # ----------------------------------------------------------------- keys
    def _update_keys(self, state: _ReqState) -> None:
        """``update_offload_keys``: one key per full chunk of the known block hashes."""
        request = state.request
        bpc = self.bpc
        have = len(state.keys)
        n = request.num_hashes // bpc
        if n <= have:
            return
        hashes = request.hashes_upto(n * bpc)
        new = hashes[(have + 1) * bpc - 1::bpc].astype(np.int64)
        tpc = self.tokens_per_chunk
        assert n * tpc < RANK_SPAN, "offload key position past the LRU rank span (tuner bug)"
        if self._position_map:
            state.ctx.positions.update(zip(new.tolist(),
                                           range((have + 1) * tpc, (n + 1) * tpc, tpc)))
        state.keys = np.concatenate([state.keys, new]) if have else new

    # ----------------------------------------------------------------- admission
    def on_new_request(self, request: "SimRequest") -> None:
        state = _ReqState(request)
        self.manager.on_new_request(state.ctx)
        self._req[request.request_id] = state

    def get_num_new_matched_tokens(self, request: "SimRequest",
                                   num_local: int) -> tuple[int | None, bool]:
        state = self._req[request.request_id]
        state.num_block_ids = 0
        if self.settings.restart_reoffers:  # 0.33.0: offer every chunk again (vllm_compat)
            state.next_stored = 0
        if state.jobs:
            self.num_deferred_lookups += 1
            return None, False
        self._update_keys(state)
        state.num_local = num_local
        hit = self._lookup(state, num_local)
        if hit is None:
            self.num_deferred_lookups += 1
        return hit, bool(hit)

    def _lookup(self, state: _ReqState, num_local: int) -> int | None:
        tpc = self.tokens_per_chunk
        keys = state.keys
        max_hit = min(state.request.num_tokens, len(keys) * tpc)
        if max_hit - num_local < tpc:
            return 0
        num_chunks = min(-(-max_hit // tpc), len(keys))
        start = num_local // tpc
        hits, pending = self.manager.lookup_run(keys[start:num_chunks])
        if hits == 0:
            return 0
        if pending:
            return None
        max_hit = min(max_hit, tpc * (start + hits))
        num_hit = max_hit - num_local
        if num_hit < tpc:
            return 0
        if self._being_loaded:
            end = -(-(num_local + num_hit) // tpc)
            if not self._being_loaded.isdisjoint(keys[start:end].tolist()):
                return None
        return num_hit

    def update_state_after_alloc(self, request: "SimRequest", num_external: int) -> None:
        if num_external == 0:
            return
        state = self._req[request.request_id]
        bs, tpc = self.block_size, self.tokens_per_chunk
        num_cached = state.num_local + num_external
        num_gpu_blocks = -(-num_cached // bs)
        first_fresh = -(-state.num_local // bs)
        num_pending = num_gpu_blocks - first_fresh
        num_chunks = -(-num_cached // tpc)
        first = first_fresh // self.bpc if num_pending else num_chunks
        keys = state.keys[first:num_chunks]
        state.next_stored = num_chunks  # OffloadPolicy.CHUNK_LEVEL
        self.manager.prepare_load(keys, state.ctx, self._positions(first, num_chunks))
        job = self._new_job(state, keys, False, num_pending)
        if self._being_loaded is not None:
            self._being_loaded.update(keys.tolist())
        if request.num_preemptions == 0:
            self.external_hits += num_external
        self.loaded_tokens += num_external
        self.num_loads += 1
        self._batch_jobs.append(job)

    def local_hit(self, request: "SimRequest") -> int:
        """The local prefix hit the request's last lookup saw (its load's start)."""
        state = self._req.get(request.request_id)
        return state.num_local if state is not None else 0

    def count_query(self, request: "SimRequest", num_local: int) -> None:
        """vLLM's ``connector_prefix_cache_stats`` query (first admissions only)."""
        if request.num_preemptions == 0:
            self.external_queries += request.num_tokens - num_local

    def _positions(self, start: int, end: int) -> np.ndarray:
        """The positions of a request's keys ``start .. end - 1`` (tokens to each chunk's
        end): what ``ReqContext.positions`` holds for them, as an array."""
        tpc = self.tokens_per_chunk
        return np.arange((start + 1) * tpc, (end + 1) * tpc, tpc, dtype=np.int64)

    def _new_job(self, state: _ReqState, keys: "np.ndarray | list[int]", is_store: bool,
                 num_blocks: int) -> _Job:
        job = _Job(self._job_counter, state.request.request_id, keys, is_store, num_blocks)
        self._job_counter += 1
        state.jobs.add(job.job_id)
        self._jobs[job.job_id] = job
        return job

    # ----------------------------------------------------------------- stores
    def build_connector_meta(self, out: "SchedulerOutput") -> None:
        """The step's store jobs (``_build_store_jobs``) and the finished requests'
        finalization; call before ``num_computed_tokens`` advance."""
        req = self._req
        tpc = self.tokens_per_chunk
        for request, n in out.individual:
            state = req[request.request_id]
            if state.next_stored >= request.num_prompt_tokens // tpc:
                continue  # every prompt chunk offered: _store would change nothing
            self._update_keys(state)
            state.num_block_ids = request.num_blocks
            self._store(state, request.num_computed_tokens + n)
        finished, self._finished_ids = self._finished_ids, []
        for req_id in finished:
            state = req.get(req_id)
            if state is None:
                continue
            request = state.request
            self._store(state, max(request.num_prompt_tokens, request.num_tokens - 1))
        for req_id in finished:
            state = req.get(req_id)
            if state is None:
                continue
            state.finished_signaled = True
            self.manager.on_request_finished(state.ctx)
            if not state.jobs:
                del req[req_id]

    def _store(self, state: _ReqState, num_after: int) -> None:
        request = state.request
        offloadable = min(num_after, request.num_tokens, request.num_prompt_tokens)
        tpc, bpc = self.tokens_per_chunk, self.bpc
        num_chunks = min(offloadable // tpc, state.num_block_ids // bpc, len(state.keys))
        start = state.next_stored
        if num_chunks <= start:
            state.next_stored = max(start, num_chunks)
            return
        offered = state.keys[start:num_chunks]
        result = self.manager.prepare_store(offered, state.ctx, self._positions(start, num_chunks))
        if result is None:
            self.num_store_failures += 1
            return
        to_store, _ = result
        state.next_stored = max(start, num_chunks)
        if not len(to_store):
            return
        job = self._new_job(state, to_store, True, len(to_store) * bpc)
        self.stored_tokens += len(to_store) * tpc
        self.num_stores += 1
        self._batch_jobs.append(job)

    # ----------------------------------------------------------------- the worker
    def launch(self, start_s: float, duration_s: float) -> None:
        """The step reaches the GPU at ``start_s`` and runs ``duration_s``: its loads
        start now, its stores at its end, each behind its direction's earlier jobs."""
        if not self._batch_jobs:
            return
        transfer_s = self.settings.transfer_s
        for job in self._batch_jobs:
            if job.is_store:
                begin = max(start_s + duration_s, self._d2h_free_s)
                job.end_s = self._d2h_free_s = begin + transfer_s(job.num_blocks, False)
                self.store_s += job.end_s - begin
            else:
                begin = max(start_s, self._h2d_free_s)
                job.end_s = self._h2d_free_s = begin + transfer_s(job.num_blocks, True)
                self.load_s += job.end_s - begin
                self._req[job.req_id].load_issued_s = start_s
            job.start_s = begin
            self._unreported.append(job)
        self._batch_jobs = []

    def request_finished(self, request: "SimRequest") -> bool:
        state = self._req.get(request.request_id)
        if state is not None:
            self._update_keys(state)  # the final block hashes, before the arrays go
            state.finished = True
            self._finished_ids.append(request.request_id)
        return False

    def update_connector_output(self, now_s: float) -> set[str]:
        """Complete the jobs that ended by ``now_s``; the requests whose load finished."""
        if not self._unreported:
            return set()
        done = [j for j in self._unreported if j.end_s <= now_s]
        if not done:
            return set()
        self._unreported = [j for j in self._unreported if j.end_s > now_s]
        done.sort(key=lambda j: j.job_id)
        recving: set[str] = set()
        stores: list["np.ndarray | list[int]"] = []  # finished store jobs' keys, not yet
        # handed to the pool
        for job in done:
            state = self._req[job.req_id]
            if job.is_store:
                stores.append(job.keys)
            else:
                if stores:
                    self._complete_stores(stores)
                self.manager.complete_load(job.keys)
                if self._being_loaded:
                    self._being_loaded.difference_update(
                        job.keys.tolist() if isinstance(job.keys, np.ndarray) else job.keys)
                recving.add(job.req_id)
                self.wait_s += now_s - state.load_issued_s
            del self._jobs[job.job_id]
            state.jobs.discard(job.job_id)
            if state.finished_signaled and not state.jobs:
                del self._req[job.req_id]
        if stores:
            self._complete_stores(stores)
        return recving

    def _complete_stores(self, stores: list["np.ndarray | list[int]"]) -> None:
        """Finished store jobs, consecutive in job order, as one pool call (and empty
        the list): one call per update where there was one per job (3,531 jobs in 838
        calls on the agentic hour's first 10 minutes). A store job's keys were absent
        when it was built and are in flight until now, so no key is in two of them, and
        completing them one after the other or at once changes the same keys the same
        way; the LRU pool then pushes one eviction-order run for them, not one per job."""
        if len(stores) == 1:
            keys = stores[0]
        elif isinstance(stores[0], np.ndarray):
            # Newest job first: a job's keys rank tail first (falling LRU ranks; in-flight
            # keys are never re-ranked), and a later job mostly belongs to a request of a
            # higher rank, so the whole is mostly in falling rank order, which the pool's
            # eviction order takes as a reversal instead of a sort.
            keys = np.concatenate(stores[::-1])
        else:  # the ARC pool's runs are lists (its completions need no order)
            keys = [k for run in stores for k in run]
        stores.clear()
        self.manager.complete_store(keys)

    def has_pending_work(self) -> bool:
        return bool(self._jobs) or bool(self._finished_ids)

    def can_progress(self) -> bool:
        """Whether an empty step can be followed by a different one: a transfer is still
        to be reported, or finished requests' stores are still to be built (else an
        empty step with nothing in flight would repeat forever)."""
        return bool(self._batch_jobs or self._unreported or self._finished_ids)

    def next_event_s(self, now_s: float) -> float:
        """When the next unreported transfer ends (an empty step waits until then)."""
        ends = [j.end_s for j in self._unreported if j.end_s > now_s]
        return min(ends) if ends else now_s

    def next_decode_event(self, request: "SimRequest") -> int:
        """The fast path's question (``base``): with ``offload_prompt_only`` a running
        request's store jobs end once every full prompt chunk is offered, the condition
        under which ``build_connector_meta`` skips it; before that it may store (or
        retry a failed store) at its next step."""
        state = self._req.get(request.request_id)
        if state is None or state.next_stored >= request.num_prompt_tokens // self.tokens_per_chunk:
            return NO_DECODE_EVENT
        return 0

    # ----------------------------------------------------------------- hash ids
    def live_hash_ids(self) -> np.ndarray:
        """Every hash id the tier holds (pool, ghost lists, request keys): a renumbering
        of the id space must keep them (``tuner.sim.hash_space``)."""
        ids = [np.asarray(self.manager.pool_keys(), dtype=np.int64)]
        ids.extend(state.keys for state in self._req.values())
        return np.concatenate(ids)

    def renumber(self, live: np.ndarray) -> None:
        """Hash id ``live[i]`` becomes ``i`` everywhere the tier holds ids (monotone)."""
        live = np.asarray(live, dtype=np.int64)

        def new_ids(keys: "np.ndarray | list[int] | set[int]") -> np.ndarray:
            return np.searchsorted(live, np.fromiter(keys, np.int64, len(keys))
                                   if not isinstance(keys, np.ndarray) else keys)

        self.manager.renumber(live)
        for state in self._req.values():
            state.keys = new_ids(state.keys)
            ctx = state.ctx
            if ctx.positions:
                ctx.positions = dict(zip(new_ids(list(ctx.positions)).tolist(),
                                         ctx.positions.values()))
            access = ctx.access
            if access is not None:
                access.renumber(live)  # type: ignore[attr-defined]
        for job in self._jobs.values():
            job.keys = new_ids(job.keys) if isinstance(job.keys, np.ndarray) \
                else new_ids(job.keys).tolist()
        if self._being_loaded:
            self._being_loaded = set(new_ids(self._being_loaded).tolist())

    # ----------------------------------------------------------------- results
    def counters(self) -> dict[str, float]:
        m = self.manager
        return {
            "kv_offload_external_queries": self.external_queries,
            "kv_offload_external_hits": self.external_hits,
            "kv_offload_loaded_tokens": self.loaded_tokens,
            "kv_offload_stored_tokens": self.stored_tokens,
            "kv_offload_loads": self.num_loads,
            "kv_offload_stores": self.num_stores,
            "kv_offload_load_s": self.load_s,
            "kv_offload_store_s": self.store_s,
            "kv_offload_wait_s": self.wait_s,
            "kv_offload_deferred_lookups": self.num_deferred_lookups,
            "kv_offload_store_failures": self.num_store_failures,
            "kv_offload_evicted_chunks": m.num_evicted,
            "kv_offload_cpu_chunks": m.num_chunks,
            "kv_offload_cpu_chunks_used": m.num_used_chunks,
        }
