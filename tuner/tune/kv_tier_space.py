"""The CPU KV tier (``--kv-offloading-size`` and its eviction policy) as dimensions of a
study, and what the tier buys the pick.

Why deployment dimensions and not ``SchedulerSettings`` fields: vLLM reads the tier from
``--kv-offloading-size`` / ``kv_connector_extra_config``, not from ``SchedulerConfig``, and
the twin from ``Target.kv_offloading_size`` (resolved into ``OffloadSettings`` by
``tuner.perf.host_link``). So a drawn size (GiB, 0 = no tier) and policy travel with the
point's deployment (``Deployment.kv_offloading_size`` / ``kv_offloading_eviction_policy``,
recorded in the study beside the split) and ``Deployment.apply`` puts them on the target
the point replays. The cache-aware admission window and threshold stay in the space
beside them, so every tier trial replays PR #54625's admission at its drawn values.

The budget: vLLM pins ``kv_offloading_size`` GiB per engine (config/vllm.py:1151-1186,
``cpu_bytes_to_use``), and ``gpus_per_node // tp`` engines share a node
(:mod:`tuner.perf.host_memory`), so a size above ``--host-memory-gb / engines`` is refused
before any trial runs.

After the pick, :func:`kv_tier_gain` replays it once more with the tier toggled (no tier
for a pick that has one; the largest searched size for one that has none), same scheduler
settings, on the held-out window: the difference is what the tier itself buys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tuner.errors import ConfigError
from tuner.perf.host_memory import engines_per_node, host_memory_for
from tuner.tune.space import GPU_SPLIT, KV_TIER_POLICY, KV_TIER_SIZE, Param, SearchSpace

#: The metrics the gain line reports: the GPU + CPU hit rate, TTFT and throughput per GPU.
GAIN_KEYS = ("kv_hit_rate", "ttft_p90_s", "output_throughput_per_gpu")
#: A change (in %) of TTFT p90 or throughput per GPU below this counts as buying nothing.
NOT_WORTH_PCT = 1.0
POLICIES = ("lru", "arc")


def parse_kv_sizes(text: str | None) -> tuple[float, ...] | None:
    """``--kv-offloading-sizes 0,128,512``: GiB per engine to search (0 = no tier)."""
    if text is None:
        return None
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise ConfigError(f"--kv-offloading-sizes {text!r}: GiB like 0,128,512 "
                          "(0 = no tier)") from None
    if not values or any(v < 0 for v in values) or len(set(values)) != len(values):
        raise ConfigError(f"--kv-offloading-sizes {text!r}: distinct GiB >= 0 (0 = no tier)")
    if values == (0.0,):
        raise ConfigError("--kv-offloading-sizes 0: only 'no tier' is no search; drop the flag")
    return values


def parse_kv_policies(text: str | None) -> tuple[str, ...] | None:
    """``--kv-offloading-policies lru,arc``: the eviction policies to search."""
    if text is None:
        return None
    values = tuple(p.strip().lower() for p in str(text).split(",") if p.strip())
    bad = [v for v in values if v not in POLICIES]
    if not values or bad or len(set(values)) != len(values):
        raise ConfigError(f"--kv-offloading-policies {text!r}: distinct values of lru, arc")
    return values


@dataclass(frozen=True, slots=True)
class HostBudget:
    """The host memory a node gives the CPU KV tiers of its engines."""

    gib: float  # host memory per node, GiB
    engines: int  # engines of this TP on one node, each pinning its own tier
    source: str  # --host-memory-gb, or the preset's datasheet

    @property
    def per_engine_gib(self) -> float:
        return self.gib / self.engines


def host_budget(target: Any, host_memory_gb: float | None) -> HostBudget:
    """``--host-memory-gb`` (or the preset's reference node) over the engines per node."""
    if host_memory_gb is not None:
        if not host_memory_gb > 0:
            raise ConfigError(f"--host-memory-gb {host_memory_gb}: must be > 0")
        return HostBudget(float(host_memory_gb), engines_per_node(target.tp), "--host-memory-gb")
    node = host_memory_for(str(target.hardware))
    if node is None:
        raise ConfigError(f"--kv-offloading-sizes on --hardware {target.hardware}: pass "
                          "--host-memory-gb (host memory per node; no vendor reference node "
                          "states one for this preset)")
    return HostBudget(node.gib, engines_per_node(target.tp, node.gpus), node.source)


def with_kv_tier(space: SearchSpace, target: Any, sizes: Sequence[float] | None,
                 policies: Sequence[str] | None, host_memory_gb: float | None = None
                 ) -> tuple[SearchSpace, list[str]]:
    """``space`` with the tier's size and/or policy searched, and the report's notes.

    Raises:
        ConfigError: a size above the host budget, a space that also searches the split
            (the tier is modelled for one engine), a policy search without any tier.
    """
    if sizes is None and policies is None:
        return space, []
    if {KV_TIER_SIZE, KV_TIER_POLICY} & set(space.names):
        raise ConfigError(f"--kv-offloading-sizes/--kv-offloading-policies: the search space "
                          f"{space.name!r} already varies the CPU KV tier")
    if GPU_SPLIT in space.names or target.dp > 1 or target.replicas > 1:
        raise ConfigError("--kv-offloading-sizes/--kv-offloading-policies: the CPU tier is "
                          "modelled for one engine; drop --gpu-budget, --dp and --replicas")
    params: list[Param] = []
    notes: list[str] = []
    if sizes is not None:
        budget = host_budget(target, host_memory_gb)
        over = [s for s in sizes if s > budget.per_engine_gib]
        if over:
            raise ConfigError(
                f"--kv-offloading-sizes {max(over):g}: above the host budget of "
                f"{budget.per_engine_gib:g} GiB per engine ({budget.gib:g} GiB per node "
                f"[{budget.source}] over {budget.engines} engine(s) of TP{target.tp}); "
                "lower the size or raise --host-memory-gb")
        params.append(Param(KV_TIER_SIZE, "categorical", choices=tuple(float(s) for s in sizes)))
        notes.append(f"CPU KV tier searched over {', '.join(f'{s:g}' for s in sizes)} GiB per "
                     f"engine within {budget.per_engine_gib:g} GiB ({budget.source})")
    elif target.kv_offloading_size is None:
        raise ConfigError("--kv-offloading-policies needs a tier: --kv-offloading-size or "
                          "--kv-offloading-sizes")
    if policies is not None:  # one policy is a one-choice dimension: recorded per point
        on = tuple(float(s) for s in sizes or () if s > 0)
        params.append(Param(KV_TIER_POLICY, "categorical", choices=tuple(policies),
                            when=((KV_TIER_SIZE, on),) if sizes is not None else ()))
    return SearchSpace(space.name + "+kvtier", space.params + tuple(params)), notes


def tier_metrics(counters: dict[str, float]) -> dict[str, float]:
    """``kv_hit_rate``: (GPU + CPU prefix hits) / queries over the replayed requests, from
    the replay's counters, so a point with the tier and one without are measured alike."""
    queries = counters.get("prefix_cache_queries", 0)
    hits = counters.get("prefix_cache_hits", 0) + counters.get("kv_offload_external_hits", 0)
    return {"kv_hit_rate": hits / queries} if queries else {}


@dataclass(frozen=True, slots=True)
class KvTierGain:
    """The pick replayed with the CPU KV tier toggled (see the module docstring)."""

    size_gib: float  # the pick's tier (0: the pick has none)
    other_gib: float  # the comparison replay's tier (0 when the pick has one)
    policy: str  # the tier's eviction policy in the replay that has one
    window: str  # "holdout" or "train"
    with_tier: dict[str, Any] = field(default_factory=dict)
    without: dict[str, Any] = field(default_factory=dict)

    def delta_pct(self, key: str) -> float | None:
        a, b = self.with_tier.get(key), self.without.get(key)
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not b:
            return None
        return round((a - b) / abs(b) * 100.0, 2)

    @property
    def worth_it(self) -> bool:
        """Whether the tier pays: TTFT p90 or throughput per GPU better by at least
        NOT_WORTH_PCT and neither worse by as much. The hit rate is how it would pay, not
        a gain by itself: CPU hits whose loads gate their requests can leave TTFT worse."""
        gains = [(self.delta_pct("ttft_p90_s") or 0.0) * -1,
                 self.delta_pct("output_throughput_per_gpu") or 0.0]
        return max(gains) >= NOT_WORTH_PCT and min(gains) > -NOT_WORTH_PCT

    def to_dict(self) -> dict[str, Any]:
        return {"kv_offloading_size": self.size_gib, "compared_with": self.other_gib,
                "eviction_policy": self.policy, "window": self.window,
                "with_tier": dict(self.with_tier), "without": dict(self.without),
                "delta_pct": {k: self.delta_pct(k) for k in GAIN_KEYS
                              if self.delta_pct(k) is not None},
                "worth_it": self.worth_it}

    def line(self) -> str:
        """``CPU KV tier (512 GiB, lru) against none at the pick's settings, ...``"""
        parts = []
        for key in GAIN_KEYS:
            a, b, d = self.with_tier.get(key), self.without.get(key), self.delta_pct(key)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                parts.append(f"{key} {b:.4g} -> {a:.4g}"
                             + ("" if d is None else f" ({d:+.1f} %)"))
        where = "held-out" if self.window == "holdout" else "training"
        size = max(self.size_gib, self.other_gib)
        head = (f"CPU KV tier ({size:g} GiB, {self.policy}) against none at the pick's "
                f"settings, {where} window: ")
        tail = "" if self.worth_it else " -- not worth it on this trace"
        if not self.size_gib:
            tail += " (the pick has no tier)"
        return head + "; ".join(parts) + tail


def kv_tier_gain(evaluator: Any, point: Any, space: SearchSpace, *,
                 window: str) -> KvTierGain | None:
    """:class:`KvTierGain` of ``point`` (a ``tuner.tune.select.Point``), or None when the
    space searches no tier size."""
    from tuner.tune.deployment_space import split_settings

    param = next((p for p in space.params if p.name == KV_TIER_SIZE), None)
    if param is None or not hasattr(evaluator, "default_deployment"):
        return None
    settings, deployment = split_settings(point.settings)
    deployment = deployment or evaluator.default_deployment
    size = deployment.kv_offloading_size  # None: the target's own tier (the baseline)
    size = float(evaluator.target.kv_offloading_size or 0.0) if size is None else float(size)
    other = 0.0 if size else max(float(c) for c in param.choices or (0.0,))
    if not size and not other:
        return None
    policy = (deployment.kv_offloading_eviction_policy
              or evaluator.target.kv_offloading_eviction_policy)
    mine = point.holdout if window == "holdout" else point.metrics
    if not mine:
        mine = evaluator.evaluate(settings, window, deployment=deployment)
    theirs = evaluator.evaluate(settings, window, deployment=replace(
        deployment, kv_offloading_size=other, kv_offloading_eviction_policy=policy))
    with_tier, without = (mine, theirs) if size else (theirs, mine)
    return KvTierGain(size_gib=size, other_gib=other, policy=policy, window=window,
                      with_tier={k: with_tier.get(k) for k in GAIN_KEYS},
                      without={k: without.get(k) for k in GAIN_KEYS})


def with_profile_tier(deployment: Any, target: Any) -> Any:
    """``deployment`` (a profile's split and router) with the tier its profile ``target``
    deploys as searched coordinates (0: none), so a warm start from a profile lands on its
    own tier in a study that searches the tier (without them it lay outside the space and
    was skipped). Studies that do not search the tier read no tier coordinate."""
    size = float(target.kv_offloading_size or 0.0)
    return replace(deployment, kv_offloading_size=size,
                   kv_offloading_eviction_policy=target.kv_offloading_eviction_policy
                   if size else None)


def profile_kv_tier(target: dict[str, Any], deployment: dict[str, Any]) -> dict[str, Any]:
    """A profile's tier fields for the pick: the target's, with a searched size (0: none)
    and policy on top."""
    out = dict(target)
    if deployment.get("kv_offloading_size") is not None:
        out["kv_offloading_size"] = float(deployment["kv_offloading_size"]) or None
    if deployment.get("kv_offloading_eviction_policy") is not None:
        out["kv_offloading_eviction_policy"] = deployment["kv_offloading_eviction_policy"]
    return out


__all__ = ["GAIN_KEYS", "HostBudget", "KvTierGain", "host_budget",
           "kv_tier_gain", "parse_kv_policies", "parse_kv_sizes", "profile_kv_tier",
           "tier_metrics", "with_kv_tier", "with_profile_tier"]
