"""How requests reach the twin: open loop (trace arrival times) or closed loop.

The same two modes exist in every replay backend, so results compare across them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OpenLoop:
    """Requests arrive at the trace's ``arrival_s / speedup`` (default: as recorded)."""

    speedup: float = 1.0  # > 0; 2.0 replays the trace twice as fast

    def __post_init__(self) -> None:
        if not self.speedup > 0:
            raise ValueError(f"speedup={self.speedup} must be > 0")


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """``concurrency`` requests in flight: issued in trace order, a new one as one ends.

    As ``vllm bench serve --max-concurrency`` and the agentic harnesses run; a request's
    ``arrival_s`` becomes its issue time (the first ``concurrency`` are issued at 0).

    ``replacement_misses_step`` (default, as vLLM runs): a replacement is sent when its
    predecessor's step ends, but it reaches the engine only after the engine has
    scheduled its next step, so it waits out that whole step (docs/step-time-model.md
    §1.4). Why: vLLM's engine core schedules again within microseconds of queueing a
    step's outputs (``run_busy_loop``, v1/engine/core.py 1621-1696 @ 0.33.0), while the
    replacement exists only after those outputs went through the API server to the
    client, its stream ended and the client sent a new request that the server then
    tokenised: milliseconds. An idle engine (nothing waiting, running or in flight)
    blocks on its input queue and takes the replacement as it comes. ``False`` hands
    the replacement to the very next ``schedule()``: the benchmark fit records its rows
    that way and prices the missed step itself (``tuner.perf.fit.benchmark_rows.
    missed_step_s``). A real server's closed loop (``vllm-serve``) always has the missed
    step: its client sends the replacement only when the stream has ended.
    """

    concurrency: int  # >= 1
    replacement_misses_step: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency} must be >= 1")
