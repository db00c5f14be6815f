"""Deferred block frees under overlapping batches with a KV connector (vLLM 0.33.0
``defer_block_free``, ``v1/core/sched/scheduler.py`` 189-195, 1779-1780, 1860-1862,
2279-2282, 3077-3119).

Why: with async scheduling (two batches in flight) a step may still be writing a freed
request's KV blocks while a consumer connector's load (``kv_role`` ``kv_both``, as
``--kv-offloading-size`` sets it) refills them, unordered against that write. vLLM
therefore returns the blocks of a request finished or preempted while a step that
scheduled it is still unprocessed to the pool only once that step's output is applied.
Until then the blocks stay referenced: they count as used (the KV-usage gauge) and are
never evicted, so admissions see fewer free blocks than without the tier.

The rule, as vLLM keeps it: ``sched_seq`` counts steps that scheduled tokens (at the end
of ``schedule()``), ``processed_seq`` the updates of such steps (at the start of
``update_from_output``, before the deferred frees drain); each scheduled request
remembers the ``sched_seq`` of its last step. A free is immediate when that step is
processed, else its blocks (tail first, as an immediate free) wait for ``processed_seq
>= the sched_seq at the free``. Only built for a connector under async scheduling
(``Scheduler.__init__``), so every other replay keeps the plain ``KVCacheManager``.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from tuner.sim.kv_cache_manager import KVCacheManager
from tuner.sim.request import RequestStatus

if TYPE_CHECKING:
    from tuner.sim.request import SimRequest
    from tuner.sim.scheduler_output import SchedulerOutput

__all__ = ["FencedKVCacheManager"]

_FINISHED = RequestStatus.FINISHED


class FencedKVCacheManager(KVCacheManager):
    """``KVCacheManager`` whose ``free`` waits for the request's last in-flight step.

    Invariant: every block of ``_deferred`` has one reference per deferred entry holding
    it (the freed request's), on top of the live requests' references.
    """

    __slots__ = ("sched_seq", "processed_seq", "_last_sched", "_deferred", "group_seq")

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.sched_seq = 0  # non-empty steps scheduled
        self.processed_seq = 0  # non-empty steps whose output was applied
        self._last_sched: dict[str, int] = {}  # request id -> sched_seq of its last step
        # (fence, blocks tail first, may_repeat): freed when processed_seq >= fence
        self._deferred: deque[tuple[int, np.ndarray, bool]] = deque()
        # sched_seq of the latest step with decode-group members (the fast path): a member
        # is scheduled in every step while it is one, recorded when it leaves.
        self.group_seq = 0

    def step_scheduled(self, out: "SchedulerOutput") -> None:
        """End of ``schedule()`` (1779-1780, then ``_update_after_schedule`` 1860-1862)."""
        if out.total_num_scheduled_tokens > 0:
            self.sched_seq += 1
        last = self._last_sched
        seq = self.sched_seq
        for request, _ in out.individual:
            last[request.request_id] = seq
        if out.group is not None and out.group.num_members:
            self.group_seq = seq  # the members' last step (members_left)

    def members_left(self, requests: "list[SimRequest]") -> None:
        """Decode-group members leave (the fast path, ``tuner.sim.async_group``): their
        last step is the latest group step if they took part in it, else the step that
        last scheduled them individually (the one they joined from, which is later),
        so the larger of the two is what vLLM's per-step record would hold."""
        last = self._last_sched
        group_seq = self.group_seq
        for request in requests:
            rid = request.request_id
            if last.get(rid, 0) < group_seq:
                last[rid] = group_seq

    def can_free_now(self, request: "SimRequest") -> bool:
        """``_request_blocks_can_be_freed``: no unprocessed step scheduled it. vLLM does
        not preempt a victim that fails this (939-941): the allocation stops there.

        A decode-group member's record is only brought up to date when it leaves
        (``members_left``); until then its last step is the later of its record and the
        latest group step (``group_seq``), the value ``members_left`` would store, so
        the group's running loop (``DecodeGroup._run_preempting``) asks the same
        question of a member as the plain loop asks after a dissolve."""
        last = self._last_sched.get(request.request_id, 0)
        if request.steady and last < self.group_seq:
            last = self.group_seq
        return last <= self.processed_seq

    def step_processed(self, out: "SchedulerOutput") -> None:
        """Start of ``update_from_output`` (2279-2282): drain the frees now safe."""
        if out.total_num_scheduled_tokens <= 0:
            return
        self.processed_seq += 1
        deferred, free = self._deferred, self.block_pool.free_blocks
        while deferred and deferred[0][0] <= self.processed_seq:
            _, blocks, may_repeat = deferred.popleft()
            free(blocks, may_repeat=may_repeat)

    def free(self, request: "SimRequest") -> int:  # type: ignore[override]
        """``_free_request_blocks``: free now, or pop the blocks and defer their return.
        Returns the request's registered blocks, as ``KVCacheManager.free`` does."""
        last = (self._last_sched.pop(request.request_id, 0) if request.status >= _FINISHED
                else self._last_sched.get(request.request_id, 0))
        if last <= self.processed_seq:
            return super().free(request)
        n = request.num_blocks
        num_hashed = request.num_cached_blocks
        if n:
            self._deferred.append((self.sched_seq, request.block_buf[n - 1::-1].copy(),
                                   request.repeated_blocks))
        request.repeated_blocks = False
        request.num_blocks = 0
        request.num_cached_blocks = 0
        return num_hashed

    def check_invariants(self, live_requests: "list[SimRequest]") -> None:
        """The pool's invariants with the deferred blocks counted as held."""
        holders = list(live_requests) + [_Held(blocks) for _, blocks, _ in self._deferred]
        super().check_invariants(holders)  # type: ignore[arg-type]


class _Held:
    """A deferred free's blocks as a holder for ``check_invariants``."""

    __slots__ = ("blocks", "num_blocks", "num_cached_blocks", "hit_memo")

    def __init__(self, blocks: np.ndarray) -> None:
        self.blocks = blocks.tolist()
        self.num_blocks = len(self.blocks)
        self.num_cached_blocks = 0
        self.hit_memo = -1
