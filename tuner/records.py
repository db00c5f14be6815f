"""Records every replay backend produces and ``tuner.metrics`` consumes.

These plain frozen dataclasses are the contract between backends (the ``sim`` twin,
vLLM's own ``Scheduler``, a live ``vllm serve``) and everything downstream: metrics read
records, never backend objects, so every backend is measured the same way.
Times are seconds on the replay clock (``arrival_s`` of the trace = the same clock).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

RequestStatus = Literal["finished", "rejected", "aborted", "unfinished", "error"]


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What happened to one request."""

    request_id: str
    arrival_s: float  # when it reached the engine
    input_len: int  # prompt tokens
    output_len: int  # tokens actually generated
    first_scheduled_s: float  # first admission (nan if never)
    first_token_s: float  # first output token (nan if none)
    finish_s: float  # last output token / end (nan if not finished)
    num_cached_tokens: int  # local prefix-cache hit at first admission (tokens)
    num_preemptions: int = 0
    status: RequestStatus = "finished"
    session_id: str | None = None

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def mean_itl_s(self) -> float:
        """(last token - first token) / (output tokens - 1); nan with < 2 tokens."""
        if self.output_len < 2:
            return float("nan")
        return (self.finish_s - self.first_token_s) / (self.output_len - 1)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One scheduler step (one forward pass), for parity checks and time series."""

    step: int  # executed-step index, from 0
    start_s: float
    duration_s: float
    num_scheduled_tokens: dict[str, int]  # request id -> tokens scheduled this step
    preempted: tuple[str, ...]  # request ids preempted during this step's scheduling
    num_running: int  # after scheduling
    num_waiting: int  # after scheduling
    kv_usage: float  # KV usage (vLLM definition) after scheduling
    cached_tokens: dict[str, int] = field(default_factory=dict)  # admitted this step -> hit


@dataclass(slots=True)
class ReplayResult:
    """A backend's full output for one replay."""

    backend: str
    requests: list[RequestResult]
    #: Pooled inter-token gaps as (gap_s, count) pairs: exact ITL percentiles without one
    #: float per token (a fast-forwarded decode stretch adds one pair per step).
    itl_samples: list[tuple[float, int]]
    #: Time series sampled per step: columns t_s, kv_usage, num_running, num_waiting,
    #: num_scheduled_tokens (equal-length lists).
    timeseries: dict[str, list[float]]
    counters: dict[str, float]  # prefix_cache_queries, prefix_cache_hits, preemptions, num_steps...
    simulated_s: float  # replay-clock span
    wall_s: float  # wall time the replay took
    num_gpus: int = 1
    steps: list[StepRecord] | None = None
    notes: list[str] = field(default_factory=list)
