"""Disaggregated prefill/decode step for step: each pool engine of a 1:1 twin replay
against vLLM 0.33.0's own ``Scheduler`` / ``AsyncScheduler`` with ``NixlPullConnectorScheduler``
(tests/vllm/pd_cases.py, tuner/vllm_core/disagg.py): 100 % of steps identical on both
engines (scheduled tokens, local hits per admission, the decoder's requests in
``WAITING_FOR_REMOTE_KVS``, KV usage including the prefill side's held blocks, running
and waiting counts), and per case the effect it is named after.

All cases run in one driver process (one vLLM import), cached for the module.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pd_cases import cases, jobs, run_twin
from vllm_env import MODEL_DIR, vllm_python

from tuner.fidelity.parity import diff_step

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.xdist_group("vllm:tests/vllm/test_pd_parity.py")]

CASES = cases()
NAMES = [c.name for c in CASES]
_RESULTS: dict[str, Any] = {}
#: case name -> per engine, per schedule: vLLM's (has_unfinished_requests,
#: has_pending_push_work) before it
_PROBES: dict[str, Any] = {}
#: case name -> per engine, the same pair after the twin's last call on it
_AFTER_LAST: dict[str, Any] = {}


def results() -> dict[str, Any]:
    """Case name -> (case run on the twin, vLLM's prefill steps, vLLM's decode steps)."""
    if not _RESULTS:
        from tuner.vllm_core.backend import run_driver

        python = vllm_python("0.33")
        done = [run_twin(c) for c in CASES]
        out = run_driver([j for c in done for j in jobs(c, str(MODEL_DIR))], python,
                         timeout_s=1800)
        for k, case in enumerate(done):
            prefill, decode = out[2 * k], out[2 * k + 1]
            _RESULTS[case.name] = (case, prefill["steps"], decode["steps"])
            _PROBES[case.name] = (prefill["has_requests"], decode["has_requests"])
            _AFTER_LAST[case.name] = (prefill["after_last"], decode["after_last"])
    return _RESULTS


def _diffs(twin: list[Any], vllm: list[Any]) -> list[tuple[int, dict]]:
    return [(i, d) for i, (a, b) in enumerate(zip(twin, vllm)) if (d := diff_step(a, b))]


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize("name", NAMES)
def test_pd_parity(name: str, role: str) -> None:
    case, prefill, decode = results()[name]
    twin = getattr(case.twin, role)[0].steps
    vllm = prefill if role == "prefill" else decode
    assert len(twin) > 0 and len(twin) == len(vllm)
    assert not _diffs(twin, vllm), _diffs(twin, vllm)[:3]


def _waiting(steps: list[Any]) -> set[str]:
    return {rid for s in steps for rid in s.waiting_for_kv}


@pytest.mark.parametrize("name", NAMES)
def test_pd_steps_when_vllm_would(name: str) -> None:
    """Every schedule the twin ran on an engine is one vLLM's engine core runs: its
    ``Scheduler.has_requests`` was true there (unfinished requests, or for push the
    held blocks' ``has_pending_push_work``), a push prefill instance took steps for
    its held blocks alone (a pull one never has push work), and after the twin's last
    call on an engine vLLM's would not step again."""
    case, _, _ = results()[name]
    for role, probe in zip(("prefill", "decode"), _PROBES[name]):
        idle = [i for i, (live, push) in enumerate(probe) if not (live or push)]
        assert not idle, (role, idle[:5])
    # and the twin stopped stepping only where vLLM would: nothing live, no push pending
    # (a push prefill instance that stopped at its last request kept its writes' blocks)
    assert _AFTER_LAST[name] == ((False, False), (False, False)), _AFTER_LAST[name]
    push_only = [i for i, (live, push) in enumerate(_PROBES[name][0]) if push and not live]
    if case.pd.variant == "push":
        # the prefill instance stepped only for its held blocks, as vLLM's would
        assert push_only
    else:
        assert not any(push for _, push in _PROBES[name][0])


@pytest.mark.parametrize("name", NAMES)
def test_pd_case_exercised(name: str) -> None:
    """vLLM's side of each case did what the case is named after."""
    case, prefill, decode = results()[name]
    if name.startswith("push-"):
        _push_exercised(case, prefill)
        name = name.removeprefix("push-")  # and what its pull twin is named after
    ids = {r.request_id for r in case.requests}
    assert _waiting(decode) == ids  # every request waited for its read on the decoder
    sim = case.twin
    if name.startswith("decoder-local-hit"):
        hits = {rid: n for s in decode for rid, n in s.cached_tokens.items()}
        assert hits["b"] == 320  # a's 20 blocks, local on the decoder
        assert sim.decode[0].connector.read_blocks < sum(
            -(-r.input_len // 16) for r in case.requests)
    if name.startswith("decoder-kv-full"):
        assert sim.decode[0].scheduler.num_preemptions > 0
        assert max(s.kv_usage for s in decode) > 0.9
        full = [s for s in decode if s.kv_usage > 0.85 and s.waiting_for_kv]
        assert full  # a read in flight while the decoder's cache is (nearly) full
    if name.startswith("hetero-tp"):
        # the same requests at TP 1 -> 1 pull in a quarter of the link time (less the
        # per-read latency)
        same = run_twin(dataclasses.replace(case, pd=dataclasses.replace(case.pd, decode_tp=1)))
        fast = same.twin.decode[0].connector
        slow = sim.decode[0].connector
        latency = case.pd.link_latency_s * slow.num_reads
        assert slow.read_s - latency == pytest.approx(4 * (fast.read_s - latency))
    if name.startswith("abort-in-transfer"):
        statuses = {r.request_id: r.status for r in sim.table}
        aborted = {rid for rid, st in statuses.items() if st == "aborted"}
        assert aborted == {"h2", "h5"}, statuses
        connector = sim.decode[0].connector
        assert connector.num_aborted_in_flight == 2
        for rid in aborted:
            index = next(i for i, r in enumerate(case.requests) if r.request_id == rid)
            start, end = sim.reads[index]
            when = case.aborts[index]
            assert start < when < end  # aborted with its read in flight
            # vLLM's decoder stops listing it as waiting for KV at the abort ...
            waited = [s.start_s for s in decode if rid in s.waiting_for_kv]
            assert waited and max(waited) < end
            # ... and holds its blocks until the read is reported
            assert end <= connector.aborted_freed_s[rid]
        # the reads went on: the prefill side released every held block at their ends
        assert all(e.connector.num_held_blocks == 0 for e in sim.prefill)
    if name.startswith("prefill-held-full"):
        # held blocks fill the prefill cache: some step saw it full with nothing running
        assert max(s.kv_usage for s in prefill) > 0.9
        assert any(s.num_running == 0 and s.num_waiting > 0 for s in prefill)


def _push_exercised(case: Any, prefill: list[Any]) -> None:
    """A push case: the prefill instance wrote every transfer, serialized on its own
    link, each ready one link latency after the decoder's registration went out."""
    sim = case.twin
    writer = sim.prefill[0].connector
    assert type(writer).__name__ == "NixlPushPrefillConnector"
    assert writer.write_s == pytest.approx(sim.decode[0].connector.read_s)
    spans = sorted(sim.reads.values())
    assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))  # one link
    starts = [e[2] for e in case.events["decode"] if e[0] == "start"]
    latency = case.pd.link_latency_s
    for start, _ in spans:  # no write before a registration had time to arrive
        assert any(s + latency <= start + 1e-12 for s in starts)
