"""Parity cases for vLLM's asynchronous scheduling (``AsyncScheduler`` under a batch queue
of depth 2), each small and aimed at one effect of the one-step delay.

Every case runs with the cache-aware admission window off (vLLM's own ``AsyncScheduler``)
and on (``tuner.vllm_plugin.CacheAwareAsyncScheduler``); the tests check that each case
exercised what it is named after, on vLLM's side, and that the twin schedules it step for
step alike.
"""

from __future__ import annotations

from parity_cases import (BS, chat_trace, pr_eviction_requests, priority_requests,
                          target)

from tuner.fidelity.parity import ParityCase
from tuner.sim.load import ClosedLoop
from tuner.sim.settings import SchedulerSettings, SimOptions
from tuner.trace.request import TraceRequest
from tuner.trace.synth import synthesize

def agentic_async_trace():  # type: ignore[no-untyped-def]
    """The agentic sessions of the sync cases, over 20 s (CI time: two modes, two vLLMs)."""
    return synthesize("agentic", duration_s=20, rate=8.0, seed=5, hash_block_size=BS,
                      system_prompt_tokens=(100, 300), task_tokens=100, output_tokens=120,
                      max_output_tokens=500, tool_output_tokens=80, max_tool_output_tokens=400,
                      max_context_tokens=1500, summary_tokens=200, tool_delay_s=0.3, turns=5,
                      think_time_s=1.0)


#: The window "on": 4 waiting requests looked at, from any KV usage.
WINDOW_ON = {"cache_aware_admission_window": 4, "cache_aware_admission_threshold": 0.0}


def _blocks(tag: int, n: int) -> tuple[int, ...]:
    return tuple(tag * 1000 + i for i in range(n))


def inflight_victim_requests() -> list[TraceRequest]:
    """Two decodes outgrow a 6-block cache together: the later one is preempted while its
    token of the previous step is still in flight (delivered stale at update)."""
    return [TraceRequest("r1", 0.0, 40, 40, _blocks(1, 2)),
            TraceRequest("r2", 0.0, 40, 40, _blocks(2, 2))]


def self_preempt_requests() -> list[TraceRequest]:
    """r2 needs its 4th block when none is free and preempts itself, while the token of
    the step that completed its block 2 (position 47) is still in flight: vLLM never
    registers that block (``allocate_slots`` stopped at ``num_tokens`` = 47, the update
    at ``num_computed - num_in_flight`` = 47), so r2 resumes with a 32-token hit."""
    return [TraceRequest("r1", 0.0, 36, 10, _blocks(3, 2)),
            TraceRequest("r2", 0.0, 40, 20, _blocks(4, 2))]


def priority_cursor_requests() -> list[TraceRequest]:
    """policy=priority: A (lowest priority, first in running) has its last token in flight
    and is skipped by the max_tokens look-ahead when B needs a block; A is the victim,
    from before the scheduling cursor, so the cursor moves back and C is still scheduled
    in that step (scheduler.py:808-812)."""
    return [TraceRequest("A", 0.0, 16, 11, _blocks(7, 1), priority=2),
            TraceRequest("B", 0.001, 40, 20, _blocks(8, 2), priority=0),
            TraceRequest("C", 0.001, 40, 20, _blocks(9, 2), priority=1)]


def priority_self_preempt_requests() -> list[TraceRequest]:
    """policy=priority: "low", first in running, needs a block when none is free and is
    itself the lowest priority: it preempts itself. vLLM 0.33.0 then goes on with the
    higher-priority requests after it (scheduler.py:982-992, ``continue``); 0.32.0 ends
    the running loop (``break``), so its step is empty."""
    return [TraceRequest("low", 0.0, 40, 20, _blocks(5, 2), priority=1),
            TraceRequest("high", 0.001, 40, 20, _blocks(6, 2), priority=0)]


def short_output_requests() -> list[TraceRequest]:
    """max_tokens 1 and 2, staggered so some arrive while others are in flight."""
    out = []
    for i in range(8):
        n = 24 + 8 * i
        out.append(TraceRequest(f"m{i}", 0.002 * i, n, 1 + i % 2, _blocks(10 + i, n // BS)))
    return out


def saturation_requests() -> list[TraceRequest]:
    """Six requests for two sequence slots: a finished request frees its slot at update."""
    return [TraceRequest(f"s{i}", 0.0, 20, 3 + i % 3, _blocks(20 + i, 1)) for i in range(6)]


def block_follower_requests(arrival_s: float) -> list[TraceRequest]:
    """A's generated tokens complete its block 2 (positions 32-47); follower B's prompt
    carries that block. Under async scheduling the block is registered one step later
    (``allocate_slots`` caches only up to ``num_tokens``, which lacks the token in
    flight): B admitted in the step that computes position 47 misses it, one step later
    hits it."""
    return [TraceRequest("A", 0.0, 40, 24, _blocks(30, 2), output_block_hashes=(30002, 30003)),
            TraceRequest("B", arrival_s, 56, 2, _blocks(30, 2) + (30002,))]


def threshold_requests(arrival_s: float) -> list[TraceRequest]:
    """PR #54625's eviction test with a decode D beside it: warm0 leaves 3 cached blocks,
    D decodes across its 4th block's boundary about when cold and warm arrive. Async
    scheduling admits them one step later in D's progress (one token, here one block,
    further), so a threshold at D's 4-block usage is met only under async."""
    warm, cold = _blocks(40, 3), _blocks(41, 3)
    return [TraceRequest("warm0", 0.0, 48, 1, warm),
            TraceRequest("D", 0.0, 42, 30, _blocks(42, 2)),
            TraceRequest("cold", arrival_s, 48, 1, cold),
            TraceRequest("warm", arrival_s, 48, 1, warm)]


#: Follower arrivals (s): first seen by the schedule() of the step that computes A's
#: position 47 (block 2 still unregistered under async) / of the step after.
FOLLOWER_IN_WINDOW_S, FOLLOWER_AFTER_S = 0.032, 0.037
#: cold and warm arrive when D's next token crosses into its 4th block (see
#: threshold_requests); at 0.5 (4 of 8 blocks) the window then reorders only under async.
THRESHOLD_ARRIVAL_S, THRESHOLD = 0.027, 0.5


#: vLLM's plain synchronous scheduler class, for the guard case (``--scheduler-cls``).
PLAIN_SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"


def _pair(name: str, trace: object, settings: SchedulerSettings, tgt: object, *,
          on: dict | None = None, **kw: object) -> list[ParityCase]:
    """The case with the window off (vLLM's AsyncScheduler) and on (the plugin's)."""
    window = WINDOW_ON if on is None else on
    return [ParityCase(f"{name}-w0", trace, settings, tgt, **kw),
            ParityCase(f"{name}-w{window['cache_aware_admission_window']}", trace,
                       settings.replace(**window), tgt, **kw)]


def cases(version: str) -> list[ParityCase]:
    """Every async parity case for vLLM ``version`` ("0.33" or "0.32"), window off and on,
    plus ``threshold-near-usage-sync-w4`` (the same case without async scheduling)."""
    mode = "local" if version == "0.33" else "off"  # 0.32: no single-engine cadence
    opts = SimOptions(prefill_interval_mode=mode, async_scheduling=True)
    small = SchedulerSettings(max_num_batched_tokens=8192, max_num_seqs=16)
    pressure = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=64)
    chat = SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=32,
                             long_prefill_token_threshold=64)
    agentic = agentic_async_trace()
    big_window = {"cache_aware_admission_window": 16, "cache_aware_admission_threshold": 0.0}
    near = {"cache_aware_admission_window": 4, "cache_aware_admission_threshold": THRESHOLD}
    kw: dict = {"options": opts, "hash_block_size": BS}

    def tgt(n: int) -> object:
        return target(n, async_scheduling=True)

    out: list[ParityCase] = []
    out += _pair("frees-gate", pr_eviction_requests(), small, tgt(5), **kw)
    out += _pair("inflight-victim", inflight_victim_requests(), small, tgt(7), **kw)
    out += _pair("self-preempt-in-flight", self_preempt_requests(), small, tgt(7), **kw)
    out += _pair("max-tokens-1-2", short_output_requests(), small, tgt(200), **kw)
    out += _pair("max-num-seqs", saturation_requests(), small.replace(max_num_seqs=2),
                 tgt(200), **kw)
    out += _pair("block-follower-in-window", block_follower_requests(FOLLOWER_IN_WINDOW_S),
                 small, tgt(200), **kw)
    out += _pair("block-follower-after", block_follower_requests(FOLLOWER_AFTER_S), small,
                 tgt(200), **kw)
    threshold_trace = threshold_requests(THRESHOLD_ARRIVAL_S)
    out += _pair("threshold-near-usage", threshold_trace, small, tgt(9), on=near, **kw)
    out.append(ParityCase("threshold-near-usage-sync-w4", threshold_trace,
                          small.replace(**near), target(9), hash_block_size=BS,
                          options=SimOptions(prefill_interval_mode=mode)))
    out += _pair("long-prefill", chat_trace(), chat, tgt(600), options=opts)
    out += _pair("agentic", agentic, pressure, tgt(200), on=big_window, options=opts)
    out += _pair("psi4", agentic, pressure.replace(prefill_schedule_interval=4), tgt(200),
                 on=big_window, options=opts)
    out += _pair("closed-loop", agentic, pressure, tgt(200), on=big_window,
                 load=ClosedLoop(24), options=opts)
    out += _pair("priority", priority_requests(), chat.replace(policy="priority"),
                 tgt(150), **kw)
    out += _pair("priority-cursor", priority_cursor_requests(),
                 small.replace(policy="priority"), tgt(9), **kw)
    out += _pair("priority-self-preempt", priority_self_preempt_requests(),
                 small.replace(policy="priority"), tgt(7), **kw)
    return out


def guard_case(version: str) -> ParityCase:
    """vLLM's plain ``Scheduler`` (no output placeholders) under async scheduling's batch
    queue: what a ``--scheduler-cls`` subclassing ``Scheduler`` gets on a GPU."""
    mode = "local" if version == "0.33" else "off"
    return ParityCase("guard-plain-scheduler", saturation_requests()[:2],
                      SchedulerSettings(max_num_batched_tokens=8192, max_num_seqs=16),
                      target(200, async_scheduling=True), hash_block_size=BS,
                      options=SimOptions(prefill_interval_mode=mode, async_scheduling=True),
                      scheduler_cls=PLAIN_SCHEDULER)
