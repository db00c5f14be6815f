"""The decode group's members filed by phase (``tuner.sim.member_calendar``) against the
plain path.

The rings replace a per-event calendar: a member's block events come from its ring's
residue, and only its finish and the end of its shareable hashes are dated. What can go
wrong is a ring off by one (an opening or a fill a step early or late), a member kept in
its fill ring past its last shareable hash (a registration of a synthetic id) or one that
left a ring late (a preempted or finished member taking a block). These tests replay
generated traces whose output hashes end part-way through the output (so share ends fall
while requests are members), in both modes, with pools that preempt, and compare every
record with the plain path, with the per-step checks on (``_check_filed`` compares each
member's rings with ``block_events`` after every step).
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings as hyp_settings, strategies as st

from tuner.sim.decode_group import DecodeGroup
from tuner.sim.engine import Simulator
from tuner.sim.load import OpenLoop
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

from sim_helpers import assert_identical, check_result, nonlinear_step as step_time, random_trace


def _cut_output_hashes(trace: list, seed: int, block_size: int) -> list:
    """Each request gets output hashes for a random part of its output (none, some, all
    and more), so a member's last shareable fill falls anywhere in its decode."""
    rng = random.Random(seed)
    cut = []
    for req in trace:
        n = rng.randint(0, req.output_len // block_size + 2)
        hashes = [8_000_000_000_000 + rng.randrange(1 << 30) * 64 + j for j in range(n)]
        cut.append(replace(req, output_block_hashes=hashes if rng.random() < 0.8 else None))
    return cut


def _replay(trace: list, blocks: int, block_size: int, async_scheduling: bool, *,
            fast: bool) -> object:
    sim = Simulator(trace, SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=24),
                    CacheSettings(num_gpu_blocks=blocks, block_size=block_size), step_time,
                    load=OpenLoop(),
                    options=SimOptions(record_steps=True, async_scheduling=async_scheduling,
                                       fast_forward=fast, check_invariants=True))
    return sim.run()


def _count_share_ends(fn):
    """Run ``fn`` counting the members that left a fill ring at their share end."""
    ended = [0]
    original = DecodeGroup._end_shares

    def spy(self):
        ended[0] += len(self.share_ends.get(self.S, ()))
        original(self)

    DecodeGroup._end_shares = spy  # type: ignore[method-assign]
    try:
        result = fn()
    finally:
        DecodeGroup._end_shares = original  # type: ignore[method-assign]
    return result, ended[0]


@hyp_settings(max_examples=16, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 2, 4, 16]),
       async_scheduling=st.booleans(), tokens=st.sampled_from([600, 1500, 10_000]))
def test_rings_give_the_plain_path_records_generated(seed: int, block_size: int,
                                                     async_scheduling: bool,
                                                     tokens: int) -> None:
    """Records identical to the plain path (checks on), output hashes cut anywhere."""
    trace = _cut_output_hashes(
        random_trace(seed, 30, block_size=block_size, max_input=300 if block_size > 1 else 80,
                     max_output=200, rate=30.0),
        seed, block_size)
    blocks = max(8, tokens // block_size)
    plain = _replay(trace, blocks, block_size, async_scheduling, fast=False)
    check_result(trace, plain)
    fast, ended = _count_share_ends(
        lambda: _replay(trace, blocks, block_size, async_scheduling, fast=True))
    assert_identical(plain, fast)
    event("share ends while members" if ended else "no share end")
    if plain.counters["preemptions"]:
        event("preempts")


def test_share_ends_fall_while_requests_are_members() -> None:
    """The generated test above is not vacuous: in both modes members leave their fill
    ring at a share end (with a synthetic hash after it), with and without preemptions."""
    trace = _cut_output_hashes(random_trace(7, 30, block_size=4, max_output=200, rate=30.0),
                               7, 4)
    for async_scheduling in (False, True):
        for blocks in (4_000, 250):
            plain = _replay(trace, blocks, 4, async_scheduling, fast=False)
            fast, ended = _count_share_ends(
                lambda: _replay(trace, blocks, 4, async_scheduling, fast=True))
            assert_identical(plain, fast)
            assert ended > 0
            assert (plain.counters["preemptions"] > 0) == (blocks == 250)
