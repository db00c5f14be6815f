"""The profile: a tuned scheduler configuration with the evidence behind it.

A profile is a YAML file (``profiles/NAME.yaml``, format in ``docs/profiles.md``) with six
sections:

* ``scheduler`` -- the recommended settings under vLLM ``SchedulerConfig`` field names;
* ``target`` -- what it was tuned for (hardware, GPU count, model, TP/DP, block size,
  quantization and KV-cache dtype as vLLM names them,
  async scheduling) and the vLLM versions whose flags and semantics it uses;
* ``predicted`` -- the twin's metrics for the baseline (vLLM defaults) and the tuned
  settings, with deltas, on the training and the held-out window;
* ``pareto`` -- the Pareto set of the study (each point's settings and metrics), which a
  later ``--warm-start`` enqueues;
* ``router`` -- for a fleet (``target.replicas > 1``, or a prefix-aware router over the
  DP ranks of one deployment) only: the router in front of the replicas, ``{policy: round-robin|least-loaded|session|prefix-aware, <params>}`` as
  the replay modelled it (``tuner.sim.fleet.RouterSettings``);
* ``provenance`` -- trace fingerprint and time range, study name and redacted storage,
  trial number, tuner and twin versions, seed, creation time (UTC);
* ``name`` / ``description``.

:func:`load_profile` validates everything it reads and raises ``ProfileError`` naming the
file and the field; :func:`save_profile` writes atomically (temp file + rename), so a
crash never leaves half a profile.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from dataclasses import dataclass, field
from collections.abc import Iterable
from typing import Any

import yaml

from tuner.errors import ConfigError, ProfileError
from tuner.loaders import load_yaml
from tuner.perf.deployment import Deployment, Split, check_router, router_settings, routes
from tuner.perf.dtypes import normalize_kv_cache_dtype, normalize_quantization
from tuner.outputs import write_text
from tuner.sim.settings import SchedulerSettings

#: Bumped when the file layout changes incompatibly; load_profile refuses newer files.
PROFILE_VERSION = 1

_TOP_KEYS = ("profile_version", "name", "description", "scheduler", "target", "router",
             "predicted", "pareto", "provenance")


#: The CPU KV tier's fields of a profile target (written only with a tier).
KV_OFFLOADING_FIELDS = ("kv_offloading_size", "kv_offloading_backend",
                        "kv_offloading_eviction_policy", "kv_offloading_blocks_per_chunk")


def _kv_offloading(raw: dict[str, Any], fail: Any) -> dict[str, Any]:
    """The tier's fields of a profile target, checked (one error naming the field)."""
    out: dict[str, Any] = {}
    size = raw.get("kv_offloading_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, (int, float))
                             or not size > 0):
        raise fail("target.kv_offloading_size", f"must be a number of GiB > 0 or null "
                                                f"(got {size!r})")
    out["kv_offloading_size"] = None if size is None else float(size)
    for key, choices in (("kv_offloading_backend", ("native", "lmcache")),
                         ("kv_offloading_eviction_policy", ("lru", "arc"))):
        value = raw.get(key, choices[0])
        if value not in choices:
            raise fail(f"target.{key}", f"must be {' or '.join(choices)} (got {value!r})")
        out[key] = value
    bpc = raw.get("kv_offloading_blocks_per_chunk", 1)
    if isinstance(bpc, bool) or not isinstance(bpc, int) or bpc < 1:
        raise fail("target.kv_offloading_blocks_per_chunk", f"must be an integer >= 1 "
                                                            f"(got {bpc!r})")
    out["kv_offloading_blocks_per_chunk"] = bpc
    return out


@dataclass(frozen=True, slots=True)
class ProfileTarget:
    """The deployment a profile was tuned for."""

    hardware: str  # hardware preset name (e.g. mi355x) or a hardware YAML path
    model: str  # model preset name or HF config path
    tp: int = 1  # tensor-parallel size (GPUs per engine)
    dp: int = 1  # vLLM data-parallel ranks per deployment (--data-parallel-size)
    num_gpus: int = 1  # tp * dp * replicas
    block_size: int | None = None  # KV block size the twin used (tokens)
    async_scheduling: bool = True  # vLLM's default (resolved True); picks the plugin class
    # What else the prediction depended on (exported as serve flags; None = not recorded).
    max_model_len: int | None = None  # the longest sequence the twin admitted
    gpu_memory_utilization: float | None = None
    num_gpu_blocks: int | None = None  # a KV-capacity override (--num-gpu-blocks-override)
    #: vLLM releases whose flags and scheduler semantics the profile was produced for.
    vllm_versions: tuple[str, ...] = ("0.33.0",)
    quantization: str | None = None  # vLLM --quantization the twin priced (None: checkpoint's)
    kv_cache_dtype: str | None = None  # vLLM --kv-cache-dtype (None: auto)
    #: what priced the twin's steps: "analytic" or "aic" (measured tables); None: not recorded
    step_time_source: str | None = None
    replicas: int = 1  # copies of the deployment behind the profile's router
    enable_expert_parallel: bool = False  # vLLM --enable-expert-parallel (MoE models)
    #: speculative decoding the prediction assumed (``SpecDecoding.to_dict()``: vLLM's
    #: ``--speculative-config`` object, the acceptance rates, the draw's seed); None: off
    speculative: dict[str, Any] | None = None
    #: vLLM --kv-offloading-size (GiB, the CPU KV tier) the twin replayed; None: no tier
    kv_offloading_size: float | None = None
    kv_offloading_backend: str = "native"  # vLLM --kv-offloading-backend
    kv_offloading_eviction_policy: str = "lru"  # kv_connector_extra_config eviction_policy
    kv_offloading_blocks_per_chunk: int = 1  # kv_connector_extra_config blocks_per_chunk
    #: disaggregated prefill/decode pools the pick ran on (``Deployment.to_dict()["pd"]``:
    #: num_prefill, num_decode, prefill_tp, decode_tp, prefill_hardware, link, router;
    #: ``tp`` is then a decode instance's); None: aggregated (written as before)
    disaggregation: dict[str, Any] | None = None
    #: vLLM --api-server-count the prediction assumed (tuner/perf/api_server.py; 0: none
    #: priced); None: vLLM's default, the DP size (not written: older files stay identical)
    api_server_count: int | None = None

    @property
    def is_multi_engine(self) -> bool:
        """More than one engine, or experts sharded: the per-engine flags matter."""
        return self.dp > 1 or self.replicas > 1 or self.enable_expert_parallel

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["vllm_versions"] = list(self.vllm_versions)
        for key in ("quantization", "kv_cache_dtype", "step_time_source"):  # older readers know none
            if out[key] is None:
                del out[key]
        # one engine per deployment, no EP: written as before, so older files stay identical
        if out["replicas"] == 1:
            del out["replicas"]
        if not out["enable_expert_parallel"]:
            del out["enable_expert_parallel"]
        if out["speculative"] is None:  # off: written as before
            del out["speculative"]
        if out["api_server_count"] is None:  # vLLM's default: written as before
            del out["api_server_count"]
        if out["kv_offloading_size"] is None:  # no tier: written as before
            for key in KV_OFFLOADING_FIELDS:
                del out[key]
        if out["disaggregation"] is None:  # aggregated: written as before
            del out["disaggregation"]
        return out


@dataclass(frozen=True, slots=True)
class Profile:
    """A loaded, validated profile (see the module docstring for the sections)."""

    name: str
    scheduler: SchedulerSettings
    target: ProfileTarget
    description: str = ""
    predicted: dict[str, Any] = field(default_factory=dict)
    pareto: tuple[dict[str, Any], ...] = ()
    provenance: dict[str, Any] = field(default_factory=dict)
    #: the fleet's router (``{policy, <params>}``); None for one replica
    router: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "profile_version": PROFILE_VERSION,
            "name": self.name,
            "description": self.description,
            "scheduler": self.scheduler.to_dict(),
            "target": self.target.to_dict(),
        }
        if self.router is not None:
            out["router"] = _plain(self.router)
        out.update(predicted=_plain(self.predicted), pareto=[_plain(p) for p in self.pareto],
                   provenance=_plain(self.provenance))
        return out

    def to_yaml(self) -> str:
        header = (f"# tuner profile {self.name!r}: written by tuner; regenerate it with the tool "
                  "rather than editing by hand.\n"
                  "# Export: tuner export THIS_FILE --format flags|yaml|json|python|env|plugin\n")
        return header + yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False,
                                       width=100)

    def deployment(self) -> Deployment:
        """The deployment the profile records: ``target``'s split and the ``router``."""
        t = self.target
        if t.disaggregation is not None:  # tuner.tune.pd_space: a P/D pick
            return Deployment.from_dict({"tp": t.tp, "pd": t.disaggregation})
        return Deployment(Split(t.tp, t.dp, t.replicas, t.enable_expert_parallel),
                          None if self.router is None else router_settings(self.router))

    def pareto_settings(self) -> list[SchedulerSettings]:
        """The stored Pareto set as settings (invalid entries were refused at load)."""
        return [SchedulerSettings.from_dict(p["settings"]) for p in self.pareto]


def _plain(obj: Any) -> Any:
    """YAML-safe plain data: tuples -> lists, NaN/inf -> None, numpy scalars -> Python."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return _plain(obj.item())
    return obj


#: Profiles are read by a vLLM service that often runs as another user.
PROFILE_MODE = 0o644


def save_profile(profile: Profile, path: str | os.PathLike[str], *,
                 inputs: Iterable[str | os.PathLike[str]] = ()) -> pathlib.Path:
    """Write ``profile`` to ``path`` atomically, mode 0644 (:mod:`tuner.outputs` rules)."""
    return write_text(path, profile.to_yaml(), inputs=inputs, mode=PROFILE_MODE)


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read and validate a profile.

    Raises:
        ProfileError: unreadable file, bad YAML, or a missing/invalid field; the message is
            ``PATH: field: what is wrong``.
    """
    p = pathlib.Path(path)
    data = load_yaml(p, "profile", error=ProfileError).data
    return profile_from_dict(data, source=str(p))


def profile_from_dict(data: Any, *, source: str = "<profile>") -> Profile:
    """Validate the dict form of a profile (see :func:`load_profile`)."""
    def fail(fieldname: str, msg: str) -> ProfileError:
        return ProfileError(f"{source}: {fieldname}: {msg}")

    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile is a YAML mapping (got {type(data).__name__})")
    unknown = set(data) - set(_TOP_KEYS)
    if unknown:
        raise fail(sorted(unknown)[0], f"unknown section; allowed: {', '.join(_TOP_KEYS)}")
    version = data.get("profile_version", PROFILE_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise fail("profile_version", f"must be a positive integer (got {version!r})")
    if version > PROFILE_VERSION:
        raise fail("profile_version", f"{version} is newer than this tuner understands "
                                      f"({PROFILE_VERSION}); upgrade tuner")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise fail("name", "missing or not a non-empty string")
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise fail("description", "must be a string")
    scheduler = _settings(data.get("scheduler"), "scheduler", fail)
    target = _target(data.get("target"), fail)
    router = _router(data.get("router"), target, fail)
    predicted = data.get("predicted") or {}
    if not isinstance(predicted, dict):
        raise fail("predicted", "must be a mapping")
    _check_predicted(predicted, fail)
    pareto_raw = data.get("pareto") or []
    if not isinstance(pareto_raw, list):
        raise fail("pareto", "must be a list of points")
    pareto = []
    for i, point in enumerate(pareto_raw):
        if not isinstance(point, dict):
            raise fail(f"pareto[{i}]", "must be a mapping with a 'settings' key")
        _settings(point.get("settings"), f"pareto[{i}].settings", fail)
        if point.get("deployment") is not None:
            try:
                Deployment.from_dict(point["deployment"], where=f"pareto[{i}].deployment")
            except ConfigError as exc:
                raise ProfileError(f"{source}: {exc}") from None
        pareto.append(point)
    provenance = data.get("provenance") or {}
    if not isinstance(provenance, dict):
        raise fail("provenance", "must be a mapping")
    return Profile(name=name, scheduler=scheduler, target=target, description=description,
                   predicted=predicted, pareto=tuple(pareto), provenance=provenance,
                   router=router)


def _settings(raw: Any, where: str, fail: Any) -> SchedulerSettings:
    if not isinstance(raw, dict) or not raw:
        raise fail(where, "missing or not a mapping of SchedulerConfig fields")
    known = {f.name: f for f in dataclasses.fields(SchedulerSettings)}
    defaults = SchedulerSettings()
    for key, value in raw.items():
        if key not in known:
            raise fail(f"{where}.{key}", f"not a scheduler setting; known: {', '.join(known)}")
        expected = type(getattr(defaults, key))
        ok = (isinstance(value, bool) if expected is bool
              else isinstance(value, str) if expected is str
              else isinstance(value, int) and not isinstance(value, bool) if expected is int
              else isinstance(value, (int, float)) and not isinstance(value, bool))
        if not ok:
            raise fail(f"{where}.{key}", f"{value!r} is not a {expected.__name__}")
    try:
        return SchedulerSettings.from_dict(
            {k: float(v) if type(getattr(defaults, k)) is float else v for k, v in raw.items()})
    except ConfigError as exc:
        raise fail(where, str(exc)) from None


def _target(raw: Any, fail: Any) -> ProfileTarget:
    if not isinstance(raw, dict):
        raise fail("target", "missing or not a mapping (hardware, model, tp, ...)")
    known = {f.name for f in dataclasses.fields(ProfileTarget)}
    for key in raw:
        if key not in known:
            raise fail(f"target.{key}", f"unknown field; known: {', '.join(sorted(known))}")
    for key in ("hardware", "model"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise fail(f"target.{key}", "missing or not a non-empty string")
    for key in ("tp", "dp", "replicas", "num_gpus"):
        value = raw.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise fail(f"target.{key}", f"must be an integer >= 1 (got {value!r})")
    if not isinstance(raw.get("enable_expert_parallel", False), bool):
        raise fail("target.enable_expert_parallel", "must be true or false")
    tp, dp, replicas = raw.get("tp", 1), raw.get("dp", 1), raw.get("replicas", 1)
    if (replicas > 1 or raw.get("enable_expert_parallel")) and raw.get("num_gpus", 1) != \
            tp * dp * replicas:
        raise fail("target.num_gpus", f"{raw.get('num_gpus', 1)} is not tp x dp x replicas = "
                                      f"{tp} x {dp} x {replicas} = {tp * dp * replicas}")
    block = raw.get("block_size")
    if block is not None and (not isinstance(block, int) or isinstance(block, bool) or block < 1):
        raise fail("target.block_size", f"must be an integer >= 1 or null (got {block!r})")
    if not isinstance(raw.get("async_scheduling", True), bool):
        raise fail("target.async_scheduling", "must be true or false")
    for key in ("max_model_len", "num_gpu_blocks"):
        value = raw.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise fail(f"target.{key}", f"must be an integer >= 1 or null (got {value!r})")
    util = raw.get("gpu_memory_utilization")
    if util is not None and (isinstance(util, bool) or not isinstance(util, (int, float))
                             or not 0 < util <= 1):
        raise fail("target.gpu_memory_utilization", f"must be in (0, 1] or null (got {util!r})")
    versions = raw.get("vllm_versions", ["0.33.0"])
    if (not isinstance(versions, list) or not versions
            or not all(isinstance(v, str) and _is_version(v) for v in versions)):
        raise fail("target.vllm_versions", f"must be a list of versions like '0.33.0' "
                                           f"(got {versions!r})")
    dtypes: dict[str, str | None] = {}
    for key, check in (("quantization", normalize_quantization),
                       ("kv_cache_dtype", normalize_kv_cache_dtype)):
        value = raw.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise fail(f"target.{key}", f"must be a vLLM {key} name (got {value!r})")
            try:
                value = check(value)
            except ConfigError as exc:
                raise fail(f"target.{key}", str(exc)) from None
        dtypes[key] = value
    servers = raw.get("api_server_count")
    if servers is not None and (not isinstance(servers, int) or isinstance(servers, bool)
                                or servers < 0):
        raise fail("target.api_server_count", f"must be an integer >= 0 or null (got {servers!r})")
    source = raw.get("step_time_source")
    if source is not None and source not in ("analytic", "aic"):
        raise fail("target.step_time_source", f"must be analytic or aic (got {source!r})")
    return ProfileTarget(hardware=raw["hardware"], model=raw["model"], tp=raw.get("tp", 1),
                         dp=raw.get("dp", 1), num_gpus=raw.get("num_gpus", 1),
                         block_size=block, async_scheduling=raw.get("async_scheduling", True),
                         vllm_versions=tuple(versions), max_model_len=raw.get("max_model_len"),
                         gpu_memory_utilization=None if util is None else float(util),
                         num_gpu_blocks=raw.get("num_gpu_blocks"), step_time_source=source,
                         replicas=replicas,
                         enable_expert_parallel=raw.get("enable_expert_parallel", False),
                         speculative=_speculative(raw.get("speculative"), fail),
                         disaggregation=_disaggregation(raw.get("disaggregation"), fail),
                         api_server_count=servers, **dtypes, **_kv_offloading(raw, fail))


def _disaggregation(raw: Any, fail: Any) -> dict[str, Any] | None:
    """The ``target.disaggregation`` section, checked as a study's deployment reads it."""
    if raw is None:
        return None
    try:
        Deployment.from_dict({"pd": raw})
    except ConfigError as exc:
        raise fail("target.disaggregation", str(exc).removeprefix("deployment.pd.")) from None
    return dict(raw)


def _speculative(raw: Any, fail: Any) -> dict[str, Any] | None:
    """The ``target.speculative`` section, checked as the replay reads it."""
    if raw is None:
        return None
    from tuner.sim.spec_decode import SpecDecoding

    if not isinstance(raw, dict) or not isinstance(raw.get("speculative_config"), dict):
        raise fail("target.speculative", "must be a mapping with a speculative_config object")
    try:
        return SpecDecoding.from_dict(raw).to_dict()
    except ConfigError as exc:
        raise fail("target.speculative", str(exc)) from None


def _router(raw: Any, target: ProfileTarget, fail: Any) -> dict[str, Any] | None:
    """The ``router`` section: only for a fleet, a known policy and the router's own
    parameters (checked by the replay's ``RouterSettings``, so a profile names nothing
    the replay did not model)."""
    if raw is None:
        return None
    try:
        router = check_router(raw)
    except ConfigError as exc:
        raise fail("router", str(exc)) from None
    if not routes(target.replicas, target.dp, router["policy"]):
        raise fail("router", "a router needs target.replicas > 1 (or, for prefix-aware, "
                             "target.dp > 1: it picks the DP rank)")
    return router


def _is_version(text: str) -> bool:
    parts = text.split(".")
    return 2 <= len(parts) <= 3 and all(p.isdigit() for p in parts)


def _check_predicted(predicted: dict[str, Any], fail: Any) -> None:
    for window in ("train", "holdout"):
        section = predicted.get(window)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise fail(f"predicted.{window}", "must be a mapping (baseline, tuned, delta_pct)")
        for part in ("baseline", "tuned", "delta_pct"):
            values = section.get(part)
            if values is None:
                continue
            if not isinstance(values, dict):
                raise fail(f"predicted.{window}.{part}", "must be a mapping of metric -> number")
            for key, value in values.items():
                if value is not None and (isinstance(value, bool)
                                          or not isinstance(value, (int, float, str))):
                    raise fail(f"predicted.{window}.{part}.{key}", f"{value!r} is not a number")
