"""``AsyncDecodeGroup``: the decode group (``tuner.sim.decode_group``) under async scheduling.

The same fast path, the same contract (``tuner.sim.fast_path``): members are steady
decoders advanced by counters, and a group step touches only members with an event.
What async scheduling (``tuner.sim.async_update``) changes for a steady decoder:

* **One token always in flight.** schedule(N+1) runs before update(N), so at every
  schedule a member has one placeholder and one token in flight, and ``computed ==
  tokens`` (not ``tokens - 1``). Two clocks express it: ``S`` counts scheduled steps
  (computed tokens, placeholders and in-flight tokens grow with it), ``G`` counts applied
  steps (tokens and output tokens grow with it, placeholders and in-flight tokens shrink).
  A member's stored counters are as of ``(s0, g0)``; the accessors add ``S - s0`` and
  ``G - g0``. Every member has exactly one token in each step that is applied while it is
  a member, so an update advances ``G`` for all of them.
* **Membership changes at schedule time**, while the previous step is in flight; that
  step's token of a request that joins or leaves is moved between the group and the step's
  individual entries, so the plain update (``apply_outputs``) applies exactly the tokens
  of non-members. *Joining* (at the start of ``schedule``): a running request whose only
  in-flight step scheduled it with one token and samples it, registrations up to date,
  its in-flight token not its last, takes that entry out of the in-flight step: the group
  applies it. *Leaving* (dissolve, preemption, finishing): its in-flight token goes back
  to the in-flight step as an individual entry, in running order (``sort_individual``).
* **Block rules at a schedule with ``t`` applied tokens** (computed ``t``, one token to
  compute): a new block when ``t % block_size == 0``; ``allocate_slots`` registers up to
  ``min(computed + 1, num_tokens) = t`` (kv_cache_manager.py:616-625), so the block that
  ``t`` completes is registered at that same schedule: one step after sync, where the
  computed tokens cover ``t`` a step earlier. The update's own registration (up to
  ``computed - in_flight``, scheduler.py:2402-2415) then finds nothing new for a member.
* **Finishing.** The ``max_tokens`` look-ahead (scheduler.py:800-814) skips a request
  whose in-flight token is its last, yet it keeps its seat and blocks until the update
  (1072-1074). So a member leaves the group at the schedule that gives it its last token
  (``FINISHES`` event): that step schedules it individually, the next one skips it in the
  plain rules of the running loop, and the plain update finishes and frees it.
"""

from __future__ import annotations

from bisect import insort

from tuner.sim._step_rules import cdiv
from tuner.sim.decode_group import (
    DecodeGroup,
    GroupPlan,
    SchedulerHost,
    seq_order,
)
from tuner.sim.decode_group_invariants import FILLS_BLOCK, FINISHES, OPENS_BLOCK
from tuner.sim.request import RequestStatus, SimRequest
from tuner.sim.scheduler_output import SchedulerOutput

_RUNNING = RequestStatus.RUNNING


class AsyncDecodeGroup(DecodeGroup):
    """The decode group for ``SimOptions.async_scheduling`` (see the module doc).

    Extra invariants (``check_invariants``): every member has one placeholder and one
    token in flight, ``computed == tokens``, and its output tokens stay at least 2 below
    ``max_tokens`` (the step that schedules its last token takes it out of the group).
    """

    __slots__ = ("pending", "others_stale")

    #: A member opens (and fills) a block at the schedule whose applied tokens are 0 mod bs.
    OPEN_OFFSET = 0
    #: It leaves at the schedule of its last token: output tokens max_tokens - 2 applied.
    FINISH_LEAD = 2

    def __init__(self, host: SchedulerHost, *, block_size: int, caching: bool,
                 max_model_len: int) -> None:
        super().__init__(host, block_size=block_size, caching=caching,
                         max_model_len=max_model_len)
        self.pending: SchedulerOutput | None = None  # the step in flight while scheduling
        self.others_stale = False  # a plain step changed running: rebuild ``others``

    # ------------------------------------------------------------------- rules
    def block_events(self, request: SimRequest, num_tokens: int) -> int:
        """``OPENS_BLOCK | FILLS_BLOCK`` of a member scheduled with ``num_tokens`` applied
        tokens (module doc): both at a block boundary, the fill only for a shareable
        hash (a synthetic one waits for ``KVCacheManager.free``, as in sync).
        ``MemberCalendar._place`` turns it into a phase (``OPEN_OFFSET`` 0: the fill and
        the opening share a key); ``check_invariants`` compares the rings with it."""
        bs = self.block_size
        if num_tokens % bs:
            return 0
        if self.caching and num_tokens // bs <= request.num_shared_hash_blocks:
            return OPENS_BLOCK | FILLS_BLOCK
        return OPENS_BLOCK

    def is_decode_ready(self, request: SimRequest) -> bool:
        """Whether a running non-member may join now, at the start of a schedule: its one
        in-flight step scheduled it with one token and samples it (one placeholder, one
        in-flight token, ``computed == num_tokens``), it has had a first token, its
        in-flight token is not its last, its blocks cover exactly its computed tokens and
        its registrations end one token short of them (as a member's do), and its whole
        sequence stays below ``max_model_len``; with a KV connector, the connector has
        no more work for it (``connector_quiet``)."""
        t = request.num_tokens
        return (request.num_output_placeholders == 1 and request.num_in_flight_tokens == 1
                and request.num_stale_output_tokens == 0
                and request.num_computed_tokens == t and not request.is_prefill_chunk
                and 1 <= request.num_output_tokens <= request.max_tokens - 2
                and request.num_blocks == cdiv(t, self.block_size)
                and (not self.caching or request.num_cached_blocks == (t - 1) // self.block_size)
                and request.num_prompt_tokens + request.max_tokens <= self.max_model_len
                and self.connector_quiet(request))

    # ------------------------------------------------------------------- membership
    def join(self, pending: SchedulerOutput | None) -> None:
        """Start of a schedule: remember the step in flight and take in the requests it
        scheduled that are decode-ready (their in-flight token moves into the group)."""
        self.pending = pending
        running = self.host.running
        if self.others_stale:
            self.others = [r for r in running if not r.steady]
            self.others_stale = False
        if pending is None:
            return
        ready = self.is_decode_ready
        joining = [r for r, n in pending.individual
                   if n == 1 and r.status == _RUNNING and not r.steady and ready(r)]
        if not joining:
            return
        now = self.last_end_s
        for request in joining:
            self._join(request, now)
        kept = [(entry, sampled) for entry, sampled in zip(pending.individual, pending.sampled)
                if not entry[0].steady]
        pending.individual = [entry for entry, _ in kept]
        pending.sampled = [sampled for _, sampled in kept]
        self.others = [r for r in self.others if not r.steady]

    def _depart(self, request: SimRequest, allocated: bool = False) -> None:
        """A member leaves at schedule time: counters up to date, registrations caught up
        with vLLM's, out of its rings, and its in-flight token handed back to the step
        in flight (the plain update applies it; ``sort_individual`` keeps that step's
        entries in running order).

        Registrations: vLLM has registered a member's full blocks up to ``t - 1`` tokens
        (``t`` applied: the last update registered ``computed - in_flight``), or up to
        ``t`` once this step's ``allocate_slots`` ran (``allocated``); the group deferred
        the unshareable ones, registered now (``KVCacheManager.free`` does not in async).
        """
        pending = self.pending
        assert pending is not None, f"member {request!r} without a step in flight (tuner bug)"
        self.materialize(request)
        host = self.host
        if self.caching:
            host.kv_cache_manager.cache_blocks(request,
                                               request.num_tokens - (0 if allocated else 1))
        if host.fenced:  # its last steps were group steps (block_fence)
            host.kv_cache_manager.members_left([request])  # type: ignore[attr-defined]
        self._leave(request)
        pending.individual.append((request, 1))
        pending.sampled.append(True)
        pending.sort_individual = True

    def _drop(self, request: SimRequest) -> None:
        """A member about to be preempted: it leaves; its in-flight token becomes stale
        output of the step in flight (``Scheduler.preempt_request``)."""
        self._depart(request)

    def dissolve(self) -> None:
        """Every member leaves (their in-flight tokens go back to the step in flight)."""
        members = [r for r in self.host.running if r.steady]
        super().dissolve()
        if members and self.host.fenced:  # their last steps were group steps (block_fence)
            self.host.kv_cache_manager.members_left(members)  # type: ignore[attr-defined]
        pending = self.pending
        if self.caching:  # as in _depart: vLLM registered up to t - 1 tokens
            cache_blocks = self.host.kv_cache_manager.cache_blocks
            for request in members:
                cache_blocks(request, request.num_tokens - 1)
        if members:
            assert pending is not None, "members without a step in flight (tuner bug)"
            pending.individual.extend((r, 1) for r in members)
            pending.sampled.extend([True] * len(members))
            pending.sort_individual = True
        self.others_stale = True

    # ------------------------------------------------------------------- schedule
    def run(self, out: SchedulerOutput, token_budget: int, plan: GroupPlan
            ) -> tuple[int, bool]:
        """The sync group step's pool work, then: members given their last token
        (``step.events``, the step's finishes) leave and are listed individually, the step
        records the members' decode context, and ``S`` moves. The other members' rings
        stay as they are (a member's phase holds while it is a member)."""
        budget, prefill_scheduled = super().run(out, token_budget, plan)
        step = out.group
        assert step is not None
        if step.events:
            for member in step.events:  # still running until the update: back in others
                self._depart(member, allocated=True)
                insort(self.others, member, key=seq_order)
                out.individual.append((member, 1))
            out.sort_individual = True
            step.events = []
        step.num_members = self.size
        step.sum_tokens = self.sum_tokens + self.size  # decode context: computed + 1 each
        self.S += 1
        return budget, prefill_scheduled

    def plain_step(self) -> None:
        """The scheduler ran a plain step: ``others`` no longer follows ``running``."""
        self.others_stale = True

    # ------------------------------------------------------------------- outputs
    def apply(self, out: SchedulerOutput, now_s: float, gaps: dict[float, int],
              finished: list[SimRequest]) -> None:
        """After the plain update of ``out``: every member got its token of that step at
        ``now_s`` (pooled gaps; members that joined with an older last token, one by
        one), ``G`` moves, and finished non-members leave ``others``."""
        if out.group is not None:
            out.group.expired = True
        odd, self.odd = self.odd, []
        n_main = self.size
        for member in odd:
            if member.steady:
                gap = now_s - member.last_token_s
                gaps[gap] = gaps.get(gap, 0) + 1
                n_main -= 1
        if n_main:
            gap = now_s - self.last_end_s
            gaps[gap] = gaps.get(gap, 0) + n_main
        self.G += 1
        self.sum_tokens += self.size
        self.last_end_s = now_s
        if self.others_stale:
            self.others = [r for r in self.host.running if not r.steady]
            self.others_stale = False
        elif finished:
            self.others = [r for r in self.others if r.status == _RUNNING]

    # ------------------------------------------------------------------- checks
    def check_invariants(self) -> None:
        """The class invariants between two calls (after an update), read through the
        accessors."""
        bs = self.block_size
        for r in self._checked_members():
            t = self.tokens(r)
            assert self.computed(r) == t, f"member {r!r}: computed != tokens"
            assert self.placeholders(r) == 1 and self.in_flight(r) == 1, (
                f"member {r!r}: not one token in flight")
            kinds = self.block_events(r, t)
            if self.output_tokens(r) == r.max_tokens - 2:
                kinds |= FINISHES
            self._check_filed(r, kinds)
            assert r.num_blocks == cdiv(t, bs), f"member {r!r}: blocks"
            assert self.output_tokens(r) <= r.max_tokens - 2, f"member {r!r}: too late"
