"""What :func:`tuner.tune.tune` is asked, as four objects instead of 25 keywords.

Why: the keywords described four different things -- what is replayed, how the search
runs, which deployments it may try, and where the study lives -- and every caller (the
CLI, ``tuner retune``, notebooks, tests) passed them one by one, so a new option was a
change in five places and a call could not be read at a glance. Each object has defaults
that do the common thing, so a notebook writes only what it changes::

    from tuner.tune import SearchOptions, StudyOutput, TuneInputs, tune

    result = tune(TuneInputs("traces/agentic_1h.parquet", target=Target(tp=8)),
                  SearchOptions(n_trials=200, constraints=("ttft_p90_s<=2.0",)),
                  output=StudyOutput(storage="study.optuna-journal", study_name="agentic"))

A profile is built from the result by ``tuner.profile`` (``profile_of``), which also turns a
profile into the :class:`WarmStart` a study starts from (``warm_start_of``): the study
itself knows only settings, never the profile file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.perf.deployment import Deployment
from tuner.perf.target import Target
from tuner.sim.fleet import RouterSettings
from tuner.sim.settings import SchedulerSettings
from tuner.tune.robust import RobustOptions

if TYPE_CHECKING:
    from tuner.progress import Progress
    from tuner.tune.evaluate import Evaluator
    from tuner.tune.select import PickRule
    from tuner.tune.space import SearchSpace


@dataclass(frozen=True, slots=True)
class TuneInputs:
    """What every trial replays: the trace on the target, its windows, the baseline."""

    trace: Any = None  # a trace path or ``Trace``; ignored when ``evaluator`` is given
    target: Target = Target()  # hardware, model, TP/DP/replicas, KV cache: the baseline's
    backend: str = "sim"  # replay backend of the trials (a fleet or GPU budget needs sim)
    holdout: float = 0.25  # fraction at the end of the trace kept out of the search (0: none)
    #: stage 1 replays this leading fraction of the training window (1.0: no staging)
    stage1_fraction: float = 0.25
    #: the settings the operator runs (the baseline and trial 0); None: vLLM's defaults
    baseline: SchedulerSettings | None = None
    #: settings held fixed (``--set``): in the baseline and every trial, out of the space
    fixed: Mapping[str, Any] | None = None
    #: ``"ttft:2000,tpot:50"`` (ms, as ``vllm bench serve --goodput``) or its dict: defines
    #: the ``goodput`` metric for objectives and constraints
    slo: str | Mapping[str, float] | None = None
    #: replaces the trace replay (tests, custom backends); ``trace`` is then not read
    evaluator: "Evaluator | None" = None
    #: ``--speculative-config`` of every trial (a ``tuner.sim.spec_decode.SpecDecoding``;
    #: None: off); ``SearchOptions.spec_tokens`` searches its k (tuner.tune.spec_space)
    speculative: Any = None


@dataclass(frozen=True, slots=True)
class StartPoint:
    """One point a study replays first (a warm start), before the sampler's own."""

    role: str  # "profile" (the profile's own settings) or "pareto" (one of its front)
    settings: SchedulerSettings
    #: the deployment it ran on; used only where the space varies the deployment
    deployment: Deployment | None = None


@dataclass(frozen=True, slots=True)
class WarmStart:
    """Points to enqueue before the search starts (``tuner.profile.warm_start_of`` makes
    one from a profile: its settings and its Pareto set)."""

    source: str  # where the points come from (a profile's name), recorded on each trial
    points: tuple[StartPoint, ...] = ()


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """How the search runs and picks (docs/tuning.md)."""

    #: ``"admission"``, ``"scheduler"``, a YAML path or a ``SearchSpace``
    space: "str | SearchSpace" = "admission"
    #: Summary keys to optimise (``"key"``, ``"key:max"``, ``"key:min"``); None:
    #: p90_interactivity and output_throughput_per_gpu, both maximised
    objectives: str | Sequence[str] | None = None
    #: ``"ttft_p90_s<=2.0"`` style bounds; infeasible points are never picked
    constraints: Sequence[str] = ()
    n_trials: int = 100  # stage-1 trials in total (baseline and warm-start trials included)
    #: points promoted to stage 2; None: ``min(32, max(8, n_trials // 10))``
    n_survivors: int | None = None
    #: ``throughput``, ``interactivity`` or ``balanced``, or a ``PickRule`` (tolerances)
    prefer: "str | PickRule" = "throughput"
    seed: int = 0  # sampler seed (worker ``i`` uses ``seed + i``)
    warm_start: WarmStart | None = None  # points replayed first (see WarmStart)
    #: the pick re-checked under clock variants drawn from the error bands
    #: (:mod:`tuner.tune.robust`; ``RobustOptions(enabled=False)``: the plain pick)
    robust: RobustOptions = RobustOptions()
    #: ``num_speculative_tokens`` values searched (0 = off; needs
    #: ``TuneInputs.speculative``); None: k held at the config's (tuner.tune.spec_space)
    spec_tokens: Sequence[int] | None = None
    #: CPU KV tier sizes searched, GiB per engine (0 = no tier), and eviction policies;
    #: None: the target's own tier (tuner.tune.kv_tier_space)
    kv_offloading_sizes: Sequence[float] | None = None
    kv_offloading_policies: Sequence[str] | None = None
    #: host memory per node the tier sizes must fit (None: the preset's reference node)
    host_memory_gb: float | None = None
    #: stop a stage-1 replay once it proves a latency-percentile constraint violated
    #: (tuner.tune.early_stop; the trial is pruned, never a survivor); False: replay whole
    early_stop: bool = True


@dataclass(frozen=True, slots=True)
class DeploymentSearch:
    """Which deployments the study may try besides the target's own split."""

    #: the baseline's router, for a target with replicas (None: round-robin defaults)
    router: RouterSettings | None = None
    #: search the ``tp x dp x replicas`` splits of this many GPUs (``gpu_split``); the
    #: target's split is the baseline and must use the same number of GPUs
    gpu_budget: int | None = None
    #: router policies searched where a split has replicas (None: all four; one: fixed)
    routers: Sequence[str] | None = None
    #: disaggregated prefill/decode layouts of ``gpu_budget`` in the search
    #: (tuner.tune.pd_space): "off" (today's space), "on" (P/D only) or "auto" (both)
    disaggregated: str = "off"
    #: TP sizes a P/D pool instance may have (None: every one that starts)
    pd_tps: Sequence[int] | None = None
    #: the P/D proxy policies searched (None: every one the P/D replay runs)
    pd_routers: Sequence[str] | None = None
    #: "full": P/D layouts of exactly ``gpu_budget`` GPUs (as the aggregated splits);
    #: "up-to": every layout of at most that many
    pd_gpus: str = "full"
    #: hardware presets the prefill pool may run on (mixed pools; None: the target's)
    pd_prefill_hardware: Sequence[str] | None = None
    #: vLLM ``transfer_mode`` values searched (None: pull only, no dimension)
    pd_transfer_modes: Sequence[str] | None = None


@dataclass(frozen=True, slots=True)
class StudyOutput:
    """Where the study lives and who hears about it. ``tune`` writes no profile."""

    #: the profile the caller will write: its stem names the study and its folder holds
    #: the journal when ``storage`` is None
    output: str | os.PathLike[str] | None = None
    #: database URL or journal path; None: beside ``output`` (in memory without one and
    #: with a single worker)
    storage: str | None = None
    study_name: str | None = None  # None: the output's stem, or tune-<fingerprint>-<space>
    workers: int = 1  # processes on this machine sharing the storage
    #: a :class:`tuner.progress.Progress` sink (stages, trials done, best so far)
    progress: "Progress | None" = field(default=None, compare=False)


__all__ = ["DeploymentSearch", "SearchOptions", "StartPoint", "StudyOutput", "TuneInputs",
           "WarmStart"]
