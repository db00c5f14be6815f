"""vLLM 0.33.0's NIXL connector, scheduler side, pull variant, as two twin connectors.

Mirrors ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py @ 0.33.0``
(``NixlPullConnectorScheduler``) through the twin's connector interface
(``tuner.sim.kv_connector.base``; the waiting loop that calls it is
``tuner.sim.kv_connector.admission``). One connector per engine, by role:

* :class:`NixlDecodeConnector` (the decode instance; every request it gets carries
  ``do_remote_prefill``): ``get_num_new_matched_tokens`` returns the prompt tokens beyond
  the local prefix hit, to load asynchronously (pull_scheduler.py:35-66; the prefill
  backoff ``_prefill_backoff`` is 0 for full-attention models without MTP, so every
  prompt token is pulled), so the request is allocated its blocks and waits in
  ``WAITING_FOR_REMOTE_KVS`` (the twin's ``kv_holding``); ``update_state_after_alloc``
  queues one read per request (``_reqs_need_recv``, 130-160, "only trigger 1 KV transfer
  per request": ``do_remote_prefill`` is cleared, so a preempted request recomputes
  locally). The read starts when the step carrying it reaches the GPU (the worker's
  ``start_load_kv``) and is reported done (``finished_recving``) at the first step end
  after it completed; the waiting loop then registers the blocks and recomputes the
  last prompt token (``_update_waiting_for_remote_kv``), which yields the first token.
* :class:`NixlPrefillConnector` (the prefill instance; requests carry
  ``do_remote_decode`` and ``max_tokens=1``): admission is the plain one (``(0,
  False)``); ``request_finished`` delays the free (``delay_free_blocks``, 232-290): the
  blocks stay held until the decoder's read has ended (its notification,
  ``finished_sending``), then they are freed tail first as ``_free_blocks`` does.

Deliberate divergences (docs/disaggregation.md): reads of one decode engine are
serialized on its link (one NIC per GPU; the prefill NICs' contention between decode
engines is not modelled); the held blocks are released at the prefill engine's next
update after the read ended, as vLLM frees them at the update whose worker output
carries the notification (``finished_sending``): an idle prefill instance keeps them
through the next step's ``schedule()`` (tests/vllm/test_pd_parity.py); a prefill instance whose
cache is full of held blocks spins with empty steps until a read ends, as vLLM's does;
the lease expiry (``kv_lease_duration``, 30 s) never fires because every
handed-off request is read (an abort is replayed only while the read is in flight, and
the read goes on: :meth:`NixlDecodeConnector.abort`); a request the decode pool can never
hold is refused at the handoff, as the decode instance's front end would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from tuner.sim.disagg.settings import PDSettings
from tuner.sim.kv_cache_manager import KVCacheManager
from tuner.sim.kv_connector.base import NO_DECODE_EVENT
from tuner.sim.request import RequestStatus

if TYPE_CHECKING:
    from tuner.sim.block_pool import BlockPool
    from tuner.sim.request import SimRequest
    from tuner.sim.scheduler_output import SchedulerOutput

__all__ = ["HoldingKVCacheManager", "NixlDecodeConnector", "NixlPrefillConnector"]

_INF = float("inf")
_FINISHED = RequestStatus.FINISHED
_NO_IDS = np.empty(0, dtype=np.int64)


@dataclass(slots=True)
class _Read:
    """One pull of a request's prompt KV from its prefill instance."""

    request: "SimRequest"
    num_blocks: int  # blocks read (the prompt's blocks beyond the local hit)
    num_local: int  # local prefix hit (tokens) at the lookup
    start_s: float = -1.0  # when the read began on the decoder's link (-1: not launched)
    end_s: float = _INF  # when the last byte landed


class NixlDecodeConnector:
    """The decode instance's side (see the module doc).

    Args:
        settings: the deployment's transfer figures.
        on_read: called ``(trace index, start_s, end_s)`` when a read is launched (the
            loop tells the prefill instance when its blocks are free, and records the
            transfer's share of TTFT).
    """

    def __init__(self, settings: PDSettings,
                 on_read: Callable[[int, float, float], None]) -> None:
        self.settings = settings
        self.on_read = on_read
        self._finished_ids: list[str] = []  # the interface's name; nothing to finalize here
        self._pending: dict[str, int] = {}  # request id -> local hit at its (one) lookup
        self._loading_hit: dict[str, int] = {}  # request id -> local hit, while it loads
        self._batch: list[_Read] = []  # reads queued by this step's admissions
        self._unreported: list[_Read] = []  # launched, not reported to the scheduler yet
        self._link_free_s = 0.0
        self.num_reads = 0
        self.read_blocks = 0
        self.read_s = 0.0  # link time of every read
        self.local_hit_tokens = 0  # decoder prefix hits that shortened a read
        #: request id -> request aborted while its read was in flight: its blocks stay
        #: allocated until the read is reported, then ``free_blocks`` returns them
        self._aborted: dict[str, "SimRequest"] = {}
        self.free_blocks: Callable[["SimRequest"], None] | None = None  # set by the engine
        self.abort_times: dict[int, float] = {}  # trace index -> abort time (the engine's)
        self.aborted_freed_s: dict[str, float] = {}  # request id -> when its blocks came back
        self.read_start_s: dict[str, float] = {}  # request id -> its read's start, until done
        self._local: set[str] = set()  # request ids to add without a read (decode only)
        self.num_aborted_in_flight = 0

    # ----------------------------------------------------------------- admission
    def on_new_request(self, request: "SimRequest") -> None:
        if self._local and request.request_id in self._local:
            self._local.discard(request.request_id)  # no kv_transfer_params: nothing to read
            return
        self._pending[request.request_id] = 0

    def compute_locally(self, request_id: str) -> None:
        """The next request ``request_id`` came without ``do_remote_prefill`` (a router's
        decode-only choice): ``get_num_new_matched_tokens`` is 0 for it."""
        self._local.add(request_id)

    def get_num_new_matched_tokens(self, request: "SimRequest",
                                   num_local: int) -> tuple[int | None, bool]:
        if request.request_id not in self._pending:  # read once: a preempted one recomputes
            return 0, False
        count = request.num_prompt_tokens - num_local
        if count > 0:
            self._pending[request.request_id] = num_local
            return count, True
        return 0, False

    def update_state_after_alloc(self, request: "SimRequest", num_external: int) -> None:
        num_local = self._pending.pop(request.request_id)
        bs = self.settings.block_size
        blocks = -(-(num_local + num_external) // bs) - num_local // bs
        self._batch.append(_Read(request, blocks, num_local))
        self._loading_hit[request.request_id] = num_local
        self.local_hit_tokens += num_local

    def local_hit(self, request: "SimRequest") -> int:
        """The local prefix hit of the request's lookup, recorded when it is admitted
        after its read (vLLM's step shows the lookup's local hit there, not 0)."""
        return self._loading_hit.pop(request.request_id, 0)

    def count_query(self, request: "SimRequest", num_local: int) -> None:
        """Connector query stats: the decoder counts only its local hits."""

    # ----------------------------------------------------------------- steps
    def build_connector_meta(self, out: "SchedulerOutput") -> None:
        """The step's reads are already queued (``update_state_after_alloc``); an
        aborted request's id goes out with this step (``finished_req_ids``)."""
        if self._finished_ids:
            self._finished_ids = []

    def launch(self, start_s: float, duration_s: float) -> None:
        if not self._batch:
            return
        transfer_s = self.settings.transfer_s
        for read in self._batch:
            begin = start_s if start_s > self._link_free_s else self._link_free_s
            read.start_s = begin
            self.read_start_s[read.request.request_id] = begin
            read.end_s = self._link_free_s = begin + transfer_s(read.num_blocks)
            self.read_s += read.end_s - begin
            self.num_reads += 1
            self.read_blocks += read.num_blocks
            self._unreported.append(read)
            self.on_read(read.request.index, begin, read.end_s)
        self._batch = []

    def request_finished(self, request: "SimRequest") -> bool:
        self._pending.pop(request.request_id, None)
        self._loading_hit.pop(request.request_id, None)
        self.read_start_s.pop(request.request_id, None)
        return False  # a decoder frees its blocks at once (not bidirectional)

    def update_connector_output(self, now_s: float) -> set[str]:
        if not self._unreported:
            return set()
        done = {r.request.request_id for r in self._unreported if r.end_s <= now_s}
        if done:
            self._unreported = [r for r in self._unreported if r.end_s > now_s]
            if self._aborted:
                self._free_aborted(done, now_s)
        return done

    # ----------------------------------------------------------------- aborts
    def abort(self, request: "SimRequest") -> None:
        """The request was aborted while its read is in flight (vLLM's
        ``finish_requests`` with ``delay_free_blocks``: the read is not cancelled, so its
        blocks are freed when the worker reports it, ``_update_from_kv_xfer_finished``)."""
        self._aborted[request.request_id] = request
        self.num_aborted_in_flight += 1

    def aborted(self, request: "SimRequest") -> None:
        """Any abort: its id is sent with the next step, which vLLM runs even with
        nothing else to do (``has_finished_requests``)."""
        self._finished_ids.append(request.request_id)

    def _free_aborted(self, done: set[str], now_s: float) -> None:
        """Free the blocks of aborted requests whose read was just reported (and keep
        them out of ``finished_recving``: nothing waits for them)."""
        assert self.free_blocks is not None, "DecodeEngine sets free_blocks (tuner bug)"
        for rid in sorted(done & self._aborted.keys()):
            self.free_blocks(self._aborted.pop(rid))
            self.aborted_freed_s[rid] = now_s
            done.discard(rid)

    def has_pending_work(self) -> bool:
        return bool(self._batch or self._unreported)

    def can_progress(self) -> bool:
        # an abort's finished id makes vLLM step once more (has_finished_requests)
        return bool(self._batch or self._unreported or self._finished_ids)

    def next_event_s(self, now_s: float) -> float:
        """When the next launched read ends, or the client aborts a request whose read
        is in flight (``abort_times``: the engine core takes the abort at its next step)
        (inf: none in flight). ``now_s`` while this step's admissions have reads to
        launch: the step that launches them is a short empty one (vLLM's engine spins),
        not one that waits for the next arrival as if nothing were in flight."""
        if self._batch:  # this step launches reads: it is a short one, the next waits
            return now_s
        ends = [r.end_s for r in self._unreported if r.end_s > now_s]
        if self.abort_times:
            times = self.abort_times
            ends += [t for r in self._unreported
                     if (t := times.get(r.request.index, _INF)) > now_s and t < r.end_s]
        return min(ends) if ends else _INF

    def next_decode_event(self, request: "SimRequest") -> int:
        """Never: the read happens before the request runs; a decoding request is the
        connector's only at its finish (``request_finished``)."""
        return NO_DECODE_EVENT

    # ----------------------------------------------------------------- hash ids
    def live_hash_ids(self) -> np.ndarray:
        return _NO_IDS  # it keeps no block hashes

    def renumber(self, live: np.ndarray) -> None:
        """Nothing keyed by hash id."""

    def counters(self) -> dict[str, float]:
        return {"pd_reads": self.num_reads, "pd_read_blocks": self.read_blocks,
                "pd_read_link_s": self.read_s,
                "pd_decode_local_hit_tokens": self.local_hit_tokens,
                "pd_aborted_in_transfer": self.num_aborted_in_flight}


class NixlPrefillConnector:
    """The prefill instance's side (see the module doc): blocks held until read."""

    #: admission is the plain one (``get_num_new_matched_tokens`` is always ``(0,
    #: False)``): the scheduler takes its plain waiting loop (``tuner.sim.fast_path``
    #: item 6; ``tuner.sim.kv_connector.base``)
    plain_admission = True

    def __init__(self, block_pool: "BlockPool") -> None:
        self.block_pool = block_pool
        self._finished_ids: list[str] = []
        self._num_blocks: dict[str, int] = {}  # request id -> blocks at its last step
        self._held: dict[int, np.ndarray] = {}  # trace index -> blocks held for the read
        self._release_s: dict[int, float] = {}  # trace index -> when the read ended
        self.num_held = 0
        self.held_block_s = 0.0  # sum over requests of blocks x seconds held
        self._held_since: dict[int, float] = {}
        #: trace index -> whether its held blocks may repeat (the request's
        #: ``repeated_blocks`` at the free); absent: unknown, checked at the release
        self._held_repeats: dict[int, bool] = {}
        #: trace index -> how many of its held blocks carry a hash (a prefix of them:
        #: ``kept_hashed``); absent: unknown, the release gathers ``block_hash``
        self._held_hashed: dict[int, int] = {}
        self._first_release_s = _INF  # no read end known before it (release_until)

    def on_new_request(self, request: "SimRequest") -> None:
        """Nothing: a ``do_remote_decode`` request is admitted as any other."""

    def get_num_new_matched_tokens(self, request: "SimRequest",
                                   num_local: int) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: "SimRequest", num_external: int) -> None:
        """Never called: nothing loads on a prefill instance."""

    def local_hit(self, request: "SimRequest") -> int:
        return 0

    def count_query(self, request: "SimRequest", num_local: int) -> None:
        """No external lookups on a prefill instance."""

    def build_connector_meta(self, out: "SchedulerOutput") -> None:
        nb = self._num_blocks
        for request, _ in out.individual:
            nb[request.request_id] = request.num_blocks

    def launch(self, start_s: float, duration_s: float) -> None:
        """Nothing: the decoder moves the bytes (pull)."""

    def keep_at_free(self, request: "SimRequest") -> int:
        """The blocks of finished ``request`` to hold (its first ``n``, the blocks at its
        last step), taken at the free (:class:`HoldingKVCacheManager`): ``n``, 0 when
        there are none to hold."""
        n = self._num_blocks.pop(request.request_id, 0)
        if n:
            # A view, not a copy: the buffer is the finished request's own (never pooled),
            # and nothing writes it again (``release_memory`` only drops the reference).
            self._held[request.index] = request.block_buf[:n]
            self._held_since[request.index] = request.finish_s
            # a request whose blocks never repeat holds a repeat-free prefix of them:
            # the release may skip the pool's duplicate check, as the plain free does
            self._held_repeats[request.index] = request.repeated_blocks
            self.num_held += 1
        return n

    def kept_hashed(self, index: int, num_hashed: int) -> None:
        """The free that kept request ``index``'s blocks registered hashes on its first
        ``num_hashed`` of them (:class:`HoldingKVCacheManager`). Held, a block is in no
        free queue, so it cannot be evicted (lose its hash) nor registered by another
        request (gain one) before the release: the release passes the count to the pool
        instead of gathering ``block_hash`` over the blocks, as the plain free does."""
        self._held_hashed[index] = num_hashed

    def request_finished(self, request: "SimRequest") -> bool:
        """Hold the request's blocks (``delay_free_blocks``). Under a
        :class:`HoldingKVCacheManager` they are held already (its free kept them);
        under the plain manager the scheduler has freed them (the twin's order), and
        taking them back before anything else allocates leaves the free queue exactly as
        if they had never been freed."""
        n = self._num_blocks.pop(request.request_id, 0)
        if n:
            blocks = request.block_buf[:n].copy()
            self.block_pool.touch(blocks)
            self._held[request.index] = blocks
            self._held_since[request.index] = request.finish_s
            self.num_held += 1
        return True

    def read_done(self, index: int, end_s: float) -> None:
        """The decoder's read of request ``index`` ends at ``end_s`` (its notification)."""
        if index in self._held:
            self._release_s[index] = end_s
            if end_s < self._first_release_s:
                self._first_release_s = end_s

    def release_until(self, now_s: float) -> None:
        """Free the blocks of every request whose read ended by ``now_s`` (tail first).

        ``_first_release_s`` (the earliest end among ``_release_s``, or earlier) lets the
        update of every step return at once until a read has ended: the scan and the
        sort ran at each of the prefill engine's updates."""
        if now_s < self._first_release_s:
            return
        done = sorted(i for i, t in self._release_s.items() if t <= now_s)
        for index in done:
            end = self._release_s.pop(index)
            blocks = self._held.pop(index)
            self.held_block_s += len(blocks) * (end - self._held_since.pop(index))
            self.block_pool.free_blocks(blocks[::-1],
                                        may_repeat=self._held_repeats.pop(index, True),
                                        num_hashed=self._held_hashed.pop(index, -1))
        self._first_release_s = min(self._release_s.values(), default=_INF)

    @property
    def num_held_blocks(self) -> int:
        return sum(len(b) for b in self._held.values())

    def held(self) -> list[np.ndarray]:
        """The held blocks, one array per request (for invariant checks)."""
        return list(self._held.values())

    def update_connector_output(self, now_s: float) -> set[str]:
        self.release_until(now_s)
        return set()

    def has_pending_work(self) -> bool:
        return False  # held blocks alone do not keep an idle engine stepping

    def can_progress(self) -> bool:
        """Held blocks will come back: a step that admitted nothing because they fill
        the cache is waiting, not stalled (vLLM's engine spins until the notification)."""
        return bool(self._held)

    def next_event_s(self, now_s: float) -> float:
        """When the next held request's read ends (inf: none launched yet; the loop
        then wakes the engine at the next event anywhere)."""
        ends = [t for t in self._release_s.values() if t > now_s]
        return min(ends) if ends else _INF

    def next_decode_event(self, request: "SimRequest") -> int:
        """At every step: ``build_connector_meta`` records each scheduled request's blocks
        (the blocks to hold at its finish), so a running request stays on the plain
        rules (a prefill instance's requests finish at their first token anyway)."""
        return 0

    def live_hash_ids(self) -> np.ndarray:
        return _NO_IDS

    def renumber(self, live: np.ndarray) -> None:
        """Nothing keyed by hash id."""

    def counters(self) -> dict[str, float]:
        return {"pd_prefill_held": self.num_held, "pd_prefill_held_block_s": self.held_block_s}


class HoldingKVCacheManager(KVCacheManager):
    """The prefill instance's ``KVCacheManager``: the free of a finished request keeps
    the blocks its decoder will read (``keep``: the connector's
    :meth:`NixlPrefillConnector.keep_at_free`) and returns only the rest.

    Why: vLLM's scheduler does not free a request whose ``request_finished`` delays the
    free; the twin's scheduler frees first and the connector then took the blocks back
    (``touch``), two passes over the pool for every prompt (agentic prompts are
    thousands of blocks). Keeping them is the same state: between the free and the
    connector's call nothing allocates, so every held block ends with the reference
    count it had and out of the free queue, and the blocks freed (the ones past the
    request's last step) reach the queue in the order a whole free puts them there
    (tail first).
    """

    __slots__ = ("keep", "kept_hashed")

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.keep: Callable[["SimRequest"], int] | None = None  # set by the simulator
        #: told ``(trace index, hashed blocks among the kept)`` after a free that kept
        #: blocks (set by the simulator: :meth:`NixlPrefillConnector.kept_hashed`)
        self.kept_hashed: Callable[[int, int], None] | None = None

    def free(self, request: "SimRequest") -> int:  # type: ignore[override]
        hold = self.keep
        n = hold(request) if hold is not None and request.status >= _FINISHED else 0
        num_hashed = super().free(request, n)
        if n and self.kept_hashed is not None:
            # the registered blocks lead (KVCacheManager.free): the kept ones' hashed
            # part is a prefix of them, and a held block gains or loses no hash
            self.kept_hashed(request.index, min(num_hashed, n))
        return num_hashed
