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
    """

    concurrency: int  # >= 1

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency} must be >= 1")
