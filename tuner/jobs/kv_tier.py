"""The CPU KV tier in a retune job: its config keys, the target each side replays, and
what the changelog records.

Two kinds of key (docs/retune.md, docs/kv-offloading.md):

* the deployment's own tier, in ``target:`` (``kv_offloading_size`` GiB,
  ``kv_offloading_backend``, ``kv_offloading_eviction_policy``,
  ``kv_offloading_blocks_per_chunk``: the ``Target`` fields ``tuner replay
  --kv-offloading-*`` sets). A changed value is a changed target, so it starts a new
  history like any other target change;
* the tier searched (``kv_offloading_sizes``, ``kv_offloading_policies``,
  ``host_memory_gb``: what ``tuner tune --kv-offloading-sizes --kv-offloading-policies
  --host-memory-gb`` takes). The picked size is a coordinate of the candidate's
  deployment, recorded in its profile's ``target``.

Why every key is checked at load, with the file and line: a job that passes ``tuner
schedule`` and then fails every run on a size above the host budget (or a policy without
a tier) would be scheduled to fail for good. The checks are those of the CLI
(``tuner.tune.kv_tier_space``, ``tuner.perf.presets``), worded for the config.

Why the evaluation replays each profile on its own tier: the current profile and the
candidate may deploy different tiers (a searched size), and comparing both on the
config's tier would credit the candidate's scheduler settings with, or blame them for,
a tier it does not deploy.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tuner.errors import ConfigError, TunerError

#: ``cfg`` below is a ``tuner.jobs.config.RetuneConfig`` (not imported: config imports
#: this module, and the layering test refuses the circle even for annotations)
_Config = Any

#: The ``Target`` fields of the tier (the profile's ``target`` records the same names).
TARGET_TIER_KEYS = ("kv_offloading_size", "kv_offloading_backend",
                    "kv_offloading_eviction_policy", "kv_offloading_blocks_per_chunk")
_CHOICES = {"kv_offloading_backend": ("native", "lmcache"),
            "kv_offloading_eviction_policy": ("lru", "arc")}


def check_kv_tier(cfg: _Config, raw: dict[str, Any], loaded: Any) -> None:
    """Validate and normalise the tier keys of ``raw`` into ``cfg`` (see the module
    docstring).

    Raises:
        ConfigError: ``FILE:LINE: key: reason`` for a bad value or a combination the
            twin cannot replay (a tier with dp > 1 or with speculative decoding, a size
            above the host budget, a policy without a tier).
    """
    _check_target_tier(cfg.target, loaded)
    if raw.get("kv_offloading_sizes") is not None:
        cfg.kv_offloading_sizes = _sizes(raw["kv_offloading_sizes"],
                                         loaded.where("kv_offloading_sizes"))
    if raw.get("kv_offloading_policies") is not None:
        cfg.kv_offloading_policies = _policies(raw["kv_offloading_policies"],
                                               loaded.where("kv_offloading_policies"))
    if raw.get("host_memory_gb") is not None:
        where = loaded.where("host_memory_gb")
        value = raw["host_memory_gb"]
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or not value > 0):
            raise ConfigError(f"{where}: host memory per node in GiB, a number > 0, got "
                              f"{value!r}")
        if cfg.kv_offloading_sizes is None:
            raise ConfigError(f"{where}: bounds the searched tier sizes; add "
                              "kv_offloading_sizes or drop host_memory_gb")
        cfg.host_memory_gb = float(value)
    has_tier = cfg.target.get("kv_offloading_size") is not None
    searched = cfg.kv_offloading_sizes is not None
    if has_tier or searched:
        _check_one_engine(cfg, loaded, "kv_offloading_sizes" if searched else None)
    elif cfg.kv_offloading_policies is not None:
        raise ConfigError(f"{loaded.where('kv_offloading_policies')}: needs a tier: "
                          "target.kv_offloading_size or kv_offloading_sizes")
    else:
        extra = [k for k in TARGET_TIER_KEYS[1:] if k in cfg.target]
        if extra:
            raise ConfigError(f"{loaded.where('target', extra[0])}: needs a tier: "
                              "target.kv_offloading_size or kv_offloading_sizes")
    if searched:
        _check_budget(cfg, loaded)


def _check_target_tier(target: dict[str, Any], loaded: Any) -> None:
    """The ``target:`` tier keys, as ``ProfileTarget`` checks them (sizes become floats)."""
    if "kv_offloading_size" in target:
        size = target["kv_offloading_size"]
        if size is not None and (isinstance(size, bool) or not isinstance(size, (int, float))
                                 or not math.isfinite(size) or not size > 0):
            raise ConfigError(f"{loaded.where('target', 'kv_offloading_size')}: GiB of host "
                              f"memory for the CPU KV tier, a number > 0 (omit it for no "
                              f"tier), got {size!r}")
        if size is None:
            del target["kv_offloading_size"]
        else:
            target["kv_offloading_size"] = float(size)
    for key, words in _CHOICES.items():
        if key in target and target[key] not in words:
            raise ConfigError(f"{loaded.where('target', key)}: must be {' or '.join(words)}, "
                              f"got {target[key]!r}")
    if "kv_offloading_blocks_per_chunk" in target:
        bpc = target["kv_offloading_blocks_per_chunk"]
        if isinstance(bpc, bool) or not isinstance(bpc, int) or bpc < 1:
            raise ConfigError(f"{loaded.where('target', 'kv_offloading_blocks_per_chunk')}: "
                              f"GPU blocks per CPU chunk, an integer >= 1, got {bpc!r}")


def _items(value: Any) -> list[Any]:
    """A YAML list, or the CLI's comma-separated text (``0,512,2048``)."""
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _sizes(value: Any, where: str) -> tuple[float, ...]:
    out: list[float] = []
    for item in _items(value):
        try:
            size = float(item) if not isinstance(item, bool) else math.nan
        except (TypeError, ValueError):
            size = math.nan
        if not math.isfinite(size) or size < 0:
            raise ConfigError(f"{where}: GiB per engine to search, numbers >= 0 (0 = no "
                              f"tier) like [0, 512, 2048], got {value!r}")
        out.append(size)
    if not out or len(set(out)) != len(out):
        raise ConfigError(f"{where}: distinct GiB >= 0 (0 = no tier), got {value!r}")
    if out == [0.0]:
        raise ConfigError(f"{where}: only 'no tier' is no search; drop the key")
    return tuple(out)


def _policies(value: Any, where: str) -> tuple[str, ...]:
    out = [str(v).strip().lower() for v in _items(value)]
    if not out or any(v not in _CHOICES["kv_offloading_eviction_policy"] for v in out) \
            or len(set(out)) != len(out):
        raise ConfigError(f"{where}: distinct values of lru, arc, got {value!r}")
    return tuple(out)


def _check_one_engine(cfg: _Config, loaded: Any, key: str | None) -> None:
    """The twin models the tier for one engine without drafts (as ``tuner replay``)."""
    where = loaded.where(key) if key else loaded.where("target", "kv_offloading_size")
    dp = cfg.target.get("dp", 1)
    if isinstance(dp, int) and not isinstance(dp, bool) and dp > 1:
        raise ConfigError(f"{where}: the CPU KV tier is modelled for one engine; "
                          f"target.dp is {dp}")
    if cfg.speculative is not None:
        raise ConfigError(f"{where}: speculative decoding with a CPU KV tier is not "
                          "modelled; drop one of them")


def _check_budget(cfg: _Config, loaded: Any) -> None:
    """Every searched size within ``host_memory_gb`` (or the preset's reference node)
    over the engines of a node (``tuner.tune.kv_tier_space.host_budget``)."""
    from tuner.tune.kv_tier_space import host_budget

    where = loaded.where("kv_offloading_sizes")
    try:
        target = cfg.make_target()
    except (TunerError, TypeError, ValueError):
        return  # a bad target: check_runnable and the run report it
    if cfg.host_memory_gb is None:
        try:
            budget = host_budget(target, None)
        except ConfigError:
            raise ConfigError(f"{where}: hardware {target.hardware} states no host memory "
                              "per node; add host_memory_gb (GiB per node)") from None
    else:
        budget = host_budget(target, cfg.host_memory_gb)
    sizes = cfg.kv_offloading_sizes or ()
    over = [s for s in sizes if s > budget.per_engine_gib]
    if over:
        source = "host_memory_gb" if cfg.host_memory_gb is not None else budget.source
        raise ConfigError(f"{where}: {max(over):g} GiB is above the host budget of "
                          f"{budget.per_engine_gib:g} GiB per engine ({budget.gib:g} GiB per "
                          f"node [{source}] over {budget.engines} engine(s) of TP{target.tp}); "
                          "lower the size or raise host_memory_gb")


def profile_target(profile: Any, target: Any) -> Any:
    """``target`` with the CPU KV tier ``profile`` deploys (its ``target.kv_offloading_*``;
    no profile: ``target`` as the config gives it)."""
    if profile is None:
        return target
    t = profile.target
    return dataclasses.replace(target, **{k: getattr(t, k) for k in TARGET_TIER_KEYS})


def tier_of(target: Any) -> dict[str, Any]:
    """The tier a replay target deploys, for the changelog (``size`` None: no tier)."""
    return {"size": target.kv_offloading_size, "backend": target.kv_offloading_backend,
            "eviction_policy": target.kv_offloading_eviction_policy,
            "blocks_per_chunk": target.kv_offloading_blocks_per_chunk}


def tune_record(cfg: _Config, result: Any) -> dict[str, Any] | None:
    """The changelog's ``tune.kv_tier``: what was searched and what the tier bought the
    pick on the held-out window (``KvTierGain``); None when no tier was searched."""
    if cfg.kv_offloading_sizes is None and cfg.kv_offloading_policies is None:
        return None
    gain = getattr(result, "kv_tier_gain", None)
    return {"sizes": None if cfg.kv_offloading_sizes is None else list(cfg.kv_offloading_sizes),
            "policies": (None if cfg.kv_offloading_policies is None
                         else list(cfg.kv_offloading_policies)),
            "host_memory_gb": cfg.host_memory_gb,
            "gain": None if gain is None else gain.to_dict(),
            "gain_line": None if gain is None else gain.line()}


__all__ = ["TARGET_TIER_KEYS", "check_kv_tier", "profile_target", "tier_of", "tune_record"]
