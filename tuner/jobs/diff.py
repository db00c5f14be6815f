"""Two profiles side by side: scheduler settings, then predicted metrics."""

from __future__ import annotations

from typing import Any

from tuner.jobs.history import ProfileHistory


def _predicted(profile: Any) -> dict[str, Any]:
    """Flat ``window.metric -> value`` of the tuned point's predictions."""
    out: dict[str, Any] = {}
    for window in ("train", "holdout"):
        tuned = (profile.predicted.get(window) or {}).get("tuned") or {}
        for key, value in tuned.items():
            out[f"{window}.{key}"] = value
    return out


def diff_profiles(a: Any, b: Any) -> dict[str, list[dict[str, Any]]]:
    """``{"settings": rows, "predicted": rows}``; each row ``{key, a, b, changed}``."""
    def rows(x: dict[str, Any], y: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"key": k, "a": x.get(k), "b": y.get(k), "changed": x.get(k) != y.get(k)}
                for k in dict.fromkeys([*x, *y])]

    return {"settings": rows(a.scheduler.to_dict() | _tier(a, b),
                             b.scheduler.to_dict() | _tier(b, a)),
            "predicted": rows(_predicted(a), _predicted(b))}


def _tier(profile: Any, other: Any) -> dict[str, Any]:
    """``target.kv_offloading_*`` of ``profile`` where either profile deploys a CPU KV
    tier (a retune that searches the tier publishes versions that differ only there);
    nothing otherwise, so the diff of two tierless profiles reads as before."""
    from tuner.jobs.kv_tier import TARGET_TIER_KEYS

    if profile.target.kv_offloading_size is None and other.target.kv_offloading_size is None:
        return {}
    return {f"target.{k}": getattr(profile.target, k) for k in TARGET_TIER_KEYS}


def resolve_profile_ref(ref: str, *, profiles_dir: str, name: str | None) -> str:
    """``NAME@3``, ``NAME@current``, ``3``/``v3`` (with ``name``) or a path -> a file path."""
    if "@" in ref and not ref.startswith(("/", ".")):
        pname, _, spec = ref.partition("@")
        return str(ProfileHistory(profiles_dir, pname).resolve(spec))
    if name is not None:
        return str(ProfileHistory(profiles_dir, name).resolve(ref))
    return str(ProfileHistory(profiles_dir, "_").resolve(ref))
