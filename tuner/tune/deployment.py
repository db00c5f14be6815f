"""Deployment dimensions of a study: how a fixed GPU budget is split, and the router.

Why: an operator with 8 GPUs chooses between one TP8 engine, two TP4 engines and four
TP2 engines (as vLLM data-parallel ranks of one deployment or as replicas behind a
router) before any scheduler knob matters; the split changes the step time (TP), the
KV capacity per engine (weights sharded over TP leave more room per GPU) and how the
traffic is spread. The study searches that choice with the scheduler settings.

A split is ``tp x dp x replicas`` GPUs: ``tp`` GPUs per engine (vLLM
``--tensor-parallel-size``), ``dp`` data-parallel ranks per deployment
(``--data-parallel-size``; each rank is an engine with its own scheduler and KV cache)
and ``replicas`` deployments behind a router. :func:`gpu_splits` lists every split of
a budget and refuses, with vLLM's reason, the ones vLLM would not start:

* the attention heads must divide by TP (vLLM 0.33.0 ``ModelConfig.
  verify_with_parallel_config``, ``config/model.py`` 1557-1563);
* the KV heads must divide by TP, or TP by the KV heads when TP is larger (they are
  replicated then; ``QKVParallelLinear`` in ``model_executor/layers/linear.py``
  1066-1070 asserts it through ``divide``);
* ``--enable-expert-parallel`` needs an MoE model (``config/model.py`` 1498-1503);
  experts need not divide by the EP size (``determine_expert_map`` gives the
  remainder to the first ranks), so no divisibility rule applies to them;
* TP stays within one node (:data:`MAX_TP`, 8 GPUs), as the step-time model prices
  intra-node all-reduce only;
* the weights must fit with room for one ``max_model_len`` sequence of KV cache
  (:func:`tuner.perf.presets.resolve_target`, which sizes the cache per engine at
  that TP as vLLM's profiling would).

The router is a dimension only where a split has more than one replica; a
:class:`Deployment` with one replica has no router, except a prefix-aware one that picks
the DP rank of its one deployment (:func:`routes`), which a fixed target may carry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tuner.errors import ConfigError
from tuner.perf.target import Target
from tuner.sim.fleet import ROUTER_PARAMS, ROUTER_POLICIES, RouterSettings
from tuner.sim.settings import SchedulerSettings
from tuner.tune.space import (GPU_SPLIT, ROUTER_POLICY, ROUTER_PREFIX, SPLIT_LABEL, Param, Scalar,
                              SearchSpace)

#: The largest tensor-parallel size a split uses: one 8-GPU node.
MAX_TP = 8


@dataclass(frozen=True, slots=True, order=True)
class Split:
    """One way to lay out GPUs: ``tp`` per engine, ``dp`` ranks, ``replicas`` copies."""

    tp: int
    dp: int = 1
    replicas: int = 1
    enable_expert_parallel: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.dp * self.replicas

    @property
    def engines(self) -> int:
        """Schedulers (and KV caches) in the deployment: one per DP rank per replica."""
        return self.dp * self.replicas

    @property
    def label(self) -> str:
        """The Optuna categorical value: ``tp=4,dp=2,replicas=1`` (``,ep`` with EP)."""
        return (f"tp={self.tp},dp={self.dp},replicas={self.replicas}"
                + (",ep" if self.enable_expert_parallel else ""))

    @classmethod
    def parse(cls, label: str) -> "Split":
        m = SPLIT_LABEL.match(label)
        if m is None:
            raise ConfigError(f"gpu_split {label!r}: expected tp=T,dp=D,replicas=R[,ep]")
        return cls(int(m[1]), int(m[2]), int(m[3]), m[4] is not None)

    def describe(self) -> str:
        """For people: ``TP4 x DP2``, ``TP2 x 4 replicas``, ``TP8``."""
        text = f"TP{self.tp}" + (f" x DP{self.dp}" if self.dp > 1 else "")
        if self.replicas > 1:
            text += f" x {self.replicas} replicas"
        return text + (" (EP)" if self.enable_expert_parallel else "")


@dataclass(frozen=True, slots=True)
class Deployment:
    """A split and, where it routes (:func:`routes`), the router in front of it.

    ``router`` is the router's settings in their dict form (``{"policy": ..., params}``,
    what ``RouterSettings.to_dict`` writes); None where nothing is routed.
    """

    split: Split
    router: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.router is not None and not routes(self.split.replicas, self.split.dp,
                                                  self.router.get("policy")):
            raise ConfigError("router: a router needs replicas > 1 (or, for prefix-aware, "
                              "DP ranks to pick from)")
        if self.router is not None:
            try:
                check_router(self.router)
            except ConfigError as exc:
                raise ConfigError(f"router.{exc}") from None

    def describe(self) -> str:
        """For people: ``TP2 x 4 replicas, router prefix-aware (overlap_weight 1.5)``."""
        text = self.split.describe()
        if self.router is not None:
            params = ", ".join(f"{k} {v}" for k, v in self.router.items() if k != "policy")
            text += f", router {self.router['policy']}" + (f" ({params})" if params else "")
        return text

    def to_dict(self) -> dict[str, Any]:
        """The form a study records beside the scheduler settings (stable key order)."""
        s = self.split
        return {"tp": s.tp, "dp": s.dp, "replicas": s.replicas,
                "enable_expert_parallel": s.enable_expert_parallel,
                "router": None if self.router is None else dict(self.router)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "deployment") -> "Deployment":
        """Read :meth:`to_dict`'s form back; a bad field raises a one-line ConfigError."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: must be a mapping (tp, dp, replicas, ...)")
        unknown = set(data) - {"tp", "dp", "replicas", "enable_expert_parallel", "router"}
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown field; known: tp, dp, "
                              "replicas, enable_expert_parallel, router")
        for key in ("tp", "dp", "replicas"):
            value = data.get(key, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}.{key}: must be an integer >= 1 (got {value!r})")
        ep = data.get("enable_expert_parallel", False)
        if not isinstance(ep, bool):
            raise ConfigError(f"{where}.enable_expert_parallel: must be true or false")
        router = data.get("router")
        if router is not None and not isinstance(router, dict):
            raise ConfigError(f"{where}.router: must be a mapping with a 'policy' key or null")
        try:
            return cls(Split(data.get("tp", 1), data.get("dp", 1), data.get("replicas", 1), ep),
                       None if router is None else dict(router))
        except ConfigError as exc:
            raise ConfigError(f"{where}.{exc}") from None

    @classmethod
    def of_target(cls, target: Target, router: dict[str, Any] | None = None) -> "Deployment":
        """The deployment ``target`` describes (its router given separately)."""
        split = Split(target.tp, target.dp, target.replicas, target.enable_expert_parallel)
        keep = router is not None and routes(split.replicas, split.dp, router.get("policy"))
        return cls(split, router if keep else None)

    def apply(self, target: Target) -> Target:
        """``target`` laid out as this split.

        A ``num_gpu_blocks`` override is per engine at the target's TP; it is scaled by
        the TP ratio (a lower bound: sharded weights leave more than proportionally
        more memory for the KV cache), as the capacity search does.
        """
        s = self.split
        blocks = target.num_gpu_blocks
        return dataclasses.replace(
            target, tp=s.tp, dp=s.dp, replicas=s.replicas,
            enable_expert_parallel=s.enable_expert_parallel,
            num_gpu_blocks=None if blocks is None else max(2, int(blocks * s.tp / target.tp)))


def routes(replicas: int, dp: int, policy: Any) -> bool:
    """Whether a router has something to choose: replicas, or for ``prefix-aware`` the
    DP ranks of one deployment (it routes to a replica's rank, as Dynamo's KV router
    routes to ``(worker, dp_rank)`` and vLLM honours the request's ``data_parallel_rank``)."""
    return replicas > 1 or (policy == "prefix-aware" and dp > 1)


def split_refusal(model: Any, split: Split) -> str | None:
    """Why vLLM would refuse ``split`` for ``model`` (a ``ModelSpec``), else None.

    Only the shape rules (module docstring); memory is :func:`gpu_splits`'s check.
    """
    tp, heads, kv = split.tp, int(model.num_attention_heads), int(model.num_kv_heads)
    if tp > MAX_TP:
        return f"TP {tp} spans more than one {MAX_TP}-GPU node"
    if heads % tp:
        return (f"{heads} attention heads do not divide by TP {tp} (vLLM: heads must be "
                "divisible by tensor parallel size)")
    if model.attention != "mla" and (kv % tp if tp < kv else tp % kv):
        return f"{kv} KV heads and TP {tp} do not divide one another (vLLM QKVParallelLinear)"
    if split.enable_expert_parallel and not model.is_moe:
        return "--enable-expert-parallel needs an MoE model (vLLM refuses it for a dense one)"
    return None


def gpu_splits(target: Target, budget: int, *, expert_parallel: bool | None = None
               ) -> tuple[list[Split], list[tuple[Split, str]]]:
    """Every ``tp x dp x replicas`` split of ``budget`` GPUs for ``target``'s model.

    TP runs over powers of two up to :data:`MAX_TP`; DP and replicas over every factor
    pair of the rest. ``expert_parallel``: None tries both for an MoE model with more
    than one GPU per deployment (dense: off), True/False fixes it.

    Returns:
        (valid splits, sorted by TP descending then DP descending; refused splits with
        the reason).

    Raises:
        ConfigError: ``budget`` < 1, or no split is valid (the message lists why).
    """
    from tuner.perf.presets import load_model, resolve_target

    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ConfigError(f"--gpu-budget {budget!r}: must be an integer >= 1")
    model = load_model(target.model)
    valid: list[Split] = []
    refused: list[tuple[Split, str]] = []
    fits: dict[tuple[int, int, bool], str | None] = {}
    tps = [t for t in (1, 2, 4, 8, 16) if budget % t == 0]
    for tp in sorted(tps, reverse=True):
        rest = budget // tp
        for dp in sorted((d for d in range(1, rest + 1) if rest % d == 0), reverse=True):
            replicas = rest // dp
            eps = ((False, True) if expert_parallel is None and model.is_moe and tp * dp > 1
                   else (bool(expert_parallel),) if expert_parallel is not None
                   else (False,))
            for ep in eps:
                split = Split(tp, dp, replicas, ep)
                why = split_refusal(model, split)
                if why is None:
                    engine = (tp, dp, ep)  # what sizes one engine's memory
                    if engine not in fits:
                        fits[engine] = _fit_refusal(resolve_target, target, split)
                    why = fits[engine]
                (refused.append((split, why)) if why else valid.append(split))
    if not valid:
        reasons = "; ".join(f"{s.describe()}: {why}" for s, why in refused[:4])
        raise ConfigError(f"--gpu-budget {budget}: no split of {budget} GPU runs "
                          f"{target.model} ({reasons})")
    return valid, refused


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
    split = Split.parse(str(params[GPU_SPLIT])) if GPU_SPLIT in params else base.split
    if split.replicas == 1:
        return Deployment(split, None)
    router = dict(base.router) if base.router is not None else default_router()
    if ROUTER_POLICY in params and params[ROUTER_POLICY] != router.get("policy"):
        router = default_router(str(params[ROUTER_POLICY]))
    router.update({k[len(ROUTER_PREFIX):]: v for k, v in params.items()
                   if k.startswith(ROUTER_PREFIX) and k != ROUTER_POLICY})
    return Deployment(split, check_router(router))


def base_deployment_of(evaluator: Any) -> Deployment | None:
    """The deployment an evaluator replays when a point does not change it (its
    ``default_deployment``; None for evaluators that replay one fixed deployment)."""
    return getattr(evaluator, "default_deployment", None)


def evaluate_point(evaluator: Any, settings: dict[str, Any], window: str) -> dict[str, Any]:
    """Replay one point's settings dict (:func:`join_settings`) on ``window``.

    An evaluator is asked about a deployment only when the point carries one, so the
    ones that replay a fixed deployment (tests, custom backends) keep their signature.
    """
    scheduler, deployment = split_settings(settings)
    if deployment is None:
        return evaluator.evaluate(scheduler, window)
    return evaluator.evaluate(scheduler, window, deployment=deployment)


def profile_deployment(profile: Any) -> Deployment:
    """The deployment a profile records (``target`` and its ``router`` section)."""
    t = profile.target
    return Deployment(Split(t.tp, t.dp, t.replicas, t.enable_expert_parallel), profile.router)


def check_router(raw: Any) -> dict[str, Any]:
    """A router's settings (dict form), validated by the replay's ``RouterSettings`` and
    normalised to the fields its policy reads; a bad field raises a one-line
    ConfigError naming it."""
    if not isinstance(raw, dict):
        raise ConfigError(f"must be a mapping with a 'policy' key (got {type(raw).__name__})")
    if raw.get("policy") not in ROUTER_POLICIES:
        raise ConfigError(f"policy: {raw.get('policy')!r} must be one of "
                          f"{', '.join(ROUTER_POLICIES)}")
    try:
        return RouterSettings.from_dict(raw).to_dict()
    except ConfigError as exc:  # "router: ..." / "router x=...": the caller names the section
        text = str(exc)
        for prefix in ("router: ", "router "):
            if text.startswith(prefix):
                text = text[len(prefix):]
                break
        raise ConfigError(text) from None


def default_router(policy: str = "round-robin") -> dict[str, Any]:
    """The router settings a fleet gets when only its policy is chosen (dict form: the
    replay's ``RouterSettings`` defaults for the fields the policy reads)."""
    if policy not in ROUTER_POLICIES:
        raise ConfigError(f"router policy {policy!r} must be one of {', '.join(ROUTER_POLICIES)}")
    return RouterSettings(policy=policy).to_dict()


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


def _fit_refusal(resolve: Any, target: Target, split: Split) -> str | None:
    """Why one engine of ``split`` does not fit (resolve_target's message), or None.

    The engine is resolved with the split's TP, DP and expert parallelism (one replica:
    replicas do not change an engine's memory), so the KV sizing is the replay's own.
    """
    blocks = target.num_gpu_blocks
    try:
        resolve(dataclasses.replace(
            target, tp=split.tp, dp=split.dp, replicas=1,
            enable_expert_parallel=split.enable_expert_parallel,
            num_gpu_blocks=None if blocks is None else max(2, int(blocks * split.tp / target.tp))))
    except ConfigError as exc:
        return str(exc)
    return None


__all__ = ["DEPLOYMENT_KEY", "Deployment", "MAX_TP", "ROUTER_POLICIES", "Split", "default_router",
           "deployment_for", "deployment_params", "gpu_splits", "join_settings", "split_refusal", "split_settings",
           "with_deployment"]
