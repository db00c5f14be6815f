"""``MemberCalendar``: when each member of the decode group next does something.

Why a module of its own: a member does something observable only at its *events* (it
opens a block, fills a shareable one, or gets its last token); the rest of its steps are
the group's shared counter. This mixin holds the rules that find the next event
(``block_events``, ``_file``), the calendar read of a step's due members
(``_due_events``) and the filing after a group step's tokens are applied
(``apply_tokens``). ``DecodeGroup`` (``tuner.sim.decode_group``) keeps membership, the
plan and the pool work of a step; ``AsyncDecodeGroup`` overrides ``block_events`` and
``_file`` with its own clock's rules. It reads and writes the group's own attributes
(``G``, ``S``, ``calendar``, ``odd``, ...), declared in ``DecodeGroup.__slots__``.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

from tuner.sim.decode_group_invariants import FILLS_BLOCK, FINISHES, OPENS_BLOCK
from tuner.sim.request import RequestStatus

if TYPE_CHECKING:
    from tuner.sim.request import SimRequest
    from tuner.sim.scheduler_output import GroupStep

__all__ = ["MemberCalendar", "seq_order"]

#: Sort key: running order (admission sequence number); C-level, no Python call.
seq_order = attrgetter("seq")


class MemberCalendar:
    """The event rules and the calendar's filing of the decode group; a mixin over the
    group's attributes (see the module doc)."""

    __slots__ = ()

    def block_events(self, request: SimRequest, num_tokens: int) -> int:
        """The block rules, in one place: ``OPENS_BLOCK | FILLS_BLOCK`` bits of what a
        member with ``num_tokens`` true tokens does when it computes its next token.

        It opens a block when that token (position ``num_tokens - 1``) is the first of
        one; its computed tokens fill a block when ``num_tokens`` is a multiple of the
        block size, and the fill is registered now only if the block's hash is one
        another request can look up (a synthetic one waits for ``KVCacheManager.free``).
        ``_file`` inlines this rule (it runs once per member event), as ``apply_tokens``
        does for the opening after a fill; ``check_invariants`` compares every member's
        filed kinds with this method after each checked step.
        """
        bs = self.block_size
        kinds = OPENS_BLOCK if (num_tokens - 1) % bs == 0 else 0
        if (self.caching and num_tokens % bs == 0
                and num_tokens // bs <= request.num_shared_hash_blocks):
            kinds |= FILLS_BLOCK
        return kinds

    def _file(self, request: SimRequest) -> None:
        """File a member in the calendar under its next event, the first group step >= G
        where ``block_events`` is not empty or it gets its last token, with the kinds of
        event (``event_kinds``), so the group step reads bits instead of re-deriving them.

        The first block event is found without trying every step: a block opens every
        ``block_size`` tokens, at ``k = (1 - t) % block_size`` steps from now, and one
        fills at ``(-t) % block_size`` (``t`` = true tokens); ``block_events`` at the
        chosen step decides which actually happen.
        """
        bs = self.block_size
        lag = self.G - request.g0  # self.tokens / self.output_tokens, inlined
        t = request.num_tokens + lag
        k = (1 - t) % bs  # steps until the computed token opens a block
        caching = self.caching
        if caching:
            k_reg = (-t) % bs  # steps until the computed tokens fill a block
            if k_reg < k and (t + k_reg) // bs <= request.num_shared_hash_blocks:
                k = k_reg
        k_fin = request.max_tokens - 1 - (request.num_output_tokens + lag)
        kinds = 0
        if k_fin <= k:
            k = k_fin
            kinds = FINISHES
        t += k  # block_events(request, t + k), inlined (check_invariants compares them)
        if (t - 1) % bs == 0:
            kinds |= OPENS_BLOCK
        if caching and t % bs == 0 and t // bs <= request.num_shared_hash_blocks:
            kinds |= FILLS_BLOCK
        event = self.S + k
        request.next_event = event
        request.event_kinds = kinds
        bucket = self.calendar.get(event)
        if bucket is None:
            self.calendar[event] = [request]
        else:
            bucket.append(request)

    def _due_events(self) -> list[SimRequest]:
        """Members with an event at step ``G``, in running order (the calendar is read,
        not changed: a plan that fails leaves it as it was)."""
        bucket = self.calendar.get(self.S)
        if not bucket:
            return []
        g = self.S
        events = [r for r in bucket if r.steady and r.next_event == g]
        events.sort(key=seq_order)
        return events

    def apply_tokens(self, step: GroupStep, now_s: float, gaps: dict[float, int],
                     finished: list[SimRequest]) -> None:
        """Every member of ``step`` got one token at ``now_s``: pool the gaps, advance
        ``G``; members with an event finish (appended to ``finished``) or are filed
        under their next event."""
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
        g, key = self.G, self.S
        # After a fill-only event the next token opens a block (block size > 1; finishing
        # there if it is the last): half the sync events, filed without ``_file``.
        openers: list[SimRequest] = []
        fill_only = FILLS_BLOCK if self.block_size > 1 else -1
        for member in step.events:
            kinds = member.event_kinds
            if kinds == fill_only:
                member.next_event = key
                member.event_kinds = (
                    OPENS_BLOCK if member.max_tokens - member.num_output_tokens + member.g0 - g > 1
                    else OPENS_BLOCK | FINISHES)
                openers.append(member)
                continue
            if kinds & FINISHES:
                self.materialize(member)
                self._leave(member)
                member.status = RequestStatus.FINISHED
                member.finish_s = now_s
                finished.append(member)
                continue
            self._file(member)
        if openers:
            bucket = self.calendar.get(key)
            if bucket is None:
                self.calendar[key] = openers
            else:
                bucket.extend(openers)
