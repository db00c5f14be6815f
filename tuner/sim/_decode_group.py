"""``DecodeGroup``: steady decoders advanced by one counter (the twin's fast path).

Why: at 100-300 running requests a pure decode step would cost a Python iteration per
request in ``schedule()`` and again in ``update_from_output``. Yet a decoding request
only *does* something observable every ``block_size`` steps: it takes a new block at
a block boundary, registers the hash of a block it filled, or finishes. Everything else
is "one more token", which a shared counter ``G`` expresses for all of them at once.

A running request is *steady* once it is decode-ready (``num_computed_tokens ==
num_tokens - 1``, its blocks exactly cover the computed tokens). Its counters are
stored as of group step ``g0``; the true values are ``stored + (G - g0)``. A calendar
maps each steady request to its next *event* step (allocation, registration or
finish), so a group step touches only the requests with an event, in running order
(admission ``seq``), and calls the same ``KVCacheManager.allocate_slots`` as the plain
path: block ids, evictions and hash registrations happen in exactly vLLM's order.

The scheduler uses a group step only when it can prove that every steady request is
scheduled with one token (the running loop's token budget reaches the last one). If the
blocks needed this step exceed the free queue, an allocation will fail: with fcfs the
group step then walks the pool-touching requests one by one and preempts from the tail
of running, as vLLM's loop does (``_run_preempting_group_step``); with priority, or when
the budget cannot reach every member, it dissolves the group (materialising every
request) and runs the plain step, re-forming the group afterwards.

A generated block whose hash is synthetic (no trace output hash: no other request can
look it up) is registered when its request frees its blocks, not when it fills, so such
blocks cost no event (``SimRequest.num_shared_hash_blocks``; ``KVCacheManager.free``).
``tests/sim/test_fast_forward.py`` shows both paths give byte-identical results.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from tuner.sim.request import RequestStatus, SimRequest

if TYPE_CHECKING:
    from tuner.sim.scheduler import SchedulerOutput


class DecodeGroup:
    """The steady decoders and their event calendar.

    Invariants: ``size`` = steady requests; ``sum_tokens`` = sum of their *true*
    ``num_tokens`` at counter ``G``; every steady request is in ``calendar`` under
    its ``next_event`` (stale entries of requests that left are skipped);
    ``last_end_s`` = end time of the latest step, when every member that took part
    in it received its token.
    """

    __slots__ = ("G", "size", "sum_tokens", "calendar", "odd", "last_end_s",
                 "block_size", "caching")

    def __init__(self, block_size: int, caching: bool) -> None:
        self.G = 0  # group steps so far
        self.size = 0
        self.sum_tokens = 0
        self.calendar: dict[int, list["SimRequest"]] = {}
        # Members whose last token is older than the previous step's end (they joined
        # without being scheduled that step): their next gap is computed one by one.
        self.odd: list["SimRequest"] = []
        self.last_end_s = 0.0
        self.block_size = block_size
        self.caching = caching

    def materialize(self, r: "SimRequest") -> None:
        """Bring ``r``'s counters to group step ``G``."""
        d = self.G - r.g0
        if d:
            r.num_tokens += d
            r.num_output_tokens += d
            r.num_computed_tokens += d
            r.last_token_s = self.last_end_s
            r.g0 = self.G

    def add(self, r: "SimRequest", now_s: float) -> None:
        if self.caching:
            r.lay_out_hashes()  # registrations read hash_array directly
        r.steady = True
        r.g0 = self.G
        self.size += 1
        self.sum_tokens += r.num_tokens
        if r.last_token_s != now_s:
            self.odd.append(r)
        self.schedule(r)

    def schedule(self, r: "SimRequest") -> None:
        """File ``r`` in the calendar under its next event: the first group step >= G
        where it allocates, registers a full block with a shareable hash or receives its
        last token. Its counters may lag (true values: stored + ``G - g0``)."""
        bs = self.block_size
        lag = self.G - r.g0
        t = r.num_tokens + lag
        k = (1 - t) % bs  # the token computed this step starts a new block
        if self.caching:
            k_reg = (-t) % bs  # the computed tokens fill a block: register its hash
            if k_reg < k and (t + k_reg) // bs <= r.num_shared_hash_blocks:
                k = k_reg
        k_fin = r.max_tokens - 1 - (r.num_output_tokens + lag)
        if k_fin < k:
            k = k_fin
        ev = self.G + k
        r.next_event = ev
        bucket = self.calendar.get(ev)
        if bucket is None:
            self.calendar[ev] = [r]
        else:
            bucket.append(r)

    def remove(self, r: "SimRequest") -> None:
        """Take a (materialised) member out of the group."""
        r.steady = False
        r.next_event = -1
        self.size -= 1
        self.sum_tokens -= r.num_tokens

    def take_events(self) -> list["SimRequest"]:
        """Members with an event at step ``G``, in running order; clears the bucket."""
        bucket = self.calendar.pop(self.G, None)
        if not bucket:
            return []
        g = self.G
        events = [r for r in bucket if r.steady and r.next_event == g]
        events.sort(key=seq_order)
        return events

    def clear(self) -> None:
        self.size = 0
        self.sum_tokens = 0
        self.calendar.clear()
        self.odd.clear()


#: Sort key: running order (admission sequence number); C-level, no Python call.
seq_order = attrgetter("seq")


class DecodeGroupSteps:
    """The ``Scheduler`` methods of group steps (mixed into ``Scheduler``; split out to
    keep ``scheduler.py`` readable). They use the scheduler's ``running``,
    ``nonsteady``, ``group``, ``kv_cache_manager``, ``block_size`` and
    ``max_model_len``; see the module docstring for when a group step is taken.
    """

    def _plan_group_step(self, token_budget: int, threshold: int, defer: bool
                         ) -> tuple[list[tuple[SimRequest, int]], list[SimRequest], bool] | None:
        """Tokens for the running requests outside the group, if this step can be a
        group step: every member that is not preempted gets its token. Same rules as
        ``_schedule_running``, evaluated without touching the pool. The flag says the
        free blocks do not cover the step's new blocks, so an allocation will fail and
        preempt (allowed with fcfs only: its victims come from the tail of running,
        after every request already scheduled)."""
        group = self.group
        assert group is not None
        running = self.running
        bs = self.block_size
        max_model_len = self.max_model_len
        n_steady = group.size
        last = len(running) - 1
        while not running[last].steady:
            last -= 1
        items: list[tuple[SimRequest, int]] = []
        spent = spent_before_last = need_blocks = 0
        for k, request in enumerate(self.nonsteady):
            pos = running.index(request)
            steady_before = pos - k
            budget_here = token_budget - steady_before - spent
            if budget_here <= 0:
                if steady_before < n_steady:
                    return None  # the running loop would stop before a member
                break
            if defer and request.is_prefill_chunk:
                continue
            n = request.num_tokens - request.num_computed_tokens
            if 0 < threshold < n:
                n = threshold
            if n > budget_here:
                n = budget_here
            cap = max_model_len - 1 - request.num_computed_tokens
            if n > cap:
                n = cap
            if n <= 0:
                continue
            items.append((request, n))
            spent += n
            if pos < last:
                spent_before_last += n
            slot = min(request.num_computed_tokens + n, max_model_len)
            nb = -(-slot // bs) - request.num_blocks
            if nb > 0:
                need_blocks += nb
        if token_budget - (n_steady - 1) - spent_before_last <= 0:
            return None
        events = group.take_events()
        g = group.G
        for request in events:
            if (request.num_tokens + (g - request.g0) - 1) % bs == 0:
                need_blocks += 1
        short = need_blocks > self.kv_cache_manager.block_pool.free_block_queue.num_free_blocks
        if short and self.policy != "fcfs":
            return None  # a priority victim may be scheduled already: the plain path
        return items, events, short

    def _run_group_step(self, out: SchedulerOutput, token_budget: int,
                        items: list[tuple[SimRequest, int]], events: list[SimRequest],
                        short: bool) -> tuple[int, bool]:
        """The running loop of a group step: allocations and registrations of members
        with an event and of the other running requests, merged in running order.

        Members between two other running requests are handled as one batch (one pop
        from the free queue for all their new blocks, one registration call for all
        their full blocks). Within a batch, allocations precede registrations rather
        than alternating member by member; the pool ends in the same state: a
        registered block is held, so no allocation can take it, and an evicted hash
        that a member registers again ends with the same first holder either way.
        """
        group = self.group
        assert group is not None
        if short:
            return self._run_preempting_group_step(out, token_budget, items, events)
        kvm = self.kv_cache_manager
        prefill_scheduled = False
        spent = 0
        j = 0
        n_events = len(events)
        for request, n in items:
            end = j
            while end < n_events and events[end].seq < request.seq:
                end += 1
            if end > j:
                self._member_events(events[j:end])
                j = end
            ok = kvm.allocate_slots(request, n)
            assert ok, f"group step allocation failed for {request!r} (tuner bug)"
            out.scheduled.append((request, n))
            spent += n
            if request.is_prefill_chunk:
                prefill_scheduled = True
        if j < n_events:
            self._member_events(events[j:] if j else events)
        out.group_size = group.size
        out.group_sum_tokens = group.sum_tokens
        out.group_events = events
        out.total_num_scheduled_tokens += group.size + spent
        return token_budget - group.size - spent, prefill_scheduled

    def _run_preempting_group_step(self, out: SchedulerOutput, token_budget: int,
                                   items: list[tuple[SimRequest, int]],
                                   events: list[SimRequest]) -> tuple[int, bool]:
        """The running loop of a group step that runs out of free blocks (fcfs).

        vLLM's loop, restricted to the requests that touch the pool: members with an
        event and the other running requests, one by one in running order, each with
        ``allocate_slots``; a failed allocation preempts the last running request
        (member or not) and retries, and a request that preempts itself ends the loop
        (it was the last). Members without an event need no block: in vLLM their
        ``allocate_slots`` changes nothing but registering blocks with synthetic ids,
        which the group defers (see ``tuner.sim._decode_group``). Preempted members
        leave the group without their token; every other member gets it.
        """
        group = self.group
        assert group is not None
        kvm = self.kv_cache_manager
        work = [(m, 1, True) for m in events] + [(r, n, False) for r, n in items]
        work.sort(key=lambda entry: entry[0].seq)
        prefill_scheduled = False
        spent = 0
        for request, n, member in work:
            if request.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            if member:
                group.materialize(request)
            while not kvm.allocate_slots(request, n):
                # fcfs: the tail of running, never a request already scheduled here
                victim = self._pick_victim()  # type: ignore[attr-defined]
                if victim.steady:
                    self._drop_member(victim)
                self._preempt_request(victim)  # type: ignore[attr-defined]
                out.preempted.append(victim)
                if victim is request:
                    break
            else:
                if not member:
                    out.scheduled.append((request, n))
                    spent += n
                    if request.is_prefill_chunk:
                        prefill_scheduled = True
                continue
            break  # the request preempted itself: nothing runs after it
        self.nonsteady = [r for r in self.nonsteady if r.status == RequestStatus.RUNNING]
        out.group_size = group.size
        out.group_sum_tokens = group.sum_tokens
        out.group_events = [m for m in events if m.steady]
        out.total_num_scheduled_tokens += group.size + spent
        return token_budget - group.size - spent, prefill_scheduled

    def _drop_member(self, request: SimRequest) -> None:
        """Take a member out of the group before it is preempted: counters up to date,
        and out of the calendar (it may rejoin later with the same event step)."""
        group = self.group
        assert group is not None
        group.materialize(request)
        bucket = group.calendar.get(request.next_event)
        if bucket is not None and request in bucket:
            bucket.remove(request)
        group.remove(request)

    def _member_events(self, members: list[SimRequest]) -> None:
        """``allocate_slots(member, 1)`` for decode-ready members, batched: a new block
        for each whose computed token starts one, then the hashes of the blocks the
        computed tokens fill (the plan checked the free blocks)."""
        group = self.group
        assert group is not None
        pool = self.kv_cache_manager.block_pool
        bs = self.block_size
        caching = self.kv_cache_manager.enable_caching
        g = group.G
        takers: list[SimRequest] = []
        fillers: list[tuple[SimRequest, int]] = []  # (member, index of the full block)
        for m in members:
            t = m.num_tokens + g - m.g0  # its true token count (counters stay lagging)
            if (t - 1) % bs == 0:
                takers.append(m)
            if caching and t % bs == 0 and t // bs <= m.num_shared_hash_blocks:
                fillers.append((m, t // bs - 1))
        if takers:
            new = pool.get_new_blocks(len(takers)) if len(takers) > 1 else (
                pool.get_new_block(),)
            for m, block in zip(takers, new):
                m.append_block(block)
        if fillers:
            blocks, hashes = [], []
            for m, index in fillers:
                assert m.num_cached_blocks == index, f"{m!r}: registration gap (tuner bug)"
                blocks.append(m.block_buf[index])
                hashes.append(m.hash_array[index])  # laid out by DecodeGroup.add
                m.num_cached_blocks = index + 1
            pool.cache_blocks(np.asarray(blocks, dtype=np.int64),
                              np.asarray(hashes, dtype=np.int64))

    def _group_tokens(self, out: SchedulerOutput, now_s: float, gaps: dict[float, int],
                      finished: list[SimRequest]) -> None:
        """Every member got one token at ``now_s``; members with an event finish or
        get their next event."""
        group = self.group
        assert group is not None
        odd, group.odd = group.odd, []
        n_main = out.group_size
        for member in odd:
            if member.steady:  # joined with an older last token: its own gap
                gap = now_s - member.last_token_s
                gaps[gap] = gaps.get(gap, 0) + 1
                n_main -= 1
        if n_main:
            gap = now_s - group.last_end_s
            gaps[gap] = gaps.get(gap, 0) + n_main
        group.G += 1
        g = group.G
        group.sum_tokens += out.group_size
        group.last_end_s = now_s
        for member in out.group_events:
            # Its counters lag by G - g0 tokens, this step's included.
            if member.num_output_tokens + g - member.g0 >= member.max_tokens:
                group.materialize(member)
                group.remove(member)
                member.status = RequestStatus.FINISHED
                member.finish_s = now_s
                finished.append(member)
                continue
            group.schedule(member)

    def _maybe_promote(self, request: SimRequest, now_s: float) -> None:
        """Move a decode-ready running request into the group."""
        if (request.num_computed_tokens == request.num_tokens - 1
                and request.num_blocks == -(-request.num_computed_tokens // self.block_size)
                and not request.is_prefill_chunk):
            self.group.add(request, now_s)  # type: ignore[union-attr]

    def _dissolve_group(self) -> None:
        """Materialise every member and leave them to the plain path."""
        group = self.group
        assert group is not None
        for request in self.running:
            if request.steady:
                group.materialize(request)
                request.steady = False
                request.next_event = -1
        group.clear()
        self.nonsteady = list(self.running)

    def materialize_all(self) -> None:
        """Bring every member's counters up to date (pure bookkeeping; for checks)."""
        if self.group is not None:
            for request in self.running:
                if request.steady:
                    self.group.materialize(request)

    def scheduled_tokens(self, out: SchedulerOutput) -> dict[str, int]:
        """request id -> tokens scheduled in ``out``, in vLLM's order (for StepRecords)."""
        if not out.lazy:
            return {r.request_id: n for r, n in out.scheduled}
        others = {id(r): n for r, n in out.scheduled}
        result = {}
        for request in self.running:
            if request.steady:
                result[request.request_id] = 1
            else:
                n = others.get(id(request))
                if n is not None:
                    result[request.request_id] = n
        return result


