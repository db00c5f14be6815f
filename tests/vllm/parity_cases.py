"""The traces and settings the parity tests replay on the twin and on vLLM's scheduler.

Small on purpose (seconds per replay) but each one exercises what it is named after;
the tests check that (preemptions happened, the window reordered, chunks were cut).
"""

from __future__ import annotations

import dataclasses

from tuner.fidelity.parity import ParityCase
from tuner.sim.load import ClosedLoop
from tuner.sim.settings import SchedulerSettings, SimOptions
from tuner.perf.target import Target
from tuner.trace.request import TraceRequest
from tuner.trace.synth import synthesize

BS = 16


def target(num_gpu_blocks: int, async_scheduling: bool = False) -> Target:
    """An H200 target of ``num_gpu_blocks`` blocks, its scheduling mode pinned (an H200
    resolves to async scheduling; these cases say which mode they check)."""
    return Target(hardware="h200", model="llama-3.1-8b", block_size=BS,
                  num_gpu_blocks=num_gpu_blocks, max_model_len=8192,
                  async_scheduling=async_scheduling)


def pr_eviction_requests() -> list[TraceRequest]:
    """PR #54625's test as a trace: warm0 leaves 3 cached blocks; cold, then warm, arrive."""
    warm, cold = (101, 102, 103), (201, 202, 203)
    return [TraceRequest("warm0", 0.0, 48, 1, warm),
            TraceRequest("cold", 1.0, 48, 1, cold),
            TraceRequest("warm", 1.0, 48, 1, warm)]


def agentic_trace():
    """Agentic sessions (shared system prompts, growing contexts) at a high request rate."""
    return synthesize("agentic", duration_s=40, rate=8.0, seed=5, hash_block_size=BS,
                      system_prompt_tokens=(100, 300), task_tokens=100, output_tokens=120,
                      max_output_tokens=500, tool_output_tokens=80, max_tool_output_tokens=400,
                      max_context_tokens=1500, summary_tokens=200, tool_delay_s=0.3, turns=5,
                      think_time_s=1.0)


def chat_trace():
    return synthesize("chat", duration_s=30, rate=4.0, seed=7, hash_block_size=BS,
                      system_prompt_tokens=(300, 1500), user_tokens=150, output_tokens=60,
                      max_output_tokens=300, think_time_s=3.0)


def priority_requests() -> list[TraceRequest]:
    """The chat trace with priorities 0-2 (lower first under policy="priority")."""
    reqs = list(chat_trace().requests())
    return [dataclasses.replace(r, priority=(i * 7) % 3) for i, r in enumerate(reqs)]


def priority_self_preempt_requests() -> list[TraceRequest]:
    """policy=priority: "low", first in running, needs a block when none is free and is
    itself the lowest priority: it preempts itself. vLLM 0.33.0 then goes on with the
    higher-priority requests after it (scheduler.py:982-992, ``continue``); 0.32.0 ends
    the running loop (``break``), so its step is empty."""
    return [TraceRequest("low", 0.0, 40, 20, tuple(range(5000, 5002)), priority=1),
            TraceRequest("high", 0.001, 40, 20, tuple(range(6000, 6002)), priority=0)]


def cases(version: str) -> list[ParityCase]:
    """Every parity case for vLLM ``version`` ("0.33" or "0.32")."""
    mode = "local" if version == "0.33" else "off"  # 0.32: no single-engine cadence
    continues = version == "0.33"  # 0.32 ends the running loop after a self-preemption
    opts = SimOptions(prefill_interval_mode=mode, self_preemption_continues=continues)
    pressure = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=64)
    chat = SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=32,
                             long_prefill_token_threshold=64)
    agentic, chat_tr = agentic_trace(), chat_trace()
    out = [
        ParityCase("pr-eviction-w4-t0", pr_eviction_requests(), SchedulerSettings(
            max_num_batched_tokens=8192, max_num_seqs=16, cache_aware_admission_window=4,
            cache_aware_admission_threshold=0.0), target(5), options=opts, hash_block_size=BS),
        ParityCase("pr-eviction-w0", pr_eviction_requests(), SchedulerSettings(
            max_num_batched_tokens=8192, max_num_seqs=16), target(5), options=opts,
            hash_block_size=BS),
        ParityCase("pr-eviction-w4-t05", pr_eviction_requests(), SchedulerSettings(
            max_num_batched_tokens=8192, max_num_seqs=16, cache_aware_admission_window=4,
            cache_aware_admission_threshold=0.5), target(5), options=opts, hash_block_size=BS),
        ParityCase("agentic-pressure", agentic, pressure, target(200), options=opts),
        ParityCase("agentic-w16-t0", agentic, pressure.replace(
            cache_aware_admission_window=16, cache_aware_admission_threshold=0.0), target(200),
            options=opts),
        ParityCase("agentic-w16-t05", agentic, pressure.replace(
            cache_aware_admission_window=16, cache_aware_admission_threshold=0.5), target(200),
            options=opts),
        ParityCase("agentic-closed-loop", agentic, pressure, target(200), load=ClosedLoop(24),
                   options=opts),
        ParityCase("chat-chunked-long-prefill", chat_tr, chat, target(600), options=opts),
        ParityCase("psi4", agentic, pressure.replace(prefill_schedule_interval=4), target(200),
                   options=opts),
        ParityCase("priority", priority_requests(), chat.replace(policy="priority"),
                   target(150), options=opts, hash_block_size=BS),
        ParityCase("priority-self-preempt", priority_self_preempt_requests(),
                   SchedulerSettings(max_num_batched_tokens=8192, max_num_seqs=16,
                                     policy="priority"), target(7), options=opts,
                   hash_block_size=BS),
    ]
    return out
