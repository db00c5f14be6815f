"""Parity cases for the CPU KV tier: vLLM 0.33.0's ``OffloadingConnectorScheduler`` and
``CPUOffloadingManager`` (LRU and ARC) beside its ``Scheduler`` / ``AsyncScheduler``,
fed by the fake worker (``tuner.vllm_core.offloading``), against the twin's connector
(``tuner.sim.kv_connector``), each in both scheduling modes.

Each case is small and aimed at one rule (tests/vllm/test_offload_parity.py checks that
vLLM's side did what the case is named after):

* ``multiturn-reload``: a session's first turn is evicted from the GPU by later requests
  and its second turn reloads the prefix from the CPU;
* ``cpu-full-lru`` / ``cpu-full-arc``: an 8-chunk pool overflows; a prefix used twice
  survives ARC (T2) but not LRU, so the last request hits on the CPU only under ARC;
* ``preempted-in-flight``: decodes outgrow the GPU over a slow link, a request is
  preempted with its stores in flight and its next lookup is deferred;
* ``pr-eviction-w0`` / ``pr-eviction-w4``: PR #54625's scenario with the tier on
  (vLLM's scheduler and the plugin's cache-aware one);
* ``shared-load``: two requests want the same CPU chunks at once; the second lookup is
  deferred while the first one's load is in flight;
* ``agentic-lru`` / ``agentic-arc``: agentic sessions under KV pressure (hundreds of
  loads, stores, evictions and deferred lookups).
"""

from __future__ import annotations

import dataclasses

from parity_cases import BS, agentic_trace, pr_eviction_requests, target

from tuner.fidelity.parity import ParityCase
from tuner.sim.kv_connector.settings import OffloadSettings
from tuner.sim.settings import SchedulerSettings, SimOptions
from tuner.trace.request import TraceRequest

#: 2 MiB per block per rank over 1 GB/s: 2 ms a block, about one decode step of the
#: H200 8B target, so transfers span steps and stores overlap them
FAST = dict(bytes_per_block=2 << 20, load_bytes_per_s=1e9, store_bytes_per_s=1e9,
            latency_s=1e-5)
#: ten times slower: a preempted request's stores are still in flight when it returns
SLOW = dict(FAST, load_bytes_per_s=1e8, store_bytes_per_s=1e8)


def tier(num_chunks: int, policy: str = "lru", link: dict = FAST) -> OffloadSettings:
    return OffloadSettings(num_chunks=num_chunks, policy=policy, **link)


def _blocks(tag: int, n: int) -> tuple[int, ...]:
    return tuple(tag * 1000 + i for i in range(n))


def _req(rid: str, t: float, blocks: tuple[int, ...], out: int = 4,
         extra: int = 0) -> TraceRequest:
    return TraceRequest(rid, t, len(blocks) * BS + extra, out, blocks)


def multiturn_requests() -> list[TraceRequest]:
    """Turn 1 (6 blocks), three fillers of 7 blocks through a 12-block GPU, turn 2 = turn
    1's prompt + 2 blocks: its first 6 blocks come back from the CPU."""
    turn1 = _blocks(1, 6)
    out = [_req("turn1", 0.0, turn1)]
    out += [_req(f"fill{i}", 0.2 * (i + 1), _blocks(10 + i, 7)) for i in range(3)]
    out.append(_req("turn2", 1.0, turn1 + _blocks(2, 2)))
    return out


def cpu_full_requests() -> list[TraceRequest]:
    """P twice (ARC: P's chunks move to T2), then Q and R fill the 8-chunk pool, then P
    again after the GPU (8 blocks) has dropped it: ARC still holds P, LRU evicted it."""
    p, q, r = _blocks(1, 4), _blocks(2, 4), _blocks(3, 4)
    names = [("p1", p), ("p2", p + _blocks(4, 1)), ("q", q), ("r", r),
             ("q2", q + _blocks(5, 1)), ("r2", r + _blocks(6, 1)), ("p3", p + _blocks(7, 1))]
    return [_req(n, 0.3 * i, b, out=2) for i, (n, b) in enumerate(names)]


def pressure_requests() -> list[TraceRequest]:
    """Six 3-block prompts decoding 60 tokens each in a 20-block GPU: preemptions, and
    over the slow link the victims' stores are still in flight when they return."""
    return [_req(f"p{i}", 0.001 * i, _blocks(20 + i, 3), out=60) for i in range(6)]


def shared_load_requests() -> list[TraceRequest]:
    """X is stored, evicted from the 12-block GPU by two fillers, then C and D (X + a
    block of their own) arrive together: C loads X, D's lookup waits for that load."""
    x = _blocks(1, 6)
    return [_req("x", 0.0, x), _req("fill0", 0.2, _blocks(10, 7)),
            _req("fill1", 0.4, _blocks(11, 7)),
            _req("c", 1.0, x + _blocks(2, 1)), _req("d", 1.0, x + _blocks(3, 1))]


def cases() -> list[ParityCase]:
    """Every offloading parity case, sync and async."""
    small = SchedulerSettings(max_num_batched_tokens=8192, max_num_seqs=16)
    pressure = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=64)
    window = small.replace(cache_aware_admission_window=4,
                           cache_aware_admission_threshold=0.0)
    eviction = [dataclasses.replace(r, output_len=3) for r in pr_eviction_requests()]
    out: list[ParityCase] = []
    for mode in (False, True):
        tag = "async" if mode else "sync"

        def case(name: str, trace: object, settings: SchedulerSettings, blocks: int,
                 kv: OffloadSettings, bs: int | None = BS) -> None:
            opts = SimOptions(async_scheduling=mode, kv_offload=kv)
            out.append(ParityCase(f"{name}-{tag}", trace, settings,
                                  target(blocks, async_scheduling=mode), options=opts,
                                  hash_block_size=bs))

        case("multiturn-reload", multiturn_requests(), small, 13, tier(64))
        case("cpu-full-lru", cpu_full_requests(), small, 9, tier(8, "lru"))
        case("cpu-full-arc", cpu_full_requests(), small, 9, tier(8, "arc"))
        case("preempted-in-flight", pressure_requests(), small, 21, tier(64, link=SLOW))
        case("pr-eviction-w0", eviction, small, 6, tier(16))
        case("pr-eviction-w4", eviction, window, 6, tier(16))
        case("shared-load", shared_load_requests(), small, 13, tier(64))
        case("agentic-lru", agentic_trace(), pressure, 200, tier(400, "lru"), None)
        case("agentic-arc", agentic_trace(), pressure, 200, tier(400, "arc"), None)
    return out
