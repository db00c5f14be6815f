"""``SchedulerOutput``: what one ``Scheduler.schedule()`` call decided.

The twin's trimmed ``vllm/v1/core/sched/output.py`` @ 0.33.0. A step is decided either by
the plain path (every scheduled request listed one by one) or by a group step of the
decode group (``tuner.sim.decode_group``), where each group member gets one token and
only the requests outside the group are listed. ``SchedulerOutput.items()`` is the one
way to see every scheduled request whichever path ran; ``individual`` never changes
meaning (the requests the step handled one by one), and ``group`` is ``None`` on the
plain path.

Lifetime: like vLLM's, an output describes the step it was made for. A group step's
``items()`` reads the group's membership, which the scheduler changes when it applies
the step's output or schedules the next step, so ``items()`` of a group step is valid
until then and raises afterwards (``GroupStep.expired``). Under async scheduling (issue
14) step N+1 is scheduled before N's output is applied, so a caller that wants N's
records takes them right after ``schedule()``, as the replay loop does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Protocol

from tuner.sim.batch import StepBatch
from tuner.sim.request import SimRequest


class GroupMembership(Protocol):
    """The decode group's answer to "is this running request a member?"."""

    def is_member(self, request: SimRequest) -> bool: ...


@dataclass(slots=True)
class GroupStep:
    """The decode group's share of a group step: each of ``num_members`` members was
    scheduled with one token (``tuner.sim.decode_group``)."""

    num_members: int  # group members scheduled this step, one token each
    sum_tokens: int  # sum of their num_tokens before the step (= their decode context)
    events: list[SimRequest]  # members that get their last token this step, running order
    running: list[SimRequest]  # the scheduler's running list (members + others, in order)
    membership: GroupMembership  # who of ``running`` is a member (valid until expired)
    expired: bool = False  # set once the scheduler moved on (update or next schedule)


@dataclass(slots=True)
class SchedulerOutput:
    """What one ``schedule()`` call decided (vLLM's ``SchedulerOutput``, trimmed)."""

    # (request, tokens scheduled) handled one by one, in vLLM's dict order (running loop,
    # then admissions): every scheduled request on the plain path; on a group step every
    # scheduled request outside the decode group.
    individual: list[tuple[SimRequest, int]] = field(default_factory=list)
    total_num_scheduled_tokens: int = 0  # every scheduled token, group members included
    preempted: list[SimRequest] = field(default_factory=list)  # during this step
    admitted: list[tuple[SimRequest, int]] = field(default_factory=list)  # (req, local hit)
    batch: StepBatch = field(default_factory=StepBatch)  # aggregate work for the step time
    deferred: bool = False  # prefill_schedule_interval held prefill back this step
    group: GroupStep | None = None  # the decode group's share; None on the plain path
    # Async scheduling: per ``individual`` entry, whether the step samples a token for
    # it (decided at schedule time, tuner.sim.async_update.place_outputs); empty in sync.
    sampled: list[bool] = field(default_factory=list)
    # Async fast path: entries were added to ``individual`` out of running order (a decode
    # group member left while the step was in flight); the update applies them in order.
    sort_individual: bool = False
    # Speculative decoding: vLLM's ``scheduled_spec_decode_tokens`` as request ->
    # (drafts verified this step, whether they are padding placeholders); None when the
    # step verifies none (always without speculative decoding: no per-step cost).
    spec_tokens: "dict[SimRequest, tuple[int, bool]] | None" = None

    def items(self) -> Iterator[tuple[SimRequest, int]]:
        """Every scheduled (request, tokens), in vLLM's order, whichever path ran.

        A group step interleaves members (one token each) with the individually
        scheduled requests in running order; admissions are at the end of running, so
        the order is vLLM's (running loop, then admissions).
        """
        group = self.group
        if group is None:
            yield from self.individual
            return
        if group.expired:
            raise RuntimeError("SchedulerOutput.items() of a group step read after the "
                               "scheduler applied it or scheduled the next step (tuner bug)")
        is_member = group.membership.is_member
        others = {id(r): n for r, n in self.individual}
        get = others.get
        for request in group.running:
            if is_member(request):
                yield request, 1
            else:
                n = get(id(request))
                if n is not None:
                    yield request, n

    def num_scheduled_tokens(self) -> dict[str, int]:
        """request id -> tokens scheduled, in vLLM's order (vLLM's field of this name)."""
        return {r.request_id: n for r, n in self.items()}
