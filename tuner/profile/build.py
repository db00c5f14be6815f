"""Profiles from a tuning study, and a profile as the start of the next one.

Why here: a profile is the study's *output* -- ``tuner.profile`` sits after ``tuner.tune``
in the layering -- so the study returns a ``TuneResult`` and this module turns it into a
:class:`Profile` (:func:`profile_of`); the reverse direction, a profile's settings and
Pareto set enqueued as a warm start, also reads the profile here and hands the study only
settings (:func:`warm_start_of`). ``tuner.tune`` never imports a profile.

What a profile records from the result is listed in ``docs/profiles.md``; the same result
always gives the same profile (``tests/profile/test_profile_build.py`` pins four).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from tuner import VLLM_TWIN_VERSION, __version__
from tuner.perf.deployment import Deployment
from tuner.profile.model import KV_OFFLOADING_FIELDS, Profile, ProfileTarget
from tuner.sim.settings import SchedulerSettings
from tuner.tune.deployment_space import DEPLOYMENT_KEY, scheduler_part
from tuner.tune.evaluate import ENGINES_KEY, target_from_dict
from tuner.tune.options import StartPoint, WarmStart
from tuner.tune.result import TuneResult
from tuner.tune.kv_tier_space import profile_kv_tier, with_profile_tier
from tuner.profile.pd_profile import pd_gpus
from tuner.tune.spec_space import profile_speculative
from tuner.tune.select import Point, trade_off


def profile_of(result: TuneResult, name: str, *, description: str = "") -> Profile:
    """The recommended point of ``result`` as a :class:`Profile`: its settings and
    deployment, the predictions on both windows, the Pareto front and the provenance."""
    point = result.recommended
    deployment = result.deployment_of(point)
    return Profile(
        name=name, description=description,
        scheduler=SchedulerSettings.from_dict(scheduler_part(point.settings)),
        router=deployment["router"], target=_target(result, point, deployment),
        predicted=_predicted(result, point), pareto=_pareto(result),
        provenance=_provenance(result, point))


def _predicted(result: TuneResult, point: Point) -> dict[str, Any]:
    """The ``predicted`` section: objectives, the selection, baseline against the pick on
    each window (with the per-engine summaries of a multi-engine deployment), verdicts."""
    predicted: dict[str, Any] = {
        "objectives": [str(o) for o in result.objectives],
        "constraints": [str(c) for c in result.constraints],
        "selection": {"prefer": result.prefer, "rule": result.selection.rule,
                      "reason": result.selection.reason,
                      "runner_ups": [trade_off(p, point, result.objectives)
                                     for p in result.selection.runner_ups],
                      "skipped": list(result.selection.skipped),
                      "stage1_trial": None if point.number < 0 else point.number,
                      "is_baseline": point.is_baseline},
        "train": {"window_s": [result.windows.t0, result.windows.t_split],
                  **result.comparison("train")},
    }
    if result.windows.has_holdout:
        predicted["holdout"] = {"window_s": [result.windows.t_split, result.windows.t1],
                                **result.comparison("holdout")}
    predicted["confirms"] = result.confirms()
    predicted["bands"] = result.band_record(point)
    if result.overload is not None:
        predicted["overload"] = result.overload.to_dict()
    if result.robust is not None:  # the pick under clock variants (tuner.tune.robust)
        predicted["robust"] = result.robust.to_dict(result.objectives)
    for window in ("train", "holdout"):
        engines = {role: _engines(p, window) for role, p in (("baseline", result.baseline),
                                                              ("tuned", point))}
        if any(engines.values()) and window in predicted:
            predicted[window][ENGINES_KEY] = {k: v for k, v in engines.items() if v}
    return predicted


def _pareto(result: TuneResult) -> tuple[dict[str, Any], ...]:
    """The stage-2 front: each point's settings (and deployment when searched) and its
    objectives on both windows."""
    return tuple({"trial": p.number, "params": p.params,
                  "settings": scheduler_part(p.settings),
                  **({"deployment": p.settings[DEPLOYMENT_KEY]}
                     if DEPLOYMENT_KEY in p.settings else {}),
                  "train": {o.key: p.metrics.get(o.key) for o in result.objectives},
                  "holdout": ({o.key: p.holdout.get(o.key) for o in result.objectives}
                              if p.holdout else None)} for p in result.front)


def _provenance(result: TuneResult, point: Point) -> dict[str, Any]:
    """Where the profile came from: trace, windows, study, search, versions, seed, time."""
    spec = result.evaluator_spec
    return {
        "trace": {"path": spec.get("trace_path"),
                  "resolved": spec.get("trace_resolved"),
                  "fingerprint": spec.get("trace_fingerprint"),
                  "time_range_s": [result.windows.t0, result.windows.t1]},
        "windows": result.windows.to_dict(),
        "study": {"name": result.study_name, "storage": result.storage,
                  "stage2_study": result.study_name + ".full",
                  "trial": None if point.number < 0 else point.number},
        "search": {"space": result.space.to_dict(), "backend": spec.get("backend"),
                   "trials": {"complete": result.n_complete, "refused": result.n_refused,
                              "pruned": result.n_pruned, "failed": result.n_failed},
                   "survivors": len(result.stage2)},
        "tool_version": __version__,
        "twin_version": VLLM_TWIN_VERSION,
        "seed": result.seed,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _target(result: TuneResult, point: Point, deployment: dict[str, Any]) -> ProfileTarget:
    """The deployment the pick ran on (``TuneResult.deployment_of``'s dict form) on the
    study's hardware and model, in the mode its replays ran."""
    target = result.evaluator_spec.get("target", {})
    replicas = int(deployment["replicas"])
    pd = deployment.get("pd")  # a P/D pick (tuner.tune.pd_space): its pools' GPUs
    return ProfileTarget(hardware=str(target.get("hardware", "?")),
                         model=str(target.get("model", "?")),
                         tp=int(deployment["tp"]), dp=int(deployment["dp"]),
                         replicas=replicas,
                         enable_expert_parallel=bool(deployment["enable_expert_parallel"]),
                         num_gpus=(result.num_gpus if DEPLOYMENT_KEY not in point.settings
                                   else pd_gpus(pd) if pd is not None
                                   else int(deployment["tp"]) * int(deployment["dp"])
                                   * replicas),
                         block_size=result.block_size,
                         api_server_count=target.get("api_server_count"),
                         async_scheduling=_replayed_mode(point.metrics, target),
                         vllm_versions=(VLLM_TWIN_VERSION,),
                         quantization=target.get("quantization"),
                         kv_cache_dtype=target.get("kv_cache_dtype"),
                         step_time_source=target.get("step_time_source"),
                         **{k: v for k, v in profile_kv_tier(target, deployment).items()
                            if k in KV_OFFLOADING_FIELDS},
                         speculative=profile_speculative(result.evaluator_spec, deployment),
                         disaggregation=None if pd is None else dict(pd))


def _replayed_mode(metrics: dict[str, Any], target: dict[str, Any]) -> bool:
    """The scheduling mode the study replayed (each summary records it), so the profile
    deploys the engine its predictions came from; else what the target resolves to."""
    mode = metrics.get("async_scheduling")
    if isinstance(mode, bool):
        return mode
    from tuner.perf.presets import resolve_target

    return resolve_target(target_from_dict(target)).async_scheduling


def _engines(point: Point, window: str) -> list[dict[str, Any]]:
    """The point's per-engine summaries on ``window`` (empty for one engine)."""
    metrics = point.metrics if window == "train" else (point.holdout or {})
    return list(metrics.get(ENGINES_KEY) or [])


def warm_start_of(profile: Profile) -> WarmStart:
    """``profile``'s settings and its Pareto set as the points a study replays first, each
    with the deployment it ran on (a Pareto point's own where the profile recorded one,
    else the profile's); the study uses the deployments only where its space varies one."""
    own = with_profile_tier(profile.deployment(), profile.target)  # a searched tier's point
    points = [StartPoint("profile", profile.scheduler, own)]
    for settings, point in zip(profile.pareto_settings(), profile.pareto):
        raw = point.get("deployment")
        points.append(StartPoint("pareto", settings,
                                 Deployment.from_dict(raw) if raw else own))
    return WarmStart(profile.name, tuple(points))


__all__ = ["profile_of", "warm_start_of"]
