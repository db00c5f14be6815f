"""``DecodeGroupInvariants``: the decode group's class invariants, as checks.

Why a module of its own: the checks are read by tests and the debug flag only, never on
the replay's path, and they read the group through its accessors exactly as the step
does; keeping them beside the step made ``decode_group.py`` the longest module of the
twin. ``DecodeGroup`` (and through it ``AsyncDecodeGroup``, which adds its own per-member
checks on top of ``_checked_members`` and ``_check_filed``) inherits them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.sim._step_rules import cdiv

if TYPE_CHECKING:
    from tuner.sim.request import SimRequest

__all__ = ["DecodeGroupInvariants", "FILLS_BLOCK", "FINISHES", "OPENS_BLOCK"]

#: What a member does at its event step (``SimRequest.event_kinds``, bits).
OPENS_BLOCK = 1  # the token it computes opens a new block: it takes one from the pool
FILLS_BLOCK = 2  # its computed tokens fill a block whose hash others can look up: register
FINISHES = 4  # the step gives it its last token


class DecodeGroupInvariants:
    """The checks ``DecodeGroup.check_invariants`` runs (see ``DecodeGroup``'s docstring
    for the invariants themselves); a mixin over the group's own attributes."""

    __slots__ = ()

    def check_invariants(self) -> None:
        """The class invariants, read through the accessors (nothing is materialised, so
        a checked replay takes the same path as an unchecked one)."""
        bs = self.block_size
        for r in self._checked_members():
            assert self.computed(r) == self.tokens(r) - 1, f"member {r!r} not decoding"
            # What the rules say it does this step: its filed kinds when due now, else
            # nothing (the calendar never skips an event).
            kinds = self.block_events(r, self.tokens(r))
            if self.output_tokens(r) == r.max_tokens - 1:
                kinds |= FINISHES
            self._check_filed(r, kinds)
            assert r.num_blocks == cdiv(self.computed(r), bs), f"member {r!r}: blocks"
            assert self.output_tokens(r) < r.max_tokens, f"member {r!r} past max_tokens"

    def _checked_members(self) -> list[SimRequest]:
        """The group-level invariants both scheduling modes share (size, token sum,
        non-members, seq order), checked; the members, for each mode's per-member checks."""
        running = self.host.running
        members = [r for r in running if r.steady]
        assert len(members) == self.size, "group size != members in running"
        assert sum(self.tokens(r) for r in members) == self.sum_tokens, "group token sum"
        assert [r for r in running if not r.steady] == self.others, "others != non-members"
        seqs = [r.seq for r in running]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "running not in seq order"
        return members

    def _check_filed(self, r: SimRequest, kinds: int) -> None:
        """``r``'s event kinds due this step are what its calendar entry says, and it is
        filed under its next event (the calendar never skips one)."""
        due = r.event_kinds if r.next_event == self.S else 0
        assert kinds == due, f"member {r!r}: event kinds {kinds}, filed {due}"
        assert r.next_event >= self.S and r in self.calendar.get(r.next_event, ()), (
            f"member {r!r} not filed under its next event")
