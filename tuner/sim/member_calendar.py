"""``MemberCalendar``: the decode group's members filed by *phase*, not by event.

Why: a member does something observable only at its events (it opens a block, fills a
shareable one, or gets its last token), and its block events are periodic: it opens a
block every ``block_size`` steps, at the group steps ``K`` with ``K % block_size`` equal
to its *phase* (its true tokens at ``K`` grow with ``K``, one a step, so the residue is
fixed while it is a member), and fills one at a fixed residue too (a step before in sync,
at the same step in async). Filing each member's next event in a calendar cost a Python
filing per event (~800k an hour) and a filter and sort per step. Instead the members sit
in **rings**, one list per residue kept in running order: the step at key ``S`` opens a
block for every member of ``rings[S % block_size]`` and fills one for every member of
``fill_rings[S % block_size]``, as they stand (no filing, no filter, no sort). Only what
is not periodic is dated: a member's finish (``finishes``, its ``finish_step``) and the
end of its shareable hashes (``share_ends``: after its ``share_end`` step it leaves its
fill ring; later fills carry synthetic hashes that ``KVCacheManager.free`` registers).

A member's key ``S`` (the group's scheduled-step clock) relates to its true tokens ``t``
at that step by a constant while it is a member; ``_place`` reads it at join. Sync: the
token computed at ``S`` opens a block when ``(t - 1) % bs == 0`` and the computed tokens
fill one when ``t % bs == 0`` (``block_events``); async (``AsyncDecodeGroup``, tokens as
applied when the step is scheduled): both when ``t % bs == 0``. The mode's offset
(``OPEN_OFFSET``) and finishing lead (``FINISH_LEAD``: sync finishes at output
``max_tokens - 1``, async at the schedule of its last token, ``max_tokens - 2`` applied)
are class attributes.

``check_invariants`` (``DecodeGroupInvariants._check_filed``) compares, for every member
after each checked step, the kinds the rings and calendars give it at the next step with
``block_events``, and that it sits in exactly the rings and calendars its fields name.
"""

from __future__ import annotations

from bisect import insort
from operator import attrgetter
from typing import TYPE_CHECKING

from tuner.sim.decode_group_invariants import FILLS_BLOCK, OPENS_BLOCK
from tuner.sim.request import RequestStatus

if TYPE_CHECKING:
    from tuner.sim.request import SimRequest
    from tuner.sim.scheduler_output import GroupStep

__all__ = ["MemberCalendar", "seq_order"]

#: Sort key: running order (admission sequence number); C-level, no Python call.
seq_order = attrgetter("seq")


class MemberCalendar:
    """The members' rings, the dated events and the event rules of the decode group; a
    mixin over the group's attributes (``rings``, ``fill_rings``, ``finishes``,
    ``share_ends``, ``S``, ...; see the module doc)."""

    __slots__ = ()

    #: Sync: a member opens a block at the key where its true tokens are 1 mod bs.
    OPEN_OFFSET = 1
    #: Sync: a member finishes at the step where its output tokens are max_tokens - 1.
    FINISH_LEAD = 1

    def block_events(self, request: SimRequest, num_tokens: int) -> int:
        """The block rules, in one place: ``OPENS_BLOCK | FILLS_BLOCK`` bits of what a
        member with ``num_tokens`` true tokens does when it computes its next token.

        It opens a block when that token (position ``num_tokens - 1``) is the first of
        one; its computed tokens fill a block when ``num_tokens`` is a multiple of the
        block size, and the fill is registered now only if the block's hash is one
        another request can look up (a synthetic one waits for ``KVCacheManager.free``).
        ``_place`` turns this rule into a member's phase and share end;
        ``check_invariants`` compares every member's rings with this method after each
        checked step.
        """
        bs = self.block_size
        kinds = OPENS_BLOCK if (num_tokens - 1) % bs == 0 else 0
        if (self.caching and num_tokens % bs == 0
                and num_tokens // bs <= request.num_shared_hash_blocks):
            kinds |= FILLS_BLOCK
        return kinds

    def fill_residue(self, request: SimRequest) -> int:
        """The residue (mod block size) of the keys at which ``request`` fills a block."""
        return (request.phase - self.OPEN_OFFSET) % self.block_size

    def _place(self, request: SimRequest) -> None:
        """File a joining member (counters as of the key ``S`` about to be scheduled):
        its ring, its fill ring while a shareable fill is ahead, and its finish.

        With ``t`` true tokens at key ``S`` its tokens at key ``K`` are ``t + K - S``, so
        it fills at the keys ``K = S - t (mod bs)`` and opens at ``OPEN_OFFSET`` later;
        its last shareable fill is at ``t + K - S = num_shared_hash_blocks * bs`` tokens.
        """
        bs = self.block_size
        key = self.S
        lag = self.G - request.g0  # tokens(request) - request.num_tokens, inlined
        t = request.num_tokens + lag
        fill = (key - t) % bs
        phase = (fill + self.OPEN_OFFSET) % bs
        request.phase = phase
        insort(self.rings[phase], request, key=seq_order)
        share_end = -1
        if self.caching:
            last = key + request.num_shared_hash_blocks * bs - t
            if last >= key:
                share_end = last
                insort(self.fill_rings[fill], request, key=seq_order)
                bucket = self.share_ends.get(last)
                if bucket is None:
                    self.share_ends[last] = [request]
                else:
                    bucket.append(request)
        request.share_end = share_end
        finish = key + request.max_tokens - self.FINISH_LEAD - (request.num_output_tokens + lag)
        request.finish_step = finish
        bucket = self.finishes.get(finish)
        if bucket is None:
            self.finishes[finish] = [request]
        else:
            bucket.append(request)

    def _unplace(self, request: SimRequest) -> None:
        """Take a member out of its rings and dated events (it leaves the group)."""
        self.rings[request.phase].remove(request)
        if request.share_end >= 0:  # still in its fill ring (``_end_shares`` resets it)
            self.fill_rings[self.fill_residue(request)].remove(request)
            bucket = self.share_ends.get(request.share_end)
            if bucket is not None and request in bucket:
                bucket.remove(request)
        bucket = self.finishes.get(request.finish_step)
        if bucket is not None and request in bucket:
            bucket.remove(request)
        request.phase = request.share_end = request.finish_step = -1

    def _end_shares(self) -> None:
        """After the pool work of key ``S``: members whose last shareable fill was at
        ``S`` leave their fill ring (their later fills carry synthetic hashes)."""
        ended = self.share_ends.pop(self.S, None)
        if ended:
            fill_ring = self.fill_rings[self.S % self.block_size]
            for member in ended:
                fill_ring.remove(member)
                member.share_end = -1

    def apply_tokens(self, step: GroupStep, now_s: float, gaps: dict[float, int],
                     finished: list[SimRequest]) -> None:
        """Every member of ``step`` got one token at ``now_s``: pool the gaps, advance
        ``G``; the step's finishing members (``step.events``) finish (appended to
        ``finished``). No other member is touched: its rings stay as they are."""
        step.expired = True
        odd, self.odd = self.odd, []
        n_main = step.num_members
        for member in odd:
            if member.steady:  # joined with an older last token: its own gap
                gap = now_s - member.last_token_s
                gaps[gap] = gaps.get(gap, 0) + 1
                n_main -= 1
        if n_main:
            gap = now_s - self.last_end_s
            gaps[gap] = gaps.get(gap, 0) + n_main
        self.G += 1
        self.S += 1
        self.sum_tokens += step.num_members
        self.last_end_s = now_s
        for member in step.events:
            self.materialize(member)
            self._leave(member)
            member.status = RequestStatus.FINISHED
            member.finish_s = now_s
            finished.append(member)
