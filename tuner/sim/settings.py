"""Scheduler and cache settings, named exactly as vLLM's config fields.

``SchedulerSettings`` mirrors ``vllm/config/scheduler.py`` @ 0.33.0 (plus the two
``cache_aware_admission_*`` fields of the unmerged PR #54625), so a profile can be
written straight into ``SchedulerConfig(**kwargs)`` or ``vllm serve`` flags.
``CacheSettings`` mirrors the relevant part of ``CacheConfig``.

Why a frozen dataclass: settings are the unit the tuner searches over, hashes into
Optuna params and writes into profiles; they must never change under a running replay.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from tuner.errors import ConfigError
from tuner.sim.kv_connector.settings import OffloadSettings

Policy = Literal["fcfs", "priority"]


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """The tunable part of vLLM's ``SchedulerConfig`` (field names are vLLM's).

    Defaults are the ``SchedulerConfig`` class defaults except the two batch caps, which
    take ``vllm serve``'s defaults for a >= 70 GiB GPU (``EngineArgs.get_batch_defaults``);
    use :meth:`vllm_defaults` for the exact default of a given GPU size.
    """

    max_num_batched_tokens: int = 8192  # token budget per step (>= 1)
    max_num_seqs: int = 1024  # cap on running requests (>= 1)
    long_prefill_token_threshold: int = 0  # per-request per-step prefill chunk cap; 0 = off
    enable_chunked_prefill: bool = True  # prefills may be split by the remaining budget
    policy: Policy = "fcfs"  # "fcfs" or "priority" (lower value first); flag --scheduling-policy
    scheduler_reserve_full_isl: bool = True  # admission needs room for the whole current sequence
    watermark: float = 0.0  # fraction of blocks kept free when admitting, in [0, 1)
    prefill_schedule_interval: int = 1  # prefill only on every N-th executed step (>= 1)
    cache_aware_admission_window: int = 0  # PR #54625: look-ahead over waiting requests; 0 = off
    cache_aware_admission_threshold: float = 0.5  # PR #54625: KV usage below which no reorder, [0, 1]

    @classmethod
    def vllm_defaults(cls, gpu_memory_gib: float | None = None) -> "SchedulerSettings":
        """``vllm serve`` defaults (0.33.0) for a GPU with ``gpu_memory_gib`` of memory.

        ``get_batch_defaults``: >= 160 GiB -> 16384/1024, >= 70 GiB -> 8192/1024, else
        2048/256. ``None`` means a >= 70 GiB GPU.
        """
        if gpu_memory_gib is None or 70 <= gpu_memory_gib < 160:
            return cls()
        if gpu_memory_gib >= 160:
            return cls(max_num_batched_tokens=16384, max_num_seqs=1024)
        return cls(max_num_batched_tokens=2048, max_num_seqs=256)

    def replace(self, **changes: Any) -> "SchedulerSettings":
        """A copy with ``changes`` applied and validated."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(
                f"unknown scheduler setting(s) {sorted(unknown)}; known: "
                f"{', '.join(f.name for f in fields(self))}"
            )
        new = dataclasses.replace(self, **changes)
        new.validate()
        return new

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SchedulerSettings":
        return cls().replace(**data)

    def validate(self, *, max_model_len: int | None = None) -> None:
        """Refuse what vLLM's ``SchedulerConfig`` refuses (``verify_max_model_len``)."""
        def fail(msg: str) -> None:
            raise ConfigError(msg)

        for name in ("max_num_batched_tokens", "max_num_seqs", "prefill_schedule_interval"):
            if int(getattr(self, name)) < 1:
                fail(f"{name}={getattr(self, name)} must be >= 1")
        if self.long_prefill_token_threshold < 0:
            fail(f"long_prefill_token_threshold={self.long_prefill_token_threshold} must be >= 0")
        if self.cache_aware_admission_window < 0:
            fail(f"cache_aware_admission_window={self.cache_aware_admission_window} must be >= 0")
        if not 0.0 <= self.cache_aware_admission_threshold <= 1.0:
            fail(f"cache_aware_admission_threshold={self.cache_aware_admission_threshold} "
                 "must be in [0, 1]")
        if not 0.0 <= self.watermark < 1.0:
            fail(f"watermark={self.watermark} must be in [0, 1)")
        if self.policy not in ("fcfs", "priority"):
            fail(f"policy={self.policy!r} must be 'fcfs' or 'priority'")
        if self.max_num_batched_tokens < self.max_num_seqs:
            fail(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be greater than "
                 f"or equal to max_num_seqs ({self.max_num_seqs}) (vLLM rejects this)")
        if max_model_len is not None:
            if not self.enable_chunked_prefill and self.max_num_batched_tokens < max_model_len:
                fail(f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                     f"max_model_len ({max_model_len}) with chunked prefill disabled")
            if self.long_prefill_token_threshold > max_model_len:
                fail(f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) "
                     f"exceeds max_model_len ({max_model_len})")


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """The KV-cache shape the scheduler sees (``CacheConfig`` + the profiled block count)."""

    block_size: int = 16  # tokens per KV block (vLLM: 16 on CUDA, 64 with ROCm AITER attention)
    num_gpu_blocks: int = 100_000  # usable blocks + the null block (vLLM's num_gpu_blocks)
    enable_prefix_caching: bool = True
    max_model_len: int = 1 << 20  # longest sequence a request may reach (prompt + output)

    def validate(self) -> None:
        if self.block_size < 1:
            raise ConfigError(f"block_size={self.block_size} must be >= 1")
        if self.num_gpu_blocks < 2:
            raise ConfigError(f"num_gpu_blocks={self.num_gpu_blocks} must be >= 2 "
                              "(block 0 is the null block)")


@dataclass(frozen=True, slots=True)
class SimOptions:
    """Options of the twin that are not vLLM config fields.

    ``prefill_interval_mode`` picks which clock ``prefill_schedule_interval`` runs on:
    ``"local"`` is 0.33.0's single-engine cadence, ``"dp"`` the data-parallel variant
    (``step_counter % interval``), ``"off"`` models releases before 0.33.0 without DP,
    where the field has no effect.
    """

    prefill_interval_mode: Literal["local", "dp", "off"] = "local"
    record_steps: bool = False  # keep one StepRecord per step (fidelity, reports); costs memory
    check_invariants: bool = False  # walk block pool/manager invariants after every step (tests)
    fast_forward: bool = True  # skip pure-decode stretches in bulk (identical results)
    #: vLLM's ``SchedulerConfig.async_scheduling``, resolved (True/False, never None): the
    #: engine the replay models. False: ``--no-async-scheduling`` (schedule, update,
    #: schedule). True: ``AsyncScheduler`` under ``step_with_batch_queue`` (batch queue of
    #: depth 2, output placeholders). The target decides the default
    #: (``tuner.vllm_compat``); the sim layer only executes the resolved mode.
    async_scheduling: bool = False
    #: After a ``priority`` request preempts itself (the lowest priority, nothing left to
    #: free), the running loop goes on with the higher-priority requests after it, as
    #: vLLM 0.33.0 does in both modes (scheduler.py:982-992, ``continue``), or ends it,
    #: as 0.32.0 does (``break``). ``tuner.vllm_compat.self_preemption_continues`` picks
    #: it per release for parity runs.
    self_preemption_continues: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    #: Speculative decoding (``tuner.sim.spec_decode.SpecDecoding``: vLLM's
    #: ``--speculative-config`` and the acceptance profile), or None: off.
    speculative: Any = None
    #: vLLM's host-memory KV tier (``--kv-offloading-size``; the ``OffloadingConnector``,
    #: ``tuner.sim.kv_connector``), None = no connector (and no cost).
    kv_offload: "OffloadSettings | None" = None
