"""Tune -> profile -> save -> serve command: the flow ``tuner tune`` runs, as a library call.

Why here: a notebook or a service should get the same recommendation, the same profile
file and the same printed evidence as the CLI without going through Click. ``tuner.profile``
sits after ``tuner.tune`` in the layering, so this module may use both.

    run = tune_to_profile("traces/agentic_1h.parquet", "profiles/agentic.yaml",
                          target=Target(hardware="mi355x", tp=8), n_trials=200)
    print("\\n".join(summary_lines(run)))
    print(run.command)
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from dataclasses import dataclass
from typing import Any, Sequence

from tuner.errors import ConfigError
from tuner.profile.export import export_profile
from tuner.profile.model import Profile, ProfileTarget, load_profile, save_profile
from tuner.sim.settings import SchedulerSettings
from tuner.perf.target import Target
from tuner.tune.baseline import (ServeFlags, check_target_agrees, parse_assignments,
                                 parse_serve_flags)
from tuner.tune.deployment import Deployment
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


def tune_to_profile(trace: str, output: str | os.PathLike[str], *, target: Target,
                    vllm_version: str = "0.33.0", baseline: str | None = None,
                    fixed: Sequence[str] = (), **tune_kw: Any) -> TunedProfile:
    """Run :func:`tuner.tune.tune`, write the profile to ``output`` and render the command.

    ``baseline``: a profile path or ``vllm serve`` flags (what the operator runs);
    ``fixed``: ``["field=value", ...]`` held fixed (``--set``). Other keywords go to
    :func:`tuner.tune.tune`.
    """
    from tuner.outputs import check_output
    from tuner.tune import tune

    check_output(output, inputs=[trace])  # before minutes of tuning, not after
    base_settings, flags, notes = resolve_baseline(baseline, target)
    target = _mode_of_baseline(flags, target)
    fixed_values = parse_assignments(fixed)
    if flags is not None:
        from tuner.perf.presets import resolve_target

        base_settings = resolve_target(target).default_settings.replace(**flags.scheduler)
    result = tune(trace, target=target, output=output, baseline=base_settings,
                  fixed=fixed_values or None, **tune_kw)
    result.notes[:0] = notes
    name = pathlib.Path(output).stem
    profile = result.to_profile(name, description=f"tuned by `tuner tune` on {trace}")
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
    if result.space.has_deployment:
        before, after = (Deployment.from_dict(result.deployment_of(p)).describe()
                         for p in (result.baseline, sel.point))
        lines.append(f"deployment: {before} -> {after}" if before != after
                     else f"deployment: {after} (the baseline's)")
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
