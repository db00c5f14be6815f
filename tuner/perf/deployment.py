"""The deployment description: how GPUs are laid out (:class:`Split`) and the router in
front of the copies (:class:`Deployment`), with vLLM's rules for which layouts start.

Why here, beside :mod:`tuner.perf.target`: a ``Target`` already names the layout (``tp``,
``dp``, ``replicas``, ``enable_expert_parallel``) and a ``Deployment`` is that layout plus
the router, so both are deployment inputs. This is the lowest stage that has what the
description needs -- the router's settings (``tuner.sim.fleet.RouterSettings``, in the sim
stage to the left) and the target with its presets (this stage) -- and every stage that
reads a deployment sits to the right: the replay runs one, the study searches over them
(``tuner.tune.deployment_space``), a profile records one (``tuner.profile``) and the report
draws it. In ``tuner.tune`` (where it was) the profile had to import the study to read its
own ``router`` section back.

Why a split matters: an operator with 8 GPUs chooses between one TP8 engine, two TP4 engines and four
TP2 engines (as vLLM data-parallel ranks of one deployment or as replicas behind a
router) before any scheduler knob matters; the split changes the step time (TP), the
KV capacity per engine (weights sharded over TP leave more room per GPU) and how the
traffic is spread. The study searches that choice with the scheduler settings
(``tuner.tune.deployment_space``).

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
Like the rest of ``tuner.perf`` this module is plain Python.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from tuner.errors import ConfigError
from tuner.perf.pd_link import PDLayout
from tuner.perf.target import Target
from tuner.sim.fleet import ROUTER_POLICIES, RouterSettings

#: The largest tensor-parallel size a split uses: one 8-GPU node.
MAX_TP = 8
#: A split's label (:attr:`Split.label`), the ``gpu_split`` value of a search space.
SPLIT_LABEL = re.compile(r"^tp=(\d+),dp=(\d+),replicas=(\d+)(,ep)?$")


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
    """A split and, where it routes (:func:`routes`), the router in front of it."""

    split: Split
    #: The router's settings; None where nothing is routed. Fields its policy does not read
    #: are reset to their defaults, so two deployments that route alike compare equal.
    router: RouterSettings | None = None
    #: drafts per request per step where the study searches ``num_speculative_tokens``
    #: (``tuner.tune.spec_space``): 0 = speculative decoding off; None = the study's own
    #: ``--speculative-config`` (or none), recorded nowhere so older records stay the same
    num_speculative_tokens: int | None = None
    #: GiB of the CPU KV tier where the study searches it (``tuner.tune.kv_tier_space``):
    #: 0 = no tier; None = the target's own ``--kv-offloading-size`` (recorded nowhere)
    kv_offloading_size: float | None = None
    #: the tier's eviction policy where searched (lru | arc); None = the target's own
    kv_offloading_eviction_policy: str | None = None
    #: disaggregated prefill/decode pools where the study searches them
    #: (``tuner.tune.pd_space``): ``split`` is then one decode instance (its TP) and
    #: ``router`` None; None = aggregated (recorded nowhere, so older records stay the same)
    pd: PDLayout | None = None
    #: the P/D proxy's policy (``tuner.tune.pd_space.PD_ROUTERS``); set with ``pd`` only
    pd_router: str | None = None

    def __post_init__(self) -> None:
        if self.pd is not None and self.router is not None:
            raise ConfigError("deployment: a P/D layout routes through its proxy (pd_router), "
                              "not a fleet router")
        if self.router is None:
            return
        if not isinstance(self.router, RouterSettings):
            raise TypeError(f"Deployment.router {self.router!r}: expected RouterSettings or None")
        if not routes(self.split.replicas, self.split.dp, self.router.policy):
            raise ConfigError("router: a router needs replicas > 1 (or, for prefix-aware, "
                              "DP ranks to pick from)")
        try:
            normal = router_settings(self.router.to_dict())
        except ConfigError as exc:
            raise ConfigError(f"router.{exc}") from None
        object.__setattr__(self, "router", normal)

    def describe(self) -> str:
        """For people: ``TP2 x 4 replicas, router prefix-aware (overlap_weight 1.5)``."""
        text = self.split.describe() if self.pd is None else _describe_pd(self)
        if self.router is not None:
            params = ", ".join(f"{k} {v}" for k, v in self.router.to_dict().items()
                               if k != "policy")
            text += f", router {self.router.policy}" + (f" ({params})" if params else "")
        if self.num_speculative_tokens is not None:
            k = self.num_speculative_tokens
            text += f", num_speculative_tokens {k}" if k else ", no speculative decoding"
        if self.kv_offloading_size is not None:
            size = self.kv_offloading_size
            text += (f", CPU KV tier {size:g} GiB" if size else ", no CPU KV tier")
            if size and self.kv_offloading_eviction_policy:
                text += f" ({self.kv_offloading_eviction_policy})"
        return text

    def to_dict(self) -> dict[str, Any]:
        """The form a study records beside the scheduler settings (stable key order)."""
        s = self.split
        return {"tp": s.tp, "dp": s.dp, "replicas": s.replicas,
                "enable_expert_parallel": s.enable_expert_parallel,
                "router": None if self.router is None else self.router.to_dict(),
                **({} if self.num_speculative_tokens is None
                   else {"num_speculative_tokens": self.num_speculative_tokens}),
                **{key: getattr(self, key) for key in _TIER_KEYS
                   if getattr(self, key) is not None},
                **({} if self.pd is None
                   else {"pd": {**self.pd.to_dict(), "router": self.pd_router}})}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "deployment") -> "Deployment":
        """Read :meth:`to_dict`'s form back; a bad field raises a one-line ConfigError."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: must be a mapping (tp, dp, replicas, ...)")
        unknown = set(data) - {"tp", "dp", "replicas", "enable_expert_parallel", "router",
                               "num_speculative_tokens", "pd", *_TIER_KEYS}
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
        raw = data.get("router")
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(f"{where}.router: must be a mapping with a 'policy' key or null")
        split = Split(data.get("tp", 1), data.get("dp", 1), data.get("replicas", 1), ep)
        k = data.get("num_speculative_tokens")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise ConfigError(f"{where}.num_speculative_tokens: must be an integer >= 0 "
                              f"(got {k!r})")
        try:
            if raw is not None and not routes(split.replicas, split.dp, raw.get("policy")):
                raise ConfigError("router: a router needs replicas > 1 (or, for prefix-aware, "
                                  "DP ranks to pick from)")
            try:
                router = None if raw is None else router_settings(raw)
            except ConfigError as exc:
                raise ConfigError(f"router.{exc}") from None
            return cls(split, router, k, *_tier_from_dict(data), *_pd_from_dict(data))
        except ConfigError as exc:
            raise ConfigError(f"{where}.{exc}") from None

    @classmethod
    def of_target(cls, target: Target, router: RouterSettings | None = None) -> "Deployment":
        """The deployment ``target`` describes (its router given separately; dropped where
        the target's layout routes nothing)."""
        split = Split(target.tp, target.dp, target.replicas, target.enable_expert_parallel)
        keep = router is not None and routes(split.replicas, split.dp, router.policy)
        return cls(split, router if keep else None)

    def apply(self, target: Target) -> Target:
        """``target`` laid out as this split.

        A ``num_gpu_blocks`` override is per engine at the target's TP; it is scaled by
        the TP ratio (a lower bound: sharded weights leave more than proportionally
        more memory for the KV cache), as the capacity search does.
        """
        s = self.split
        blocks = target.num_gpu_blocks
        if self.pd is not None:  # the decode pool's engine: the P/D replay's main target
            s = Split(self.pd.decode_tp or s.tp)
        tier: dict[str, Any] = {}
        if self.kv_offloading_size is not None:  # a searched tier (0: none)
            tier["kv_offloading_size"] = self.kv_offloading_size or None
        if self.kv_offloading_eviction_policy is not None:
            tier["kv_offloading_eviction_policy"] = self.kv_offloading_eviction_policy
        return dataclasses.replace(
            target, tp=s.tp, dp=s.dp, replicas=s.replicas,
            enable_expert_parallel=s.enable_expert_parallel,
            num_gpu_blocks=None if blocks is None else max(2, int(blocks * s.tp / target.tp)),
            **tier)


#: The CPU KV tier's fields of a searched deployment (``tuner.tune.kv_tier_space``).
_TIER_KEYS = ("kv_offloading_size", "kv_offloading_eviction_policy")


def _tier_from_dict(data: dict[str, Any]) -> tuple[float | None, str | None]:
    """A recorded deployment's tier fields, checked (one-line ConfigError; the caller
    prefixes the section)."""
    size, policy = data.get("kv_offloading_size"), data.get("kv_offloading_eviction_policy")
    if size is not None and (isinstance(size, bool) or not isinstance(size, (int, float))
                             or size < 0):
        raise ConfigError(f"kv_offloading_size: must be GiB >= 0 (0 = no tier; "
                          f"got {size!r})")
    if policy is not None and policy not in ("lru", "arc"):
        raise ConfigError(f"kv_offloading_eviction_policy: 'lru' or 'arc' "
                          f"(got {policy!r})")
    return (None if size is None else float(size)), policy


def pd_layout_label(layout: PDLayout) -> str:
    """A P/D layout's search-space value (``pd.layout``): ``1:3,prefill_tp=8,decode_tp=4``,
    as :attr:`Split.label` is a split's."""
    label = (f"{layout.num_prefill}:{layout.num_decode},prefill_tp={layout.prefill_tp},"
             f"decode_tp={layout.decode_tp}")
    # a mixed layout (the prefill pool on other hardware) names it; a layout of one
    # hardware keeps the label it always had (same study keys)
    hw = layout.prefill_hardware
    return label if hw is None else f"{label},prefill_hardware={hw}"


def _describe_pd(deployment: Deployment) -> str:
    """``P/D 1:3 (prefill TP8, decode TP4; prefill pool max_num_seqs 32; proxy llm-d)``."""
    pd = deployment.pd
    assert pd is not None
    on = f" on {pd.prefill_hardware}" if pd.prefill_hardware else ""
    own = ", ".join(f"{k} {v}" for k, v in pd.prefill_overrides().items())
    text = (f"P/D {pd.num_prefill}:{pd.num_decode} (prefill TP{pd.prefill_tp}{on}, "
            f"decode TP{pd.decode_tp}" + (f"; prefill pool {own}" if own else "")
            + ("; push" if pd.transfer_mode == "push" else ""))
    return text + (f"; proxy {deployment.pd_router})" if deployment.pd_router else ")")


def _pd_from_dict(data: dict[str, Any]) -> tuple[PDLayout | None, str | None]:
    """A recorded deployment's P/D layout (``pd``: PDLayout.to_dict plus ``router``),
    checked (one-line ConfigError; the caller prefixes the section)."""
    raw = data.get("pd")
    if raw is None:
        return None, None
    if not isinstance(raw, dict):
        raise ConfigError("pd: must be a mapping (num_prefill, num_decode, prefill_tp, ...)")
    counts = {}
    for key in ("num_prefill", "num_decode", "prefill_tp", "decode_tp"):
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"pd.{key}: must be an integer >= 1 (got {value!r})")
        counts[key] = value
    link = raw.get("link", "auto")
    if link not in ("auto", "same-node", "cross-node"):
        raise ConfigError(f"pd.link: auto, same-node or cross-node (got {link!r})")
    hw, router = raw.get("prefill_hardware"), raw.get("router")
    if hw is not None and not isinstance(hw, str):
        raise ConfigError(f"pd.prefill_hardware: a preset name (got {hw!r})")
    from tuner.sim.disagg.routers import PD_ROUTERS

    if router is not None and router not in PD_ROUTERS:
        raise ConfigError(f"pd.router: one of {', '.join(PD_ROUTERS)} (got {router!r})")
    limits = {}
    for key in ("prefill_max_num_batched_tokens", "prefill_max_num_seqs"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ConfigError(f"pd.{key}: must be an integer >= 1 or absent (got {value!r})")
        limits[key] = value
    mode = raw.get("transfer_mode", "pull")
    if mode not in ("pull", "push"):
        raise ConfigError(f"pd.transfer_mode: pull or push (got {mode!r})")
    layout = PDLayout(**counts, prefill_hardware=hw, link=link, transfer_mode=mode,
                      **limits)
    return (layout if router is None else dataclasses.replace(layout, router=router)), router


def routes(replicas: int, dp: int, policy: Any) -> bool:
    """Whether a router has something to choose: replicas, or for ``prefix-aware`` the
    DP ranks of one deployment (it routes to a replica's rank, as Dynamo's KV router
    routes to ``(worker, dp_rank)`` and vLLM honours the request's ``data_parallel_rank``)."""
    return replicas > 1 or (policy == "prefix-aware" and dp > 1)


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


def router_settings(raw: Any) -> RouterSettings:
    """A router section (dict form, as a profile or a study records it) as the replay's
    ``RouterSettings``; a bad field raises a one-line ConfigError naming it (the caller
    names the section)."""
    return RouterSettings.from_dict(check_router(raw))


def default_router(policy: str = "round-robin") -> RouterSettings:
    """The router a fleet gets when only its policy is chosen: the replay's
    ``RouterSettings`` defaults."""
    if policy not in ROUTER_POLICIES:
        raise ConfigError(f"router policy {policy!r} must be one of {', '.join(ROUTER_POLICIES)}")
    return RouterSettings(policy=policy)


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


__all__ = ["MAX_TP", "SPLIT_LABEL", "Deployment", "Split", "check_router", "default_router",
           "gpu_splits", "pd_layout_label", "router_settings", "routes", "split_refusal"]
