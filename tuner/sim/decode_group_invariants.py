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

#: What a member does at a step (bits; ``MemberCalendar``'s rings and finishes give them).
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
            # What the rules say it does at the next step: what its rings and finish
            # give it (the rings never skip an event).
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
        self._check_rings(members)
        return members

    def _check_filed(self, r: SimRequest, kinds: int) -> None:
        """``r``'s event kinds at the next key ``S`` are what its rings and dated events
        give it (its ring opens a block, its fill ring fills one, its finish step), and
        it is filed exactly where its fields say (the rings never skip an event)."""
        key = self.S
        residue = key % self.block_size
        due = OPENS_BLOCK if r.phase == residue else 0
        if r.share_end >= 0 and self.fill_residue(r) == residue:
            due |= FILLS_BLOCK
        if r.finish_step == key:
            due |= FINISHES
        assert kinds == due, f"member {r!r}: event kinds {kinds}, filed {due}"
        assert r in self.rings[r.phase], f"member {r!r} not in its ring"
        assert r.finish_step >= key and r in self.finishes.get(r.finish_step, ()), (
            f"member {r!r} not filed under its finish")
        in_fill_ring = r in self.fill_rings[self.fill_residue(r)]
        if r.share_end >= 0:
            assert r.share_end >= key and in_fill_ring and r in self.share_ends[r.share_end], (
                f"member {r!r}: a shareable fill ahead, not filed for it")
        else:
            assert not in_fill_ring, f"member {r!r} in a fill ring past its shareable hashes"

    def _check_rings(self, members: list[SimRequest]) -> None:
        """The rings and dated events hold exactly the members, each once, the rings in
        running order (a member that left is in none of them)."""
        rings = [m for ring in self.rings for m in ring]
        assert len(rings) == len(members) and {id(m) for m in rings} == {id(m) for m in members}, (
            "rings != members")
        for ring in (*self.rings, *self.fill_rings):
            assert all(m.steady for m in ring), "a ring holds a request that left"
            seqs = [m.seq for m in ring]
            assert seqs == sorted(seqs), "a ring not in running order"
        assert sum(len(b) for b in self.finishes.values()) == len(members), (
            "finishes != members")
        assert sum(len(ring) for ring in self.fill_rings) == sum(
            len(b) for b in self.share_ends.values()), "fill rings != share ends"
