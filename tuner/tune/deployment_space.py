"""The deployment dimensions of a study: a GPU budget's splits and the router, searched
with the scheduler settings.

The deployment itself -- :class:`~tuner.perf.deployment.Split`,
:class:`~tuner.perf.deployment.Deployment`, the router's settings and vLLM's rules for
which splits start (:func:`~tuner.perf.deployment.gpu_splits`) -- is described in
:mod:`tuner.perf.deployment`, upstream of the study, so a profile and the report read a
deployment without importing the search. This module only turns it into search-space
parameters (``gpu_split``, ``router.policy``, ``router.<param>``; :func:`with_deployment`)
and a drawn point back into a deployment (:func:`deployment_for`).

A point is replayed with its scheduler settings and its deployment as two objects
(:func:`evaluate_point`); the one dict form (:func:`join_settings`) is what the study
records and keys its replays by.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuner.errors import ConfigError
from tuner.perf.deployment import (Deployment, Split, default_router, gpu_splits,
                                   router_settings)
from tuner.perf.target import Target
from tuner.sim.fleet import ROUTER_PARAMS, ROUTER_POLICIES
from tuner.sim.settings import SchedulerSettings
from tuner.tune.pd_space import pd_deployment_for
from tuner.tune.space import (GPU_SPLIT, KV_TIER_POLICY, KV_TIER_SIZE, ROUTER_POLICY,
                              ROUTER_PREFIX, SPEC_TOKENS, Param, Scalar, SearchSpace)


#: The key under which a point's settings dict (``Point.settings``, the study records)
#: carries its deployment when the space varies one; the rest is ``SchedulerSettings``.
DEPLOYMENT_KEY = "deployment"


def join_settings(settings: SchedulerSettings, deployment: Deployment | None) -> dict[str, Any]:
    """A point's settings dict: the scheduler fields, plus the deployment when searched.

    Why one dict: the study keys every replay by this dict (``settings_key``), so two
    points that differ only in their split or router stay two points, and a study
    without deployment dimensions keeps exactly the keys it always had.
    """
    out = settings.to_dict()
    if deployment is not None:
        out[DEPLOYMENT_KEY] = deployment.to_dict()
    return out


def split_settings(data: dict[str, Any]) -> tuple[SchedulerSettings, Deployment | None]:
    """:func:`join_settings` reversed."""
    rest = {k: v for k, v in data.items() if k != DEPLOYMENT_KEY}
    raw = data.get(DEPLOYMENT_KEY)
    return (SchedulerSettings.from_dict(rest),
            None if raw is None else Deployment.from_dict(raw))


def scheduler_part(settings: dict[str, Any]) -> dict[str, Any]:
    """A point's settings dict without its deployment: the SchedulerSettings fields."""
    return {k: v for k, v in settings.items() if k != DEPLOYMENT_KEY}


def deployment_for(space: SearchSpace, base: Deployment | None, params: dict[str, Any]
                   ) -> Deployment | None:
    """``base`` with the deployment ``params`` of a point applied; None when ``space``
    varies no deployment.

    A split with replicas and no drawn router keeps ``base``'s router (or the default
    router settings); a drawn policy other than ``base``'s starts from that policy's
    defaults; drawn ``router.<param>`` values go on top. A split with one replica has no
    router.
    """
    if not space.has_deployment:
        return None
    if base is None:
        raise ConfigError(f"search space {space.name!r} varies the deployment; the "
                          "evaluator has no base deployment to vary")
    pd = pd_deployment_for(params)  # a P/D layout (tuner.tune.pd_space), else aggregated
    if pd is not None:
        return pd
    split = Split.parse(str(params[GPU_SPLIT])) if GPU_SPLIT in params else base.split
    k = params.get(SPEC_TOKENS, base.num_speculative_tokens)  # tuner.tune.spec_space
    tier = (params.get(KV_TIER_SIZE, base.kv_offloading_size),  # tuner.tune.kv_tier_space
            params.get(KV_TIER_POLICY, base.kv_offloading_eviction_policy))
    if split.replicas == 1:
        return Deployment(split, None, k, *tier)
    router = base.router if base.router is not None else default_router()
    if ROUTER_POLICY in params and params[ROUTER_POLICY] != router.policy:
        router = default_router(str(params[ROUTER_POLICY]))
    drawn = {k[len(ROUTER_PREFIX):]: v for k, v in params.items()
             if k.startswith(ROUTER_PREFIX) and k != ROUTER_POLICY}
    if drawn:
        router = router_settings({**router.to_dict(), **drawn})
    return Deployment(split, router, k, *tier)


def base_deployment_of(evaluator: Any) -> Deployment | None:
    """The deployment an evaluator replays when a point does not change it (its
    ``default_deployment``; None for evaluators that replay one fixed deployment)."""
    return getattr(evaluator, "default_deployment", None)


def evaluate_point(evaluator: Any, settings: SchedulerSettings, deployment: Deployment | None,
                   window: str, stop: Sequence[Any] = ()) -> dict[str, Any]:
    """Replay one point -- its scheduler ``settings`` on ``deployment`` (None: the
    evaluator's own) -- on ``window``; ``stop``: early-stop rules
    (:mod:`tuner.tune.early_stop`), passed only to an evaluator that supports them.

    An evaluator is asked about a deployment (or stop rules) only when the point carries
    one, so the ones that replay a fixed deployment (tests, custom backends) keep their
    signature.
    """
    extra: dict[str, Any] = {}
    if deployment is not None:
        extra["deployment"] = deployment
    if stop and getattr(evaluator, "supports_early_stop", False):
        extra["stop"] = stop
    return evaluator.evaluate(settings, window, **extra)


def router_params(policies: Sequence[str], when: tuple[tuple[str, tuple[Scalar, ...]], ...]
                  ) -> tuple[Param, ...]:
    """The router's own parameters as search-space parameters (``router.<name>``), each
    conditional on the policies that read it (and on ``when``). Ranges are the replay's
    (``tuner.sim.fleet.ROUTER_PARAMS``); a parameter no searched policy reads is left out.
    ``block_size`` stays at its default (the engines' KV block size): a router block
    must be a multiple of the KV block, which a range cannot express."""
    out: list[Param] = []
    for rp in ROUTER_PARAMS:
        users = tuple(p for p in policies if p in rp.policies)
        if not users or rp.name == "block_size":
            continue
        cond = when + (((ROUTER_POLICY, users),) if len(policies) > 1 else ())
        name = ROUTER_PREFIX + rp.name
        if rp.choices:
            out.append(Param(name, "categorical", choices=rp.choices, when=cond))
        elif rp.integer:
            out.append(Param(name, "int", low=int(rp.low), high=int(rp.high), when=cond))
        else:
            out.append(Param(name, "float", low=float(rp.low), high=float(rp.high),
                             step=0.25, when=cond))
    return tuple(out)


def deployment_params(splits: Sequence[Split], *, routers: Sequence[str] | None = None,
                      fixed_replicas: int = 1) -> tuple[Param, ...]:
    """The search-space parameters of a deployment (:mod:`tuner.tune.space` names).

    ``splits``: the candidate splits (more than one adds ``gpu_split``). ``routers``: the
    policies to search (None: all of :data:`ROUTER_POLICIES`; one: held fixed, a
    one-choice ``router.policy``, and only its parameters searched). The router is searched only where a split has replicas: conditional on
    those splits' labels when ``gpu_split`` is searched, unconditional when the one
    deployment has ``fixed_replicas > 1``.
    """
    policies = tuple(ROUTER_POLICIES if routers is None else routers)
    for policy in policies:
        if policy not in ROUTER_POLICIES:
            raise ConfigError(f"--routers {policy!r}: must be among {', '.join(ROUTER_POLICIES)}")
    params: list[Param] = []
    when: tuple[tuple[str, tuple[Scalar, ...]], ...] = ()
    if len(splits) > 1:
        params.append(Param(GPU_SPLIT, "categorical", choices=tuple(s.label for s in splits)))
        fleets = tuple(s.label for s in splits if s.replicas > 1)
        if not fleets:
            return tuple(params)
        when = ((GPU_SPLIT, fleets),)
    elif (splits[0].replicas if splits else fixed_replicas) == 1:
        return tuple(params)
    # One policy is a one-choice categorical: held fixed, but part of every point, so a
    # baseline behind another router is a different point (evaluated in stage 2).
    params.append(Param(ROUTER_POLICY, "categorical", choices=policies, when=when))
    return tuple(params) + router_params(policies, when)


def with_deployment(space: SearchSpace, target: Target, *, gpu_budget: int | None = None,
                    routers: Sequence[str] | None = None) -> tuple[SearchSpace, list[str]]:
    """``space`` plus the deployment dimensions ``tune`` was asked for, and notes.

    ``gpu_budget``: search the valid splits of that many GPUs (:func:`gpu_splits`; the
    target's own split is the baseline and must use the same number of GPUs).
    ``routers``: the router policies to search where a split has replicas (None: all;
    searched at all only with a budget or a target with replicas > 1).
    """
    notes: list[str] = []
    replicas = int(getattr(target, "replicas", 1))
    if gpu_budget is None:
        if replicas == 1:
            if routers:
                raise ConfigError("--routers needs a deployment with replicas (--replicas N "
                                  "or --gpu-budget N): one engine has no router")
            return space, notes
        extra = deployment_params([], routers=routers, fixed_replicas=replicas)
        return (SearchSpace(space.name + "+router", space.params + extra) if extra
                else space), notes
    own = Deployment.of_target(target).split
    if own.gpus != gpu_budget:
        raise ConfigError(f"--gpu-budget {gpu_budget}: the baseline deployment ({own.describe()}"
                          f" = {own.gpus} GPU) must use the same GPUs; pass --tp/--dp/--replicas "
                          f"that multiply to {gpu_budget}")
    valid, refused = gpu_splits(target, gpu_budget)
    if own not in valid:
        why = dict(refused).get(own, "not a split tuner searches")
        raise ConfigError(f"--gpu-budget {gpu_budget}: the baseline deployment "
                          f"{own.describe()} is not valid: {why}")
    for split, why in refused:
        notes.append(f"GPU split {split.describe()} excluded: {why}")
    extra = deployment_params(valid, routers=routers)
    return SearchSpace(f"{space.name}+gpu{gpu_budget}", space.params + extra), notes


__all__ = ["DEPLOYMENT_KEY", "base_deployment_of", "deployment_for", "deployment_params",
           "evaluate_point", "join_settings", "router_params", "scheduler_part", "split_settings",
           "with_deployment"]
