"""Parity cases for speculative decoding: vLLM's ``Scheduler`` / ``AsyncScheduler`` fed
draft tokens and accepted counts from the twin's seeded acceptance profile
(``tuner.sim.spec_decode``), against the twin, each in both scheduling modes.

Each case is small and aimed at one rule (tuner/sim/spec_update.py): k = 1, 3, 5;
acceptance 0 (every draft rejected, computed tokens rolled back) and 1 (every burst
complete); bursts that end a request mid-burst (``max_tokens`` inside the accepted
tokens); lookahead slots (eagle3) with KV pressure and preemption; a burst completing a
block a follower then hits; PR #54625's eviction scenario with drafts; a per-batch-size
k (``num_speculative_tokens_per_batch_size``, with a gap between ranges) on chat and on
agentic traffic under KV pressure.
"""

from __future__ import annotations

import dataclasses

from parity_cases import BS, agentic_trace, chat_trace, pr_eviction_requests, target

from tuner.fidelity.parity import ParityCase
from tuner.sim.settings import SchedulerSettings, SimOptions
from tuner.sim.spec_decode import from_vllm_config
from tuner.trace.request import TraceRequest


def _blocks(tag: int, n: int) -> tuple[int, ...]:
    return tuple(tag * 1000 + i for i in range(n))


def spec(method: str, k: int, acceptance: str,  # type: ignore[no-untyped-def]
         per_batch: list[list[int]] | None = None):
    extra = {} if per_batch is None else {"num_speculative_tokens_per_batch_size": per_batch}
    return from_vllm_config({"method": method, "num_speculative_tokens": k, **extra},
                            acceptance, seed=7)


def mid_burst_requests() -> list[TraceRequest]:
    """Outputs of 2, 3, 5 and 7 tokens under k = 5 and full acceptance: each request
    ends inside its first or second burst (the stop trims the burst)."""
    return [TraceRequest(f"m{n}", 0.0, 30 + n, n, _blocks(n, (30 + n) // BS))
            for n in (2, 3, 5, 7)]


def follower_requests() -> list[TraceRequest]:
    """A's accepted burst completes its block 2 (prompt 40, output blocks traced); B,
    arriving later with A's prompt and output as its prompt, hits the registered block."""
    a = TraceRequest("A", 0.0, 40, 30, _blocks(1, 2), output_block_hashes=_blocks(9, 2))
    b = TraceRequest("B", 0.05, 70, 4, _blocks(1, 2) + _blocks(9, 2)[:2])
    return [a, b]


def padding_requests() -> list[TraceRequest]:
    """C's 49-token prompt is A's 48 cached tokens plus one: admitted with one token left
    while A decodes, vLLM pads it to 1 + k tokens with k placeholder drafts (never
    accepted)."""
    return [TraceRequest("A", 0.0, 48, 30, _blocks(5, 3)),
            TraceRequest("C", 0.02, 49, 10, _blocks(5, 3))]


def pressure_requests() -> list[TraceRequest]:
    """Four decodes outgrow an 12-block cache with 3 lookahead slots each: preemption
    with drafts in flight."""
    return [TraceRequest(f"p{i}", 0.001 * i, 30, 40, _blocks(20 + i, 1)) for i in range(4)]


def cases(version: str = "0.33") -> list[ParityCase]:
    """Every spec-decode parity case, sync and async."""
    small = SchedulerSettings(max_num_batched_tokens=8192, max_num_seqs=16)
    pressure = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=64)
    chat = SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=32,
                             long_prefill_token_threshold=64)
    out: list[ParityCase] = []
    for mode in (False, True):
        tag = "async" if mode else "sync"

        def case(name: str, trace: object, settings: SchedulerSettings, blocks: int,
                 sd: object) -> None:
            if mode and sd.method == "ngram":  # type: ignore[attr-defined]
                # vLLM's V1 runner has no async scheduling with n-gram drafts
                # (config/vllm.py:1651-1683): the async twin of the case drafts with MTP
                sd = spec("mtp", sd.num_speculative_tokens,  # type: ignore[attr-defined]
                          ",".join(map(str, sd.acceptance)),  # type: ignore[attr-defined]
                          sd.vllm_config.get(  # type: ignore[attr-defined]
                              "num_speculative_tokens_per_batch_size"))
            opts = SimOptions(async_scheduling=mode, speculative=sd)
            tgt = target(blocks, async_scheduling=mode)
            out.append(ParityCase(f"{name}-{tag}", trace, settings, tgt, options=opts,
                                  hash_block_size=BS))

        case("ngram-k1-a0", chat_trace(), chat, 600, spec("ngram", 1, "0"))
        case("ngram-k3-profile", chat_trace(), chat, 600, spec("ngram", 3, "0.8,0.6,0.45"))
        case("ngram-k5-a1", chat_trace(), chat, 600, spec("ngram", 5, "1"))
        case("mid-burst-k5-a1", mid_burst_requests(), small, 200, spec("ngram", 5, "1"))
        case("follower-k3-a1", follower_requests(), small, 200, spec("ngram", 3, "1"))
        case("padding-k3-a1", padding_requests(), small, 200, spec("ngram", 3, "1"))
        eviction = [dataclasses.replace(r, output_len=3) for r in pr_eviction_requests()]
        case("pr-eviction-k3", eviction, small, 6, spec("ngram", 3, "0.7"))
        window = small.replace(cache_aware_admission_window=4,
                               cache_aware_admission_threshold=0.0)  # the plugin's classes
        case("pr-eviction-w4-k3", eviction, window, 6, spec("ngram", 3, "0.7"))
        case("agentic-pressure-k3", agentic_trace(), pressure, 200,
             spec("ngram", 3, "0.8,0.6,0.45"))
        case("eagle3-pressure-k3", pressure_requests(), small, 12,
             spec("eagle3", 3, "0.7,0.5,0.3"))
        case("eagle3-agentic-k4", agentic_trace(), pressure, 200,
             spec("eagle3", 4, "2.5"))
        # num_speculative_tokens_per_batch_size: each step's k by its batch (no padding)
        case("dynamic-chat-k3", chat_trace(), chat, 600,
             spec("ngram", 3, "0.8,0.6,0.45", [[1, 1, 3], [3, 3, 2], [4, 1024, 1]]))
        case("dynamic-eagle3-agentic-k4", agentic_trace(), pressure, 200,
             spec("eagle3", 4, "0.8,0.6,0.45,0.3", [[1, 2, 4], [4, 5, 2], [6, 64, 1]]))
    return out
