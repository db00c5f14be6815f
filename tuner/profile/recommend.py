"""Tune -> profile -> save -> serve command: the flow ``tuner tune`` runs, as a library call.

Why here: a notebook or a service should get the same recommendation, the same profile
file and the same printed evidence as the CLI without going through Click. ``tuner.profile``
sits after ``tuner.tune`` in the layering, so this module may use both.

    run = tune_to_profile("profiles/agentic.yaml",
                          TuneInputs("traces/agentic_1h.parquet",
                                     target=Target(hardware="mi355x", tp=8)),
                          SearchOptions(n_trials=200))
    print("\\n".join(summary_lines(run)))
    print(run.command)
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from dataclasses import dataclass
from typing import Sequence

from tuner.errors import ConfigError
from tuner.perf.deployment import Deployment
from tuner.profile.build import profile_of, warm_start_of
from tuner.profile.export import export_profile
from tuner.profile.model import Profile, ProfileTarget, load_profile, save_profile
from tuner.sim.settings import SchedulerSettings
from tuner.perf.target import Target
from tuner.tune.baseline import (ServeFlags, check_target_agrees, parse_assignments,
                                 parse_serve_flags)
from tuner.tune.options import DeploymentSearch, SearchOptions, StudyOutput, TuneInputs, WarmStart
from tuner.tune.result import TuneResult
from tuner.tune.select import fmt_metric, metric_name, trade_off


@dataclass(slots=True)
class TunedProfile:
    """What one tuning run produced."""

    result: TuneResult
    profile: Profile
    path: pathlib.Path
    command: str  # export_profile(profile, "flags"): the paste-ready vllm serve command
    notes: list[str]  # about the baseline (ignored flags, ...)


def resolve_baseline(spec: str | None, target: Target) -> tuple[
        SchedulerSettings | None, ServeFlags | None, list[str]]:
    """``--baseline``: a profile file (its scheduler section) or ``vllm serve`` flags."""
    if spec is None:
        return None, None, []
    path = pathlib.Path(spec)
    if spec.endswith((".yaml", ".yml")) and path.is_file():
        return load_profile(path).scheduler, None, []
    if path.suffix in (".yaml", ".yml"):
        raise ConfigError(f"--baseline {spec}: no such profile file")
    flags = parse_serve_flags(spec)
    notes = check_target_agrees(flags, target)
    if flags.ignored:
        notes.append("--baseline: ignored (no bearing on the replay): " + ", ".join(flags.ignored))
    return None, flags, notes


def tuned_profile(name: str, inputs: TuneInputs, search: SearchOptions = SearchOptions(),
                  deployment: DeploymentSearch = DeploymentSearch(),
                  study: StudyOutput = StudyOutput(), *,
                  description: str = "") -> tuple[TuneResult, Profile]:
    """Run :func:`tuner.tune.tune` and build the profile ``name`` of its recommended point
    (not written: ``tuner retune`` decides first whether to publish it)."""
    from tuner.tune import tune

    result = tune(inputs, search, deployment, study)
    return result, profile_of(result, name, description=description)


def warm_start_from(source: "str | os.PathLike[str] | Profile | None") -> WarmStart | None:
    """``--warm-start``: a profile (or its path) as the points a study replays first."""
    if source is None:
        return None
    return warm_start_of(source if isinstance(source, Profile) else load_profile(source))


def tune_to_profile(output: str | os.PathLike[str], inputs: TuneInputs,
                    search: SearchOptions = SearchOptions(),
                    deployment: DeploymentSearch = DeploymentSearch(),
                    study: StudyOutput = StudyOutput(), *, vllm_version: str = "0.33.0",
                    baseline: str | None = None, fixed: Sequence[str] = (),
                    warm_start: "str | os.PathLike[str] | Profile | None" = None) -> TunedProfile:
    """Tune, write the profile to ``output`` and render the ``vllm serve`` command.

    The operator's spellings are read here: ``baseline`` is a profile path or ``vllm
    serve`` flags (what the operator runs; it replaces ``inputs.baseline``), ``fixed`` is
    ``["field=value", ...]`` held fixed (``--set``), ``warm_start`` a profile or its
    path. ``output`` also names the study and places its journal (``study.output``).
    """
    from tuner.outputs import check_output

    trace = inputs.trace
    check_output(output, inputs=[trace])  # before minutes of tuning, not after
    target = inputs.target
    base_settings, flags, notes = resolve_baseline(baseline, target)
    target = _mode_of_baseline(flags, target)
    fixed_values = parse_assignments(fixed)
    if flags is not None:
        from tuner.perf.presets import resolve_target

        base_settings = resolve_target(target).default_settings.replace(**flags.scheduler)
    inputs = dataclasses.replace(inputs, target=target, fixed=fixed_values or None,
                                 baseline=base_settings if baseline is not None
                                 else inputs.baseline)
    if warm_start is not None:
        search = dataclasses.replace(search, warm_start=warm_start_from(warm_start))
    name = pathlib.Path(output).stem
    result, profile = tuned_profile(name, inputs, search, deployment,
                                    dataclasses.replace(study, output=output),
                                    description=f"tuned by `tuner tune` on {trace}")
    result.notes[:0] = notes
    profile = _with_target(profile, target, result)
    path = save_profile(profile, output, inputs=[trace])
    return TunedProfile(result, profile, path,
                        export_profile(profile, "flags", vllm_version=vllm_version), notes)


def _mode_of_baseline(flags: ServeFlags | None, target: Target) -> Target:
    """The baseline's ``--async-scheduling``/``--no-async-scheduling`` decides the mode
    the study replays (and so the profile deploys) unless the target names one; the two
    must agree, else the predictions would come from another engine than the baseline's.

    Raises:
        ConfigError: the baseline and the target name different modes.
    """
    if flags is None or "async_scheduling" not in flags.target:
        return target
    mode = bool(flags.target["async_scheduling"])
    if target.async_scheduling is None:
        return dataclasses.replace(target, async_scheduling=mode)
    if target.async_scheduling != mode:
        raise ConfigError(f"--baseline {'--' if mode else '--no-'}async-scheduling disagrees "
                          f"with {'--' if target.async_scheduling else '--no-'}async-scheduling: "
                          "the baseline and the tuned profile must run the same engine")
    return target


def _with_target(profile: Profile, target: Target, result: TuneResult) -> Profile:
    """Record every deployment setting the prediction depended on."""
    t: ProfileTarget = profile.target
    return dataclasses.replace(profile, target=dataclasses.replace(
        t, max_model_len=result.max_model_len or target.max_model_len,
        gpu_memory_utilization=target.gpu_memory_utilization,
        num_gpu_blocks=target.num_gpu_blocks))


def likely_lines(result: Any, point: Any, keys: list[str]) -> list[str]:
    """``  likely: TTFT p90 1.9 s, likely 1.4 s-2.8 s; ...`` for the pick (train window)."""
    ranges = result.likely(point, keys)
    if not ranges:
        return []
    parts = [f"{metric_name(k)} {fmt_metric(k, point.metrics.get(k))}, likely "
             f"{fmt_metric(k, lo)}-{fmt_metric(k, hi)}" for k, (lo, hi) in ranges.items()]
    return ["  error bands (training window): " + "; ".join(parts)]


def summary_lines(run: TunedProfile) -> list[str]:
    """What ``tuner tune`` prints after the front table, overload first, with units."""
    result = run.result
    lines: list[str] = []
    if result.overload is not None:
        lines.append(result.overload.message())
    lines += [n for n in result.notes if n.startswith("WARNING")]
    keys = list(dict.fromkeys([o.key for o in result.objectives] + ["ttft_p50_s", "ttft_p90_s"]
                              + [c.key for c in result.constraints]))
    for window in ("train", "holdout"):
        if window == "holdout" and not result.windows.has_holdout:
            continue
        cmp = result.comparison(window)
        parts = []
        for k in keys:
            if k not in cmp["tuned"]:
                continue
            d = cmp["delta_pct"].get(k)
            parts.append(f"{metric_name(k)} {fmt_metric(k, cmp['baseline'].get(k))} -> "
                         f"{fmt_metric(k, cmp['tuned'].get(k))}"
                         + ("" if d is None else f" ({d:+.1f} %)"))
        label = "training window" if window == "train" else "held-out window"
        lines.append(f"{label}: " + "; ".join(parts))
    lines.append(f"async_scheduling: {str(run.profile.target.async_scheduling).lower()} "
                 "(the engine every trial replayed and the profile deploys)")
    sel = result.selection
    lines.append(f"recommended: {sel.point.label} -- {sel.reason}")
    lines += likely_lines(result, sel.point, keys)
    if result.robust is not None:
        lines += result.robust.lines(result.objectives)
    if result.space.has_deployment:
        before, after = (Deployment.from_dict(result.deployment_of(p)).describe()
                         for p in (result.baseline, sel.point))
        lines.append(f"deployment: {before} -> {after}" if before != after
                     else f"deployment: {after} (the baseline's)")
    if result.spec_gain is not None:
        lines.append(result.spec_gain.line())
    if result.kv_tier_gain is not None:
        lines.append(result.kv_tier_gain.line())
    if result.pd_verdict is not None:  # tuner.tune.pd_space: does disaggregation win?
        lines.extend(result.pd_verdict.lines())
    lines.append(f"rule: {sel.rule}")
    for skipped in sel.skipped:
        lines.append(f"  not picked: {skipped}")
    if sel.runner_ups:
        lines.append("runner-ups (against the pick):")
        lines += [f"  {trade_off(p, sel.point, result.objectives)}" for p in sel.runner_ups]
    if sel.excluded:
        lines.append(f"not eligible (against {sel.point.label}):")
        lines += [f"  {trade_off(p, sel.point, result.objectives)} -- {why}"
                  for p, why in sel.excluded]
    confirm = result.confirms()
    if sel.point.is_baseline:
        lines.append("the baseline is recommended: keep the current settings")
        confirm = {"train": None, "holdout": None, "failed": {}}
    for window, label in (("train", "beats the baseline on the training window"),
                          ("holdout", "held-out confirms")):
        verdict = confirm[window]
        if verdict is None:
            continue
        failed = confirm["failed"].get(window) or []
        lines.append(f"{label}: {'yes' if verdict else 'no'}"
                     + ("" if verdict or not failed else " -- " + "; ".join(failed)))
    lines += [f"note: {n}" for n in result.notes if not n.startswith("WARNING")]
    lines.append(f"profile written to {run.path} (study {result.study_name!r} in "
                 f"{result.storage})")
    return lines
