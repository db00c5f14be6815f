"""Speculative decoding: the twin against vLLM 0.33.0's ``Scheduler`` / ``AsyncScheduler``
fed the same drafts and accepted counts (tests/vllm/spec_cases.py), 100 % of steps
identical, the spec-decode counters equal, and per case the effect it is named after.

All cases run in one driver process (one vLLM import), cached for the module.
"""

from __future__ import annotations

from typing import Any

import pytest
from spec_cases import cases
from vllm_env import ParityRuns

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.xdist_group("vllm:tests/vllm/test_spec_parity.py")]

NAMES = [c.name for c in cases()]
results = ParityRuns(lambda _version: cases(), timeout_s=1800)


def _spec_counters(result: Any) -> dict[str, float]:
    return {k: v for k, v in result.counters.items() if k.startswith("spec_")}


@pytest.mark.parametrize("name", NAMES)
def test_spec_parity(name: str) -> None:
    report, twin, vllm = results()[name]
    assert report.num_compared > 0
    assert report.identical, report.format_text()
    assert report.identical_pct == 100.0
    assert not report.request_diffs, report.request_diffs  # finish steps, outputs, hits
    assert _spec_counters(vllm), "vLLM reported no spec-decode counters"
    assert _spec_counters(twin) == _spec_counters(vllm)


@pytest.mark.parametrize("name", NAMES)
def test_spec_case_exercised(name: str) -> None:
    """vLLM's side of each case did what the case is named after."""
    _, _, vllm = results()[name]
    c = vllm.counters
    drafts, accepted = c["spec_num_draft_tokens"], c["spec_num_accepted_tokens"]
    steps = [s.num_scheduled_tokens for s in vllm.steps]
    k = int(name.split("-k")[1][0])
    if "-a0" in name:
        assert drafts > 0 and accepted == 0
    elif "-a1" in name and not name.startswith("padding"):
        assert drafts > 0 and accepted == drafts
    elif "profile" in name or "pressure" in name or "agentic" in name:
        assert 0 < accepted < drafts
    # every verify schedules at most 1 + k tokens for a decoding request, and some 1 + k
    assert any(1 + k in s.values() for s in steps)
    if name.startswith("mid-burst"):
        # each request ends inside a burst: fewer steps than outputs
        assert c["num_finished"] == 4 and len(steps) < 7
    if name.startswith("padding"):
        admitted = [s for s in vllm.steps if "C" in s.cached_tokens]
        assert admitted and admitted[0].num_scheduled_tokens["C"] == 1 + k
        assert accepted < drafts  # the placeholder drafts were never accepted
    if name.startswith("follower"):
        assert next(r.num_cached_tokens for r in vllm.requests if r.request_id == "B") == 64
    if "pressure" in name or "agentic" in name:
        assert c["preemptions"] > 0
    if name.startswith("dynamic"):
        # the k followed the batch: verifies of k drafts and of fewer
        assert c["spec_num_drafts"] < drafts < k * c["spec_num_drafts"]
        spec = next(c for c in cases() if c.name == name).options.speculative
        assert len({spec.k_for_batch(len(s)) for s in steps if s}) == 3  # every range
