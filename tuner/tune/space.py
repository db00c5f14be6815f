"""Search spaces: which ``SchedulerSettings`` fields a study varies, and over what values.

A ``SearchSpace`` is a tuple of ``Param`` records, each naming one field of
:class:`tuner.sim.settings.SchedulerSettings` (so a vLLM ``SchedulerConfig`` field) and the
Optuna distribution it is drawn from. Every field not in the space keeps vLLM's default
for the target, so a trial's settings are ``defaults.replace(**params)``.

Built-in spaces (``docs/tuning.md`` explains the choices):

* ``admission`` -- PR #54625's two knobs. ``cache_aware_admission_window`` is categorical
  over ``{0, 1, 2, 4, 8, 16, 32, 64, 128, 256}``: 0 (strict FCFS, vLLM's default) is
  always a candidate, and powers of two spread the budget evenly over the log-like range
  that matters (the PR's evidence moved from 0 to 16). ``cache_aware_admission_threshold``
  is a float in ``[0, 1]`` on a 0.05 grid, so near-identical trials collapse into one.
* ``scheduler`` -- the admission knobs plus ``prefill_schedule_interval`` (int 1..32, log),
  ``max_num_batched_tokens`` (int 512..65536, log), ``max_num_seqs`` (powers of two
  16..2048), ``long_prefill_token_threshold`` (0 = off, or 512..16384 in powers of two),
  ``watermark`` (0..0.2 step 0.01) and ``scheduler_reserve_full_isl`` (True/False).

A YAML file defines any other space (format in ``docs/tuning.md``); a bad file raises
:class:`tuner.errors.ConfigError` naming the file and the key.

Deployment dimensions (:mod:`tuner.tune.deployment_space`) are parameters of the same space
under names that are not ``SchedulerSettings`` fields: ``gpu_split`` (categorical over
``tp=T,dp=D,replicas=R[,ep]`` labels of one GPU budget), ``router.policy`` and
``router.<param>`` (the router's own numeric parameters). A parameter may be
*conditional* (``when``): it is drawn, and part of a point, only when the parameters it
names took one of the listed values (the router only for splits with replicas, a
prefix-aware router's weights only under that policy), so a point never carries a
value that could not have mattered.

Combinations that vLLM rejects (``max_num_batched_tokens < max_num_seqs``, ...) are not
excluded from the space -- Optuna's distributions are independent boxes -- but
:meth:`SearchSpace.settings_for` raises ``ConfigError`` for them and the study records the
trial as pruned with that reason, before anything is replayed.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tuner.errors import ConfigError
from tuner.loaders import load_yaml
from tuner.perf.deployment import SPLIT_LABEL, pd_layout_label
from tuner.sim.settings import SchedulerSettings

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

ParamKind = Literal["int", "float", "categorical"]
Scalar = bool | int | float | str

#: Field types of SchedulerSettings, by name (used to type-check YAML spaces).
_FIELD_TYPES: dict[str, type] = {
    "max_num_batched_tokens": int,
    "max_num_seqs": int,
    "long_prefill_token_threshold": int,
    "enable_chunked_prefill": bool,
    "policy": str,
    "scheduler_reserve_full_isl": bool,
    "watermark": float,
    "prefill_schedule_interval": int,
    "cache_aware_admission_window": int,
    "cache_aware_admission_threshold": float,
}
assert set(_FIELD_TYPES) == {f.name for f in dataclasses.fields(SchedulerSettings)}, (
    "tuner.tune.space._FIELD_TYPES is out of date with SchedulerSettings")

#: The parameter naming a GPU split (``Split.label`` values) and the router parameters.
GPU_SPLIT = "gpu_split"
ROUTER_POLICY = "router.policy"
ROUTER_PREFIX = "router."
#: ``num_speculative_tokens`` as a deployment dimension (0 = off): tuner.tune.spec_space
SPEC_TOKENS = "speculative.num_speculative_tokens"
#: the CPU KV tier as deployment dimensions (GiB, 0 = no tier; lru | arc):
#: tuner.tune.kv_tier_space
KV_TIER_SIZE = "kv_offloading.size"
KV_TIER_POLICY = "kv_offloading.eviction_policy"
#: disaggregated prefill/decode layouts as deployment dimensions (``pd.mode``,
#: ``pd.layout``, ``pd.router``): tuner.tune.pd_space
PD_PREFIX = "pd."
PD_MODE = PD_PREFIX + "mode"  # "aggregated" | "disaggregated" (--disaggregated auto only)
PD_LAYOUT = PD_PREFIX + "layout"  # tuner.perf.deployment.pd_layout_label values
PD_ROUTER = PD_PREFIX + "router"  # the P/D proxy's policy
#: the prefill pool's own limits (tuner.perf.pd_link.PDLayout.prefill_max_num_*)
PD_PREFILL_BATCHED_TOKENS = PD_PREFIX + "prefill_max_num_batched_tokens"
PD_PREFILL_SEQS = PD_PREFIX + "prefill_max_num_seqs"
#: who moves the KV (vLLM's ``transfer_mode``: pull | push), searched with
#: ``--pd-transfer-modes`` (tuner.tune.pd_space.transfer_mode_params)
PD_TRANSFER_MODE = PD_PREFIX + "transfer_mode"
PD_PARAMS = (PD_MODE, PD_LAYOUT, PD_ROUTER, PD_PREFILL_BATCHED_TOKENS, PD_PREFILL_SEQS,
             PD_TRANSFER_MODE)
AGGREGATED, DISAGGREGATED = "aggregated", "disaggregated"

#: A base on which any single field value passes the cross-field checks
#: (``max_num_batched_tokens >= max_num_seqs``), so one value can be range-checked alone.
_PERMISSIVE_BASE = SchedulerSettings(max_num_batched_tokens=1 << 30, max_num_seqs=1)


@dataclass(frozen=True, slots=True)
class Param:
    """One searched field and its distribution.

    ``int``/``float`` draw from ``[low, high]`` (inclusive), optionally on a ``log`` scale or
    on a ``step`` grid (not both, as in Optuna). ``categorical`` draws from ``choices``.
    ``when`` makes it conditional: ``((other, (values...)), ...)``, active only where every
    named parameter took one of its values.
    """

    name: str  # a SchedulerSettings field name, gpu_split or router.<name>
    kind: ParamKind
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Scalar, ...] = ()
    when: tuple[tuple[str, tuple[Scalar, ...]], ...] = ()

    def active(self, drawn: dict[str, Any]) -> bool:
        """Whether this parameter applies given the values ``drawn`` so far."""
        return all(name in drawn and any(type(drawn[name]) is type(v) and drawn[name] == v
                                         for v in values) for name, values in self.when)

    def distribution(self) -> "BaseDistribution":
        """The Optuna distribution this parameter is drawn from."""
        from optuna.distributions import (CategoricalDistribution, FloatDistribution,
                                          IntDistribution)

        if self.kind == "categorical":
            return CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log,  # type: ignore[arg-type]
                                   step=int(self.step or 1))
        return FloatDistribution(float(self.low), float(self.high), log=self.log,  # type: ignore[arg-type]
                                 step=self.step)

    def suggest(self, trial: "optuna.Trial") -> Scalar:
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))  # type: ignore[arg-type]
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high),  # type: ignore[arg-type]
                                     log=self.log, step=int(self.step or 1))
        return trial.suggest_float(self.name, float(self.low), float(self.high),  # type: ignore[arg-type]
                                   log=self.log, step=self.step)

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is a point of this parameter's distribution."""
        if self.kind == "categorical":
            return any(type(value) is type(c) and value == c for c in self.choices)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not self.low <= value <= self.high:  # type: ignore[operator]
            return False
        if self.step is not None:
            k = (value - self.low) / self.step  # type: ignore[operator]
            return math.isclose(k, round(k), abs_tol=1e-9)
        return self.kind == "float" or float(value).is_integer()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind}
        if self.kind == "categorical":
            out["choices"] = list(self.choices)
        else:
            out.update(low=self.low, high=self.high)
            if self.log:
                out["log"] = True
            if self.step is not None:
                out["step"] = self.step
        if self.when:
            out["when"] = {name: list(values) for name, values in self.when}
        return out


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """A named set of ``Param`` s over distinct ``SchedulerSettings`` fields."""

    name: str
    params: tuple[Param, ...]

    def __post_init__(self) -> None:
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ConfigError(f"search space {self.name!r} names a field twice: {names}")
        if not names:
            raise ConfigError(f"search space {self.name!r} has no parameters")
        for i, p in enumerate(self.params):
            for other, _ in p.when:
                if other not in names[:i]:
                    raise ConfigError(f"search space {self.name!r}: {p.name} depends on "
                                      f"{other!r}, which is not a parameter before it")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def has_deployment(self) -> bool:
        """Whether the space varies the GPU split or the router (not only the scheduler)."""
        return any(is_deployment_param(p.name) for p in self.params)

    def suggest(self, trial: "optuna.Trial") -> dict[str, Scalar]:
        """Draw one point: ``{field: value}`` in space order, conditional ones if active."""
        drawn: dict[str, Scalar] = {}
        for p in self.params:
            if p.active(drawn):
                drawn[p.name] = p.suggest(trial)
        return drawn

    def distributions(self) -> dict[str, "BaseDistribution"]:
        return {p.name: p.distribution() for p in self.params}

    def project(self, settings: SchedulerSettings,
                deployment: Any = None) -> dict[str, Scalar]:
        """The space's coordinates of ``settings`` and ``deployment`` (a
        ``tuner.perf.deployment.Deployment``; may lie outside
        the space). Deployment parameters need ``deployment``; conditional ones appear
        where active."""
        out: dict[str, Scalar] = {}
        for p in self.params:
            if is_deployment_param(p.name):
                if deployment is None:
                    raise ConfigError(f"search space {self.name!r} varies {p.name}: the "
                                      "point needs its deployment")
                value = deployment_value(deployment, p.name)
            else:
                value = getattr(settings, p.name)
            if value is not None and p.active(out):
                out[p.name] = value
        return out

    def contains(self, params: dict[str, Any]) -> bool:
        """Whether ``params`` names exactly this space's active fields, each inside its
        range."""
        active: dict[str, Any] = {}
        for p in self.params:
            if p.active(active):
                if p.name not in params or not p.contains(params[p.name]):
                    return False
                active[p.name] = params[p.name]
        return set(params) == set(active)

    def settings_for(self, base: SchedulerSettings, params: dict[str, Any], *,
                     max_model_len: int | None = None) -> SchedulerSettings:
        """``base`` with the scheduler ``params`` applied, validated as vLLM's
        ``SchedulerConfig`` would (deployment parameters are :meth:`deployment_for`'s).

        Raises:
            ConfigError: the combination is one vLLM rejects (the message says why).
        """
        settings = base.replace(**{k: v for k, v in params.items()
                                   if not is_deployment_param(k)})
        settings.validate(max_model_len=max_model_len)
        return settings

    def to_dict(self) -> dict[str, Any]:
        """A JSON/YAML-safe form; :func:`space_from_dict` reads it back."""
        return {"name": self.name, "params": {p.name: p.to_dict() for p in self.params}}


def is_deployment_param(name: str) -> bool:
    """``gpu_split`` and ``router.*``: parameters of the deployment, not the scheduler."""
    return (name in (GPU_SPLIT, SPEC_TOKENS, KV_TIER_SIZE, KV_TIER_POLICY)
            or name.startswith((ROUTER_PREFIX, PD_PREFIX)))


def deployment_value(deployment: Any, name: str) -> Scalar | None:
    """``deployment``'s coordinate ``name`` (None: the deployment has no router)."""
    if name == GPU_SPLIT:
        return deployment.split.label
    if name == SPEC_TOKENS:
        return deployment.num_speculative_tokens
    if name == KV_TIER_SIZE:
        return deployment.kv_offloading_size
    if name == KV_TIER_POLICY:
        return deployment.kv_offloading_eviction_policy
    if name.startswith(PD_PREFIX):  # tuner.tune.pd_space
        pd = getattr(deployment, "pd", None)
        if name == PD_MODE:
            return AGGREGATED if pd is None else DISAGGREGATED
        if pd is None:
            return None
        if name in (PD_PREFILL_BATCHED_TOKENS, PD_PREFILL_SEQS, PD_TRANSFER_MODE):
            return getattr(pd, name[len(PD_PREFIX):])
        return pd_layout_label(pd) if name == PD_LAYOUT else deployment.pd_router
    if deployment.router is None:
        return None
    key = "policy" if name == ROUTER_POLICY else name[len(ROUTER_PREFIX):]
    return deployment.router.to_dict().get(key)


def _powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 2
    return tuple(out)


#: 0 (off) plus powers of two up to 256: PR #54625's window is "the smallest that spans the
#: usual queue depth", so doubling steps cover depths evenly on a log scale.
ADMISSION_WINDOW_CHOICES: tuple[int, ...] = (0,) + _powers_of_two(1, 256)


def admission_space() -> SearchSpace:
    """PR #54625's two knobs (the default space)."""
    return SearchSpace("admission", (
        Param("cache_aware_admission_window", "categorical", choices=ADMISSION_WINDOW_CHOICES),
        Param("cache_aware_admission_threshold", "float", low=0.0, high=1.0, step=0.05),
    ))


def scheduler_space() -> SearchSpace:
    """The admission knobs plus the batch caps, prefill cadence and admission guards."""
    return SearchSpace("scheduler", admission_space().params + (
        Param("prefill_schedule_interval", "int", low=1, high=32, log=True),
        Param("max_num_batched_tokens", "int", low=512, high=65536, log=True),
        Param("max_num_seqs", "categorical", choices=_powers_of_two(16, 2048)),
        Param("long_prefill_token_threshold", "categorical",
              choices=(0,) + _powers_of_two(512, 16384)),
        Param("watermark", "float", low=0.0, high=0.2, step=0.01),
        Param("scheduler_reserve_full_isl", "categorical", choices=(True, False)),
    ))


BUILTIN_SPACES = {"admission": admission_space, "scheduler": scheduler_space}


def load_space(spec: "str | pathlib.Path | SearchSpace") -> SearchSpace:
    """``"admission"``, ``"scheduler"``, a path to a YAML space, or a ``SearchSpace``.

    Raises:
        ConfigError: unknown name, unreadable file, or a bad key (named with the file).
    """
    if isinstance(spec, SearchSpace):
        return spec
    text = str(spec)
    if text in BUILTIN_SPACES:
        return BUILTIN_SPACES[text]()
    path = pathlib.Path(text)
    if path.suffix not in (".yaml", ".yml") and not path.exists():
        raise ConfigError(f"unknown search space {text!r}; use one of "
                          f"{', '.join(BUILTIN_SPACES)} or a path to a .yaml file")
    data = load_yaml(path, "search space").data
    return space_from_dict(data, source=str(path), default_name=path.stem)


def space_from_dict(data: Any, *, source: str = "<space>",
                    default_name: str = "custom") -> SearchSpace:
    """Build a space from its dict form (YAML file or :meth:`SearchSpace.to_dict`).

    The form is ``{name: str (optional), params: {field: {type: int|float|categorical,
    low, high, log, step, choices}}}``.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a search space is a mapping with a 'params' key")
    unknown = set(data) - {"name", "params", "description"}
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key(s) {sorted(unknown)}; "
                          "allowed: name, description, params")
    params = data.get("params")
    if not isinstance(params, dict) or not params:
        raise ConfigError(f"{source}: 'params' must be a non-empty mapping of "
                          "SchedulerSettings field -> distribution")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{source}: 'name' must be a non-empty string")
    return SearchSpace(name, tuple(_param_from_dict(k, v, source) for k, v in params.items()))


def _param_from_dict(name: Any, spec: Any, source: str) -> Param:
    where = f"{source}: params.{name}"
    ftype = _param_type(name, where)
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: must be a mapping with a 'type' key")
    unknown = set(spec) - {"type", "low", "high", "log", "step", "choices", "when"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: "
                          "type, low, high, log, step, choices, when")
    when = _when_from_dict(spec.get("when"), f"{where}.when")
    spec = {k: v for k, v in spec.items() if k != "when"}
    return dataclasses.replace(_param_body(name, spec, ftype, where), when=when)


def _param_type(name: Any, where: str) -> type:
    """The value type of a parameter name: a SchedulerSettings field's, or a deployment
    parameter's (``gpu_split`` and ``router.policy`` are strings, other ``router.*``
    numbers, checked against the router's settings when a point is built)."""
    if name in _FIELD_TYPES:
        return _FIELD_TYPES[name]
    if name in (GPU_SPLIT, ROUTER_POLICY, KV_TIER_POLICY):
        return str
    if isinstance(name, str) and name.startswith(PD_PREFIX):
        if name not in PD_PARAMS:
            raise ConfigError(f"{where}: not a P/D parameter; known: {', '.join(PD_PARAMS)}")
        return str
    if name == SPEC_TOKENS:
        return int
    if name == KV_TIER_SIZE:
        return float
    if isinstance(name, str) and name.startswith(ROUTER_PREFIX) and len(name) > len(ROUTER_PREFIX):
        from tuner.sim.fleet import ROUTER_PARAMS

        known = {p.name: p for p in ROUTER_PARAMS}
        rp = known.get(name[len(ROUTER_PREFIX):])
        if rp is None:
            raise ConfigError(f"{where}: not a router parameter; known: "
                              f"{', '.join(ROUTER_PREFIX + k for k in known)}")
        return str if rp.choices else int if rp.integer else float
    raise ConfigError(f"{where}: not a SchedulerSettings field, {GPU_SPLIT} or "
                      f"{ROUTER_PREFIX}<param>; known fields: {', '.join(_FIELD_TYPES)}")


def _when_from_dict(raw: Any, where: str) -> tuple[tuple[str, tuple[Scalar, ...]], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw or not all(
            isinstance(v, list) and v for v in raw.values()):
        raise ConfigError(f"{where}: must map a parameter name to a non-empty list of values")
    return tuple((str(k), tuple(v)) for k, v in raw.items())


def _param_body(name: str, spec: dict[str, Any], ftype: type, where: str) -> Param:
    kind = spec.get("type")
    if kind == "categorical":
        choices = spec.get("choices")
        if set(spec) - {"type", "choices"}:
            raise ConfigError(f"{where}: a categorical takes only 'choices'")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}.choices: must be a non-empty list")
        if len(set(map(repr, choices))) != len(choices):
            raise ConfigError(f"{where}.choices: duplicate values {choices}")
        coerced = tuple(_coerce(c, ftype, f"{where}.choices") for c in choices)
        for value in coerced:
            _check_value(name, value, f"{where}.choices")
        return Param(name, "categorical", choices=coerced)
    if kind not in ("int", "float"):
        raise ConfigError(f"{where}.type: must be int, float or categorical (got {kind!r})")
    if ftype in (bool, str):
        raise ConfigError(f"{where}.type: {name} is a {ftype.__name__}; use categorical")
    if kind == "int" and ftype is float and is_deployment_param(name):
        ftype = int  # a router parameter takes the kind its space gives it
    if kind == "float" and ftype is int:
        raise ConfigError(f"{where}.type: {name} is an integer field; use int or categorical")
    if "low" not in spec or "high" not in spec:
        raise ConfigError(f"{where}: {kind} needs 'low' and 'high'")
    low = _coerce(spec["low"], int if kind == "int" else float, f"{where}.low")
    high = _coerce(spec["high"], int if kind == "int" else float, f"{where}.high")
    if not low < high:
        raise ConfigError(f"{where}: low ({low}) must be < high ({high})")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}.log: must be true or false")
    step = spec.get("step")
    if step is not None:
        step = _coerce(step, int if kind == "int" else float, f"{where}.step")
        if step <= 0:
            raise ConfigError(f"{where}.step: must be > 0")
        if log:
            raise ConfigError(f"{where}: 'log' and 'step' cannot be combined (as in Optuna)")
    if log and low <= 0:
        raise ConfigError(f"{where}.low: a log scale needs low > 0 (got {low})")
    for key, value in (("low", low), ("high", high)):
        _check_value(name, value, f"{where}.{key}")
    return Param(name, kind, low=low, high=high, log=log, step=step)


def _coerce(value: Any, ftype: type, where: str) -> Scalar:
    if ftype is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {value!r} is not true/false")
        return value
    if ftype is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {value!r} is not a string")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: {value!r} is not a number")
    if ftype is int:
        if not float(value).is_integer():
            raise ConfigError(f"{where}: {value!r} is not an integer")
        return int(value)
    return float(value)


def _check_value(name: str, value: Scalar, where: str) -> None:
    """Range-check one value alone (vLLM's per-field limits; a split label must parse, a
    router policy must be a known one)."""
    from tuner.sim.fleet import ROUTER_POLICIES

    try:
        if name == GPU_SPLIT:
            if not SPLIT_LABEL.match(str(value)):
                raise ConfigError(f"gpu_split {value!r}: expected tp=T,dp=D,replicas=R[,ep]")
        elif name == SPEC_TOKENS:
            if value < 0:  # type: ignore[operator]
                raise ConfigError(f"{value!r}: drafts per step must be >= 0 (0 = off)")
        elif name == KV_TIER_SIZE:
            if value < 0:  # type: ignore[operator]
                raise ConfigError(f"{value!r}: GiB of host memory must be >= 0 (0 = no tier)")
        elif name == KV_TIER_POLICY:
            if value not in ("lru", "arc"):
                raise ConfigError(f"{value!r}: vLLM 0.33.0's policies are lru and arc")
        elif name == ROUTER_POLICY:
            if value not in ROUTER_POLICIES:
                raise ConfigError(f"{value!r} is not one of {', '.join(ROUTER_POLICIES)}")
        elif not is_deployment_param(name):
            _PERMISSIVE_BASE.replace(**{name: value})
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
