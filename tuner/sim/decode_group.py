"""``DecodeGroup``: the twin's fast path, steady decoders advanced by one counter.

Why: at 100-1,000 running requests a pure decode step would cost a Python iteration per
request in ``schedule()`` and again in ``update_from_output``. Yet a decoding request
only *does* something observable every ``block_size`` steps: it takes a new block at a
block boundary, registers the hash of a block it filled, or finishes. Everything else is
"one more token", which one shared counter ``G`` expresses for all of them at once.

The fast path's contract (identical records, declared settings, provable steps only) is
stated in ``tuner.sim.fast_path``, which also declares how every settings field is treated.

Membership and the lag: a running request joins once it is decode-ready
(``is_decode_ready``). A member's counters are stored as of group step ``g0``; its true
values are the stored ones plus ``G - g0`` (``tokens``, ``output_tokens``,
``computed``): read them only through these accessors. Members are filed by *phase*
(``tuner.sim.member_calendar``): rings of members per residue of the step at which they
open a block (and fill a block whose hash another request can look up), in running
order, and a calendar of finishes. A group step touches only the members of the step's
rings and finishes, merged with the other running requests in running order (admission
``seq``): their new blocks
come from one ``BlockPool.get_new_blocks`` call per run of members between two other
running requests and their full blocks are registered with one ``cache_blocks`` call,
which leaves the pool exactly as vLLM's per-request ``allocate_slots`` calls would (see
``_member_events``). Non-members go through ``KVCacheManager.allocate_slots`` as on the
plain path. When the step's new blocks exceed the free ones an allocation will fail:
with fcfs the group step runs vLLM's loop over the pool-touching requests and preempts
from the tail of running (``_run_preempting``), or, under the block fence (a connector
under async scheduling), stops at a victim whose blocks are in flight and lets the
members it did not reach leave unscheduled; with priority it is not a group step.

A generated block whose hash is synthetic (no trace output hash: no other request can
look it up) is registered when its request frees its blocks, not when it fills, so such
blocks cost no event (``SimRequest.num_shared_hash_blocks``; ``KVCacheManager.free``).

Async scheduling runs the subclass ``tuner.sim.async_group.AsyncDecodeGroup``, not a
second fast path: the same plan (its non-member rules read the output placeholders, 0 in
sync mode) and pool work, plus a second clock ``S`` (steps scheduled; the calendar's key)
beside ``G`` (steps applied): in sync both move together at each apply, in async ``S``
moves at each schedule, so ``computed`` (and the placeholders) run one step ahead of
``tokens``, which only the accessors know.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tuner.sim._step_rules import blocks_needed, cdiv, running_new_tokens
from tuner.sim.decode_group_invariants import DecodeGroupInvariants
from tuner.sim.kv_cache_manager import KVCacheManager
from tuner.sim.kv_connector.base import NO_DECODE_EVENT, KVConnector
from tuner.sim.member_calendar import MemberCalendar, seq_order
from tuner.sim.request import RequestStatus, SimRequest
from tuner.sim.scheduler_output import GroupStep, SchedulerOutput

_RUNNING = RequestStatus.RUNNING
_NONE: list[SimRequest] = []  # no finishers this step (never appended to)


# ----------------------------------------------------------------------------- the group
class SchedulerHost(Protocol):
    """What the group needs from its scheduler (``tuner.sim.scheduler.Scheduler``)."""

    running: list[SimRequest]  # RUNNING requests in running (= ``seq``) order
    connector: KVConnector | None  # the engine's KV connector (may be set after the group)
    fenced: bool  # frees wait for in-flight steps (block_fence: a connector under async)

    @property
    def kv_cache_manager(self) -> KVCacheManager: ...

    @property
    def policy(self) -> str: ...

    def pick_victim(self) -> SimRequest:
        """Remove and return the request to preempt next (vLLM's choice)."""

    def preempt_request(self, request: SimRequest) -> None:
        """Recompute preemption of a RUNNING request no longer in ``running``."""


@dataclass(slots=True)
class GroupPlan:
    """A proven group step, not yet applied (planning changes no state)."""

    individual: list[tuple[SimRequest, int]]  # tokens of the running non-members, in order
    takers: list[SimRequest]  # members that open a block this step (their ring), in order
    fillers: list[SimRequest]  # members that fill a shareable block (their fill ring)
    finishers: list[SimRequest]  # members that get their last token this step
    short: bool  # the new blocks exceed the free ones: an allocation fails and preempts


class DecodeGroup(MemberCalendar, DecodeGroupInvariants):
    """The steady decoders of one scheduler, their rings and dated events, and group steps.

    Invariants (``check_invariants``): ``size`` = members; ``sum_tokens`` = sum of their
    true ``num_tokens``; every member is in ``rings[phase]``, in ``fill_rings`` and
    ``share_ends`` while a shareable fill is ahead (``share_end >= S``) and in
    ``finishes`` under its ``finish_step >= S``, and nothing else is in them (the rings
    in running order); ``others`` = the running non-members in running order;
    ``last_end_s`` = end time of the latest step, when every member that took part in it
    received its token.
    """

    __slots__ = ("host", "block_size", "caching", "max_model_len", "G", "S", "size",
                 "sum_tokens", "rings", "fill_rings", "finishes", "share_ends", "odd",
                 "last_end_s", "others")

    def __init__(self, host: SchedulerHost, *, block_size: int, caching: bool,
                 max_model_len: int) -> None:
        self.host = host
        self.block_size = block_size
        self.caching = caching
        self.max_model_len = max_model_len
        self.G = 0  # group steps applied so far
        # Group steps scheduled so far: the calendar's clock. Sync: advanced with G at each
        # apply (schedule and apply alternate). Async (tuner.sim.async_group): advanced at
        # each schedule, one step ahead of G while a step is in flight.
        self.S = 0
        self.size = 0
        self.sum_tokens = 0
        # Members by the residue (mod block size) of the keys at which they open a block,
        # and at which they fill a shareable one; each ring in running order.
        self.rings: list[list[SimRequest]] = [[] for _ in range(block_size)]
        self.fill_rings: list[list[SimRequest]] = [[] for _ in range(block_size)]
        self.finishes: dict[int, list[SimRequest]] = {}  # key -> members finishing there
        self.share_ends: dict[int, list[SimRequest]] = {}  # key -> last shareable fills
        # Members whose last token is older than the previous step's end (they joined
        # without being scheduled that step): their next gap is computed one by one.
        self.odd: list[SimRequest] = []
        self.last_end_s = 0.0
        self.others: list[SimRequest] = []  # running requests outside the group, in order

    # ------------------------------------------------------------------- the lag
    def is_member(self, request: SimRequest) -> bool:
        """Whether a running request is in the group (``SimRequest.steady``)."""
        return request.steady

    def lag(self, request: SimRequest) -> int:
        """Tokens a request's stored counters lag behind its true ones (0: not a member)."""
        return self.G - request.g0 if request.steady else 0

    def computed_lag(self, request: SimRequest) -> int:
        """Computed tokens its stored counter lags behind (steps scheduled since ``s0``;
        equal to ``lag`` in sync mode)."""
        return self.S - request.s0 if request.steady else 0

    def tokens(self, request: SimRequest) -> int:
        """True ``num_tokens``."""
        return request.num_tokens + self.lag(request)

    def output_tokens(self, request: SimRequest) -> int:
        """True ``num_output_tokens``."""
        return request.num_output_tokens + self.lag(request)

    def computed(self, request: SimRequest) -> int:
        """True ``num_computed_tokens``."""
        return request.num_computed_tokens + self.computed_lag(request)

    def placeholders(self, request: SimRequest) -> int:
        """True ``num_output_placeholders`` (async: one per scheduled, unapplied step)."""
        return request.num_output_placeholders + self.computed_lag(request) - self.lag(request)

    def in_flight(self, request: SimRequest) -> int:
        """True ``num_in_flight_tokens`` (members schedule one token per step)."""
        return request.num_in_flight_tokens + self.computed_lag(request) - self.lag(request)

    def is_decode_ready(self, request: SimRequest) -> bool:
        """Whether a running non-member may join: it decodes (one token to compute, not a
        partial prefill), its blocks exactly cover its computed tokens, and its whole
        sequence stays below ``max_model_len``; with a KV connector, also that the
        connector has no more work for it (``connector_quiet``)."""
        return (request.num_computed_tokens == request.num_tokens - 1
                and not request.is_prefill_chunk
                and request.num_blocks == cdiv(request.num_computed_tokens, self.block_size)
                and request.num_prompt_tokens + request.max_tokens <= self.max_model_len
                and self.connector_quiet(request))

    def connector_quiet(self, request: SimRequest) -> bool:
        """No connector, or one that never has work for this decoder again
        (``next_decode_event``, ``tuner.sim.fast_path`` item 4): a member's steps skip
        the connector's per-request work, so only such a request may join."""
        connector = self.host.connector
        return connector is None or connector.next_decode_event(request) == NO_DECODE_EVENT

    # ------------------------------------------------------------------- membership
    def materialize(self, request: SimRequest) -> None:
        """Bring a member's stored counters to group step ``G`` (no observable change)."""
        d = self.G - request.g0
        dc = self.S - request.s0  # == d in sync mode
        if d or dc:
            request.num_tokens += d
            request.num_output_tokens += d
            request.num_computed_tokens += dc
            request.num_output_placeholders += dc - d
            request.num_in_flight_tokens += dc - d
            if d:
                request.last_token_s = self.last_end_s
            request.g0 = self.G
            request.s0 = self.S

    def materialize_all(self) -> None:
        """Bring every member's stored counters up to date (before results are read)."""
        for request in self.host.running:
            if request.steady:
                self.materialize(request)

    def admitted(self, request: SimRequest) -> None:
        """A request just joined ``running`` (at its end): outside the group for now."""
        self.others.append(request)

    def _join(self, request: SimRequest, now_s: float) -> None:
        request.steady = True
        request.g0 = self.G
        request.s0 = self.S
        self.size += 1
        self.sum_tokens += request.num_tokens
        if request.last_token_s != now_s:
            self.odd.append(request)
        self._place(request)

    def _leave(self, request: SimRequest) -> None:
        """Take a materialised member out of the group: out of its rings and dated
        events (it may rejoin later with the same steps, which must not find it twice)."""
        request.steady = False
        self._unplace(request)
        self.size -= 1
        self.sum_tokens -= request.num_tokens

    def _drop(self, request: SimRequest) -> None:
        """A member about to be preempted: counters up to date, out of the group."""
        self.materialize(request)
        self._leave(request)

    def dissolve(self) -> None:
        """Materialise every member and leave them all to the plain path."""
        running = self.host.running
        for request in running:
            if request.steady:
                self.materialize(request)
                request.steady = False
                request.phase = request.share_end = request.finish_step = -1
        self.size = 0
        self.sum_tokens = 0
        for ring in self.rings:
            ring.clear()
        for ring in self.fill_rings:
            ring.clear()
        self.finishes.clear()
        self.share_ends.clear()
        self.odd.clear()
        self.others = list(running)

    # ------------------------------------------------------------------- schedule
    def plan(self, token_budget: int, threshold: int, defer: bool) -> GroupPlan | None:
        """The group step for this budget, or None when it is not provably one.

        The running loop of ``Scheduler._schedule_running`` evaluated without touching the
        pool: every member takes 1 token, each non-member what ``running_new_tokens``
        gives it with the budget left when the loop reaches it. That budget is the
        step's budget minus 1 per member before it and the tokens of the non-members
        before it (positions by bisection: ``running`` is in ``seq`` order, ``others``
        is running minus the members, in the same order; both checked invariants).
        """
        host = self.host
        running = host.running
        bs = self.block_size
        max_model_len = self.max_model_len
        num_members = self.size
        last = len(running) - 1  # position of the last member in running
        while not running[last].steady:
            last -= 1
        individual: list[tuple[SimRequest, int]] = []
        spent = spent_before_last = num_new_blocks = 0
        for k, request in enumerate(self.others):
            pos = bisect_left(running, request.seq, key=seq_order)
            members_before = pos - k
            budget_here = token_budget - members_before - spent
            if budget_here <= 0:
                if members_before < num_members:
                    return None  # the running loop stops before a member
                break
            placeholders = request.num_output_placeholders  # 0 in sync mode
            if placeholders and (request.num_computed_tokens + 2 - placeholders
                                 >= request.num_prompt_tokens + request.max_tokens):
                continue  # async: its last token is in flight (scheduler.py:800-814)
            if defer and request.is_prefill_chunk:
                continue
            computed = request.num_computed_tokens
            n = running_new_tokens(request.num_tokens + placeholders, computed, threshold,
                                   budget_here, max_model_len)
            if n <= 0:
                continue
            individual.append((request, n))
            spent += n
            if pos < last:
                spent_before_last += n
            num_new_blocks += blocks_needed(min(computed + n, max_model_len),
                                            request.num_blocks, bs)
        # The loop reaches the last member with the budget less 1 per member before it and
        # the tokens of the non-members before it; it schedules it only if some is left.
        # (Checked here, not in the loop: members after the last non-member have no entry.)
        if token_budget - (num_members - 1) - spent_before_last <= 0:
            return None
        residue = self.S % bs
        takers = self.rings[residue]
        num_new_blocks += len(takers)
        short = num_new_blocks > host.kv_cache_manager.block_pool.free_block_queue.num_free_blocks
        if short and host.policy != "fcfs":
            return None  # priority: a victim may be scheduled already. The plain path.
        # fcfs and fenced (a connector under async): vLLM stops at a victim whose blocks
        # it cannot free yet; _run_preempting stops there too and the members it does
        # not reach leave the group unscheduled.
        return GroupPlan(individual, takers, self.fill_rings[residue],
                         self.finishes.get(self.S, _NONE), short)

    def run(self, out: SchedulerOutput, token_budget: int, plan: GroupPlan
            ) -> tuple[int, bool]:
        """Apply a plan: the running loop of a group step. Returns the budget left and
        whether a prefill chunk was scheduled.

        The takers and fillers between two other running requests are handled as one
        batch (``_member_events``); the other requests call ``allocate_slots`` as on the
        plain path, in running order. The step's finishing members are its ``events``
        (``apply_tokens`` finishes them); members whose shareable hashes end at this
        step leave their fill ring after its pool work (``_end_shares``).
        """
        finishers = self.finishes.pop(self.S, _NONE)
        if plan.short:
            result = self._run_preempting(out, token_budget, plan)
            self._end_shares()
            return result
        spent, prefill_scheduled = self._allocate_in_order(plan.takers, plan.fillers,
                                                           plan.individual, out)
        self._end_shares()
        out.group = GroupStep(self.size, self.sum_tokens, finishers, self.host.running, self)
        out.total_num_scheduled_tokens += self.size + spent
        return token_budget - self.size - spent, prefill_scheduled

    def _allocate_in_order(self, takers: list[SimRequest], fillers: list[SimRequest],
                           individual: list[tuple[SimRequest, int]], out: SchedulerOutput
                           ) -> tuple[int, bool]:
        """The pool work of a running loop whose allocations all succeed: the takers and
        fillers between two other running requests as one batch (``_member_events``),
        the others through ``allocate_slots`` as on the plain path, in running order
        (all three lists are). Returns the non-members' tokens and whether a prefill
        chunk was scheduled."""
        kvm = self.host.kv_cache_manager
        prefill_scheduled = False
        spent = 0
        ti = fi = 0
        for request, n in individual:
            seq = request.seq
            te = bisect_left(takers, seq, ti, key=seq_order) if takers else 0
            fe = bisect_left(fillers, seq, fi, key=seq_order) if fillers else 0
            if te > ti or fe > fi:
                self._member_events(takers[ti:te], fillers[fi:fe])
                ti, fi = te, fe
            ok = kvm.allocate_slots(request, n)
            assert ok, f"group step allocation failed for {request!r} (tuner bug)"
            out.individual.append((request, n))
            spent += n
            if request.is_prefill_chunk:
                prefill_scheduled = True
        if ti < len(takers) or fi < len(fillers):
            self._member_events(takers[ti:] if ti else takers,
                                fillers[fi:] if fi else fillers)
        return spent, prefill_scheduled

    def _run_preempting(self, out: SchedulerOutput, token_budget: int, plan: GroupPlan
                        ) -> tuple[int, bool]:
        """The running loop of a group step that runs out of free blocks (fcfs).

        vLLM's loop, restricted to the requests that touch the pool: members with an
        event and the non-members, one by one in running order, each with
        ``allocate_slots``; a failed allocation preempts the last running request
        (member or not) and retries, and a request that preempts itself ends the loop
        (it was the last). With fcfs a victim is never a request already scheduled this
        step. Members without an event need no block: in vLLM their ``allocate_slots``
        changes nothing but registering blocks with synthetic ids, which the group
        defers. Preempted members leave the group without their token; every other
        member the loop reaches gets it. The runs of requests between two failing
        allocations go as one, as a group step's do (``_fitting_prefix``); only a
        failing request and its preemptions take the loop one by one.

        Fenced (a connector under async scheduling, ``block_fence``): before a victim is
        taken, ``can_free_now`` is asked as the plain loop asks it (939-941; for a member,
        ``FencedKVCacheManager.can_free_now`` counts the latest group step as its last);
        a victim whose blocks are still in flight ends the loop at the failing request,
        unscheduled and unpreempted. The members from that request on are not reached:
        they leave the group without their token (``_drop``), as a dissolve would have
        left them before the plain loop, and the members before it keep the group step.
        """
        host = self.host
        kvm = host.kv_cache_manager
        fenced = host.fenced
        running = host.running
        members = {id(m): m for m in plan.takers}
        members.update((id(m), m) for m in plan.fillers)
        members.update((id(m), m) for m in plan.finishers)
        work = [(m, 1, True) for m in members.values()]
        work += [(r, n, False) for r, n in plan.individual]
        work.sort(key=lambda entry: entry[0].seq)
        residue = self.S % self.block_size
        # Between two failing allocations the requests cannot tell this loop from a group
        # step: each takes its blocks from a pool that has them. Such a run goes as one
        # (members batched, ``_allocate_in_order``); the loop proper handles the request
        # that fails (and preempts) and the ones preempted meanwhile.
        spent = 0
        prefill_scheduled = False
        stopped: SimRequest | None = None  # where the fence ended the loop
        i = 0
        n_work = len(work)
        while i < n_work:
            fit = self._fitting_prefix(work, i)
            if fit:
                run = work[i:i + fit]
                tokens, prefill = self._allocate_in_order(
                    [m for m, _, member in run if member and m.phase == residue],
                    [m for m, _, member in run if member and m.share_end >= 0
                     and self.fill_residue(m) == residue],
                    [(r, n) for r, n, member in run if not member], out)
                spent += tokens
                prefill_scheduled = prefill_scheduled or prefill
                i += fit
                if i == n_work:
                    break
            request, n, member = work[i]
            i += 1
            if request.status != _RUNNING:
                continue  # preempted earlier in this loop
            if member:
                self.materialize(request)
            while not kvm.allocate_slots(request, n):
                # fcfs: the victim is the tail of running (Scheduler._victim_index)
                if fenced and not kvm.can_free_now(running[-1]):  # type: ignore[attr-defined]
                    stopped = request
                    break
                victim = host.pick_victim()  # fcfs: the tail of running
                if victim.steady:
                    self._drop(victim)
                host.preempt_request(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            else:
                if not member:
                    out.individual.append((request, n))
                    spent += n
                    if request.is_prefill_chunk:
                        prefill_scheduled = True
                continue
            break  # the request preempted itself, or the fence stopped the loop at it
        if stopped is not None:
            self._leave_unreached(stopped)
        else:
            self.others = [r for r in self.others if r.status == _RUNNING]
        finishers = [m for m in plan.finishers if m.steady]
        out.group = GroupStep(self.size, self.sum_tokens, finishers, host.running, self)
        out.total_num_scheduled_tokens += self.size + spent
        return token_budget - self.size - spent, prefill_scheduled

    def _fitting_prefix(self, work: list[tuple[SimRequest, int, bool]], start: int) -> int:
        """How many requests of a preempting loop's ``work`` (running order) from
        ``start`` on allocate before the first one that fails, or that was preempted:
        ``allocate_slots`` of a RUNNING request (no hit, no watermark, no reservation)
        succeeds exactly when the blocks it needs do not exceed the free ones, and takes
        exactly that many out of the free queue (a registration takes none). A member
        needs one block when it is in this step's ring (the plan's count); a non-member
        what ``allocate_slots`` computes."""
        kvm = self.host.kv_cache_manager
        free = kvm.block_pool.free_block_queue.num_free_blocks
        bs = self.block_size
        lookahead = kvm.num_lookahead_tokens
        max_model_len = kvm.max_model_len
        residue = self.S % bs
        for i in range(start, len(work)):
            request, n, member = work[i]
            if request.status != _RUNNING:
                return i - start
            if member:
                need = 1 if request.phase == residue else 0
            else:
                need = blocks_needed(min(request.num_computed_tokens + n + lookahead,
                                         max_model_len), request.num_blocks, bs)
            if need > free:
                return i - start
            free -= need
        return len(work) - start

    def _leave_unreached(self, stopped: SimRequest) -> None:
        """The fence ended the running loop at ``stopped``: every member from it on in
        running order leaves the group without this step's token (``_drop``: counters up
        to date, out of the calendar; under async its in-flight token goes back to the
        step in flight), and ``others`` follows ``running`` again."""
        running = self.host.running
        for request in running[bisect_left(running, stopped.seq, key=seq_order):]:
            if request.steady:
                self._drop(request)
        self.others = [r for r in running if not r.steady]

    def _member_events(self, takers: list[SimRequest], fillers: list[SimRequest]) -> None:
        """``allocate_slots(member, 1)`` for decode-ready members, batched: a new block
        for each taker (its computed token opens one), then the hashes of the shareable
        blocks the fillers' computed tokens fill (the plan checked the free blocks).

        Allocations precede registrations within the batch rather than alternating
        member by member; the pool ends in the same state: a registered block is held,
        so no allocation can take it, and an evicted hash that a member registers again
        ends with the same first holder either way.
        """
        pool = self.host.kv_cache_manager.block_pool
        bs = self.block_size
        if takers:
            if len(takers) == 1:
                takers[0].append_block(pool.get_new_block())
            else:
                for m, block in zip(takers, pool.get_new_blocks(len(takers)).tolist()):
                    m.append_block(block)
        if fillers:  # after the allocations: at block size 1 the full block is the new one
            g = self.G
            fill_blocks: list[int] = []  # block and hash of each full block, in order
            fill_hashes: list[int] = []
            for m in fillers:
                index = (m.num_tokens + g - m.g0) // bs - 1  # self.tokens(m) // bs - 1
                assert m.num_cached_blocks == index, f"{m!r}: registration gap (tuner bug)"
                fill_blocks.append(m.block_buf.item(index))
                # A generated block with a shareable hash: the trace's output id (what
                # ``m.hash_at(index)`` gives), read from the list without a lay-out.
                fill_hashes.append(m.output_hashes[index - m.num_prompt_tokens // bs])
                m.num_cached_blocks = index + 1
            if len(fill_blocks) == 1:
                pool.cache_block(fill_blocks[0], fill_hashes[0])
            else:
                pool.cache_blocks(np.array(fill_blocks, dtype=np.int64),
                                  np.array(fill_hashes, dtype=np.int64))

    def after_update(self, out: SchedulerOutput, finished: list[SimRequest],
                     now_s: float) -> None:
        """After the scheduler freed the finished requests: decode-ready requests join
        and ``others`` follows ``running``."""
        self.last_end_s = now_s
        if out.group is not None:
            size = self.size
            for request, _ in out.individual:
                if (request.status == _RUNNING and not request.steady
                        and self.is_decode_ready(request)):
                    self._join(request, now_s)
            if finished or self.size != size:
                self.others = [r for r in self.others if r.status == _RUNNING and not r.steady]
            return
        running = self.host.running
        for request in running:
            if not request.steady and self.is_decode_ready(request):
                self._join(request, now_s)
        self.others = [r for r in running if not r.steady]
