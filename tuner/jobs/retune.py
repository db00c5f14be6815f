"""One retune run: ingest new traffic, tune on the recent window, publish only if better.

NOTE(tuner): the model in one paragraph. The job is a pure function of (its sources, its
state dir, the profile history). It ingests what the state's watermarks have not seen
into deterministic window parts, tunes on the last ``window`` seconds (warm-started from
the current profile unless drift is large), replays the current and candidate settings on
the same window and on its held-out tail, and publishes a new version only when a paired
bootstrap says the improvement clears ``margin`` with ``confidence`` (see
:mod:`tuner.jobs.decide`).

Commit order (each step one atomic rename or fsynced append)::

    pending.json (intent: run id, version, new state, changelog entry)
    -> vNNNN.yaml -> current (symlink swap) -> state.json -> changelog.jsonl
    -> remove pending.json -> delete window parts the state no longer lists -> hook

:func:`recover` runs first in every job: with a pending intent whose version is already
``current`` (or that published nothing) it rolls forward (state, changelog); otherwise it
rolls back (removes the unreferenced version file). Either way the profile that was
current stays current unless the pointer swap itself completed.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import pathlib
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.errors import ConfigError
from tuner.jobs._atomic import crash_point
from tuner.outputs import write_json
from tuner.jobs.config import RetuneConfig
from tuner.jobs.decide import compare_replays, decide
from tuner.jobs.drift import compare, window_stats
from tuner.jobs.history import ProfileHistory
from tuner.jobs.kv_tier import profile_target, tier_of, tune_record
from tuner.jobs.lock import JobLock
from tuner.jobs.state import JobState, load_state, save_state
from tuner.jobs.window import expired_parts, ingest_new, load_window, remove_unlisted

if TYPE_CHECKING:
    from tuner.progress import Progress

#: Exit codes of ``tuner retune`` (docs/retune.md).
EXIT_PUBLISHED = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_KEPT = 3
EXIT_LOCKED = 4
EXIT_HOOK_FAILED = 5


@dataclass
class RetuneOutcome:
    """What one run decided, and its evidence (the changelog entry is ``entry``)."""

    decision: str  # "published" | "kept"
    reason: str
    version: int | None  # the published version, or the current one when kept
    profile_path: str | None
    entry: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    hook: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        if self.decision != "published":
            return EXIT_KEPT
        if self.hook is not None and self.hook.get("returncode") != 0:
            return EXIT_HOOK_FAILED
        return EXIT_PUBLISHED

    def to_dict(self) -> dict[str, Any]:
        return {"decision": self.decision, "reason": self.reason, "version": self.version,
                "profile": self.profile_path, "exit_code": self.exit_code,
                "hook": self.hook, "notes": self.notes, "entry": self.entry}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_retune(config: RetuneConfig, *, on_publish: str | None = None,
               progress: "Progress | None" = None) -> RetuneOutcome:
    """Run the job once under the state dir's lock.

    Raises:
        JobLocked: another run holds the lock (nothing was done).
        ConfigError: bad config values or no traffic.
        TunerError: ingest, replay or tuning failed (previous state and profile intact).
    """
    config.state_dir.mkdir(parents=True, exist_ok=True)
    with JobLock(config.state_dir):
        notes = recover(config)
        # Unique even for two runs of one process within a second (it names the study too).
        run_id = f"{_now()}-{os.getpid()}-{secrets.token_hex(3)}"
        try:
            outcome = _run_locked(config, run_id, progress=progress)
        except Exception as exc:
            # Logged for monitoring; nothing else was committed, so state and profile
            # are those of the last complete run.
            ProfileHistory(config.profiles_dir, config.profile).append_changelog(
                {"run_id": run_id, "date": _now(), "profile": config.profile,
                 "decision": "failed", "reason": f"{type(exc).__name__}: {exc}",
                 "version": None})
            shutil.rmtree(config.state_dir / "runs", ignore_errors=True)
            raise
        outcome.notes[:0] = notes
        hook = on_publish or config.on_publish
        if outcome.decision == "published" and hook:
            outcome.hook = run_hook(hook, config, outcome)
        return outcome


def _run_locked(config: RetuneConfig, run_id: str, *,
                progress: "Progress | None") -> RetuneOutcome:
    state = load_state(config.state_dir)
    history = ProfileHistory(config.profiles_dir, config.profile)
    check_target_unchanged(config, state, history)
    state.target = dict(config.target)
    work = config.state_dir / "runs" / run_id
    ingested = ingest_new(config.sources, state, config.window_dir, work / "ingest",
                          salt=config.salt_path, hash_block_size=config.hash_block_size,
                          on_error=config.on_error)
    crash_point("after_ingest")
    current_v = history.current_version()
    base_entry: dict[str, Any] = {"run_id": run_id, "date": _now(), "profile": config.profile,
                                  "new_requests": ingested.num_new_requests,
                                  "current_version": current_v}
    if ingested.num_new_requests == 0:
        shutil.rmtree(work, ignore_errors=True)
        return _keep(config, history, None, {**base_entry, "window": None},
                     "no new requests since the last run", ingested.notes)
    window = load_window(config.window_dir, state.clock_end_s, config.window_s)
    t_lo = max(0.0, state.clock_end_s - config.window_s)
    stats = window_stats(window)
    entry = {**base_entry, "window": {"start_s": t_lo, "end_s": state.clock_end_s,
                                      "clock_origin_utc": state.clock_origin_utc,
                                      "requests": len(window)}}
    current = _load_current(history)
    reference = ((current.provenance.get("retune") or {}).get("window_stats")
                 if current is not None else None) or state.reference_stats
    drift = compare(reference, stats)
    entry["drift"] = drift
    state.reference_stats = stats
    state.runs += 1
    state.last_run_id = run_id
    if len(window) < config.min_requests:
        shutil.rmtree(work, ignore_errors=True)
        return _keep(config, history, state, entry, f"window has {len(window)} requests, "
                     f"fewer than min_requests={config.min_requests}", ingested.notes)
    full = current is None or (drift["score"] is not None
                               and drift["score"] > config.drift_threshold)
    entry["search"] = "full" if full else "warm-start"
    entry["full_search_reason"] = (None if not full else "no current profile"
                                   if current is None else
                                   f"drift {drift['score']} > {config.drift_threshold}")
    window_path = work / "window.parquet"
    window.write(window_path, compression_level=1)
    candidate, tune_info = _tune(config, window_path, run_id, history, full, progress)
    entry["tune"] = tune_info
    crash_point("after_tune")
    evaluation, decision, reason = _evaluate(config, window, current, candidate)
    entry["evaluation"] = evaluation
    crash_point("after_evaluate")
    shutil.rmtree(work, ignore_errors=True)
    if decision != "publish":
        return _keep(config, history, state, entry, reason, ingested.notes)
    return _publish(config, history, state, entry, candidate, stats, reason, ingested.notes)


#: Target keys a profile records and that name the deployment (the others are details of
#: how it is modelled); a current profile that differs in one was tuned for another one.
_DEPLOYMENT_KEYS = ("hardware", "model", "tp", "dp")


def check_target_unchanged(config: RetuneConfig, state: JobState,
                           history: ProfileHistory) -> None:
    """Refuse a run whose ``target`` is not the one the history was tuned for.

    The window, the drift reference and the current profile all describe the old
    deployment: a run under a new target used to say "no new requests" and keep the old
    profile, or compare a candidate against a profile for other hardware.
    """
    how = (f"to tune for the new target, start a new history: give the config a new "
           f"`profile:` name and `state_dir:` (or move {config.state_dir} and "
           f"{history.root} aside)")
    if state.target is not None and _canonical(state.target) != _canonical(config.target):
        keys = sorted(set(state.target) | set(config.target))
        changed = ", ".join(f"{k}: {state.target.get(k)!r} -> {config.target.get(k)!r}"
                            for k in keys if state.target.get(k) != config.target.get(k))
        raise ConfigError(f"{config.path}: target changed since the last run ({changed}); "
                          + how)
    current = _load_current(history)
    if current is None:
        return
    was = current.target.to_dict()
    differs = ", ".join(f"{k}: {was.get(k)!r}" for k in _DEPLOYMENT_KEYS
                        if k in config.target and str(config.target[k]) != str(was.get(k)))
    if differs:
        raise ConfigError(f"{config.path}: the current profile of {config.profile!r} was tuned "
                          f"for another target ({differs}); " + how)


def _canonical(target: dict[str, Any]) -> str:
    return json.dumps(target, sort_keys=True, default=str)


def profile_options(profile: Any, default: Any) -> Any:
    """``SimOptions`` with the speculative decoding ``profile`` deploys (its
    ``target.speculative``; no profile: ``default``, the config's)."""
    from tuner.sim.settings import SimOptions
    from tuner.sim.spec_decode import SpecDecoding

    if profile is None:
        spec = default
    else:
        raw = profile.target.speculative
        spec = None if raw is None else SpecDecoding.from_dict(raw)
    return SimOptions(speculative=spec)


def _load_current(history: ProfileHistory):  # type: ignore[no-untyped-def]
    from tuner.profile import load_profile

    path = history.current_path()
    return None if path is None else load_profile(path)


def _tune(config: RetuneConfig, window_path: pathlib.Path, run_id: str,
          history: ProfileHistory, full: bool,
          progress: "Progress | None"):  # type: ignore[no-untyped-def]
    from tuner.profile.recommend import tuned_profile, warm_start_from
    from tuner.tune.options import SearchOptions, StudyOutput, TuneInputs

    from tuner.tune.robust import RobustOptions

    target, calibration = calibrated_target(config, window_path)
    inputs = TuneInputs(str(window_path), target=target, holdout=config.holdout,
                        stage1_fraction=config.stage1_fraction,
                        speculative=config.speculative)
    search = SearchOptions(space=config.space, objectives=config.objectives,
                           constraints=config.constraints, n_trials=config.trials,
                           seed=config.seed, prefer=config.prefer,
                           warm_start=None if full else warm_start_from(history.current_path()),
                           robust=RobustOptions(enabled=config.robust == "on",
                                                variants=config.clock_variants,
                                                share=config.robust_share, seed=config.seed),
                           spec_tokens=config.spec_tokens,
                           kv_offloading_sizes=config.kv_offloading_sizes,
                           kv_offloading_policies=config.kv_offloading_policies,
                           host_memory_gb=config.host_memory_gb)
    result, candidate = tuned_profile(
        config.profile, inputs, search,
        study=StudyOutput(storage=config.storage_url, study_name=f"{config.profile}-{run_id}",
                          progress=progress),
        description=f"tuned by `tuner retune` (run {run_id})")
    info = {"study": result.study_name, "trials": result.to_dict()["trials"],
            "recommended": result.to_dict()["recommended"], "notes": result.notes,
            "wall_s": round(result.wall_s, 3), "calibration": calibration,
            "robust": result.to_dict()["robust"]}
    tier = tune_record(config, result)
    if tier is not None:  # only with a tier searched: older entries keep their keys
        info["kv_tier"] = tier
    return candidate, info


def calibrated_target(config: RetuneConfig, window_path: pathlib.Path
                      ) -> tuple[Any, dict[str, Any] | None]:
    """The target a run tunes and decides on, and what calibrated it.

    ``calibration: metrics``: the clock fitted to the server's /metrics over the window
    (``tuner calibrate --from-metrics``), written to ``state_dir/calibration.yaml``; a
    window the metrics do not match (too short, another deployment) keeps the target's own
    clock, and the run's changelog entry says why.
    """
    target = config.make_target()
    if config.calibration != "metrics":
        return target, None
    from tuner.fidelity.from_metrics import calibrate_from_metrics, read_window_metrics
    from tuner.perf.fit.calibration_file import save_calibration

    try:
        metrics = read_window_metrics(config.metrics)
        fit = calibrate_from_metrics(str(window_path), dataclasses.replace(target,
                                                                           calibration=None),
                                     metrics, served_model_name=config.served_model_name)
    except ConfigError as exc:
        # an earlier run's fit is of another window: the decision must not use it
        (config.state_dir / "calibration.yaml").unlink(missing_ok=True)
        return target, {"source": "metrics", "used": False, "reason": str(exc)}
    path = save_calibration(config.state_dir / "calibration.yaml", fit.calibration)
    record = {"source": "metrics", "used": True, "file": str(path),
              "factors": fit.factors.to_dict(),
              "error_pct": {h.name: h.to_dict()["error_pct"] for h in fit.histograms}}
    return dataclasses.replace(target, calibration=str(path)), record


def _evaluate(config: RetuneConfig, window: Any, current: Any,
              candidate: Any) -> tuple[dict[str, Any], str, str]:
    """Replay current and candidate on the window and its held-out tail; bootstrap."""
    from tuner.replay import run
    from tuner.trace import slice_trace

    target = config.make_target()
    fitted = config.state_dir / "calibration.yaml"
    if config.calibration == "metrics" and fitted.exists():  # this run's fit (_tune)
        target = dataclasses.replace(target, calibration=str(fitted))
    t0, t1 = window.time_range()
    held = slice_trace(window, start_s=t0 + (1 - config.holdout) * (t1 - t0))
    cur_settings = None if current is None else current.scheduler
    out: dict[str, Any] = {"current": "vLLM defaults" if current is None else "current profile",
                           "confidence": config.confidence, "margin": config.margin}
    slices: dict[str, list[Any]] = {}
    # each with the drafts it deploys (the current one without a profile: the config's)
    cur_opts, cand_opts = (profile_options(p, config.speculative) for p in (current, candidate))
    # each on the CPU KV tier its profile deploys (tuner.jobs.kv_tier)
    cur_target, cand_target = (profile_target(p, target) for p in (current, candidate))
    if cur_target.kv_offloading_size is not None or cand_target.kv_offloading_size is not None:
        out["kv_offloading"] = {"current": tier_of(cur_target),
                                "candidate": tier_of(cand_target)}
    for where, trace in (("window", window), ("holdout", held)):
        a = run(trace, cur_settings, target=cur_target, options=cur_opts)
        b = run(trace, candidate.scheduler, target=cand_target, options=cand_opts)
        comps = compare_replays(a, b, config.decide_on, confidence=config.confidence,
                                n_boot=config.bootstrap_samples, seed=config.seed,
                                num_gpus=target.num_gpus)
        slices[where] = comps
        out[where] = {"requests": len(trace), **{c.objective: c.to_dict() for c in comps}}
    same = (cur_settings is not None and cur_settings.to_dict() == candidate.scheduler.to_dict()
            and cur_opts == cand_opts and tier_of(cur_target) == tier_of(cand_target))
    decision, reason = decide(slices["window"], slices["holdout"], margin=config.margin,
                              same_settings=same)
    return out, decision, reason


def _keep(config: RetuneConfig, history: ProfileHistory, state: JobState | None,
          entry: dict[str, Any], reason: str, notes: list[str]) -> RetuneOutcome:
    """Record "kept": state (if it moved) then changelog, through the same intent file."""
    entry = {**entry, "decision": "kept", "reason": reason, "version": None}
    _commit(config, history, state, entry, version=None)
    path = history.current_path()
    return RetuneOutcome("kept", reason, history.current_version(),
                         None if path is None else str(path), entry, list(notes))


def _publish(config: RetuneConfig, history: ProfileHistory, state: JobState,
             entry: dict[str, Any], candidate: Any, stats: dict[str, Any], reason: str,
             notes: list[str]) -> RetuneOutcome:
    from tuner.profile import save_profile

    version = history.next_version()
    entry = {**entry, "decision": "published", "reason": reason, "version": version,
             "previous_version": history.current_version()}
    provenance = {**candidate.provenance,
                  "retune": {"run_id": entry["run_id"], "version": version,
                             "window": entry["window"], "window_stats": stats,
                             "drift": entry.get("drift"), "evaluation": entry.get("evaluation")}}
    profile = dataclasses.replace(candidate, provenance=provenance)
    _commit(config, history, state, entry, version=version,
            write_version=lambda: save_profile(profile, history.version_path(version)))
    return RetuneOutcome("published", reason, version, str(history.version_path(version)),
                         entry, list(notes))


def _pending_path(config: RetuneConfig) -> pathlib.Path:
    return config.state_dir / "pending.json"


def _commit(config: RetuneConfig, history: ProfileHistory, state: JobState | None,
            entry: dict[str, Any], *, version: int | None, write_version: Any = None) -> None:
    """The commit order of the module docstring; crash points between every step."""
    if state is not None:
        # Expired parts leave the list in the same atomic write as the new watermarks;
        # their files go after the commit (an unlisted file is deleted by any later run).
        gone = set(expired_parts(config.window_dir, state.parts, state.clock_end_s,
                                 config.window_s))
        state.parts = [p for p in state.parts if p not in gone]
    pending = _pending_path(config)
    write_json(pending, {"run_id": entry["run_id"], "version": version,
                                "state": None if state is None else state.to_dict(),
                                "entry": entry})
    crash_point("after_intent")
    if version is not None:
        write_version()
        crash_point("after_version")
        history.swap_current(version)
        crash_point("after_pointer")
    if state is not None:
        save_state(config.state_dir, state)
        crash_point("after_state")
    history.append_changelog(entry)
    crash_point("after_changelog")
    pending.unlink()
    if state is not None:
        remove_unlisted(config.window_dir, state.parts)


def recover(config: RetuneConfig) -> list[str]:
    """Finish or undo a run that died mid-commit; drop orphan versions. Returns notes."""
    history = ProfileHistory(config.profiles_dir, config.profile)
    notes: list[str] = []
    pending = _pending_path(config)
    logged = {e.get("run_id") for e in history.changelog()}
    if pending.exists():
        data = json.loads(pending.read_text())
        version = data.get("version")
        if version is None or history.current_version() == version:
            if data.get("state") is not None:
                save_state(config.state_dir, JobState.from_dict(data["state"], str(pending)))
            if data["run_id"] not in logged:
                history.append_changelog({**data["entry"], "recovered": True})
            notes.append(f"recovered run {data['run_id']}: completed its commit "
                         f"({'kept' if version is None else f'v{version:04d} published'}"
                         f"{'' if version is None else '; its on_publish hook was not run'})")
        else:
            notes.append(f"recovered run {data['run_id']}: it died before publishing "
                         f"v{version:04d}; previous profile stays current")
        pending.unlink()
    cur = history.current_version() or 0
    published = {e.get("version") for e in history.changelog()}
    for v in history.versions():
        if v > cur and v not in published:
            history.version_path(v).unlink()
            notes.append(f"removed orphan {history.version_path(v).name} of a crashed run")
    removed = remove_unlisted(config.window_dir, load_state(config.state_dir).parts)
    if removed:
        notes.append(f"removed {len(removed)} window part(s) not in the state (a crashed "
                     "run's, or expired)")
    shutil.rmtree(config.state_dir / "runs", ignore_errors=True)
    return notes


def run_hook(command: str, config: RetuneConfig, outcome: RetuneOutcome) -> dict[str, Any]:
    """Run the on-publish command with the new profile in its environment."""
    history = ProfileHistory(config.profiles_dir, config.profile)
    env = {**os.environ, "TUNER_PROFILE_PATH": str(outcome.profile_path),
           "TUNER_PROFILE_NAME": config.profile,
           "TUNER_PROFILE_VERSION": str(outcome.version),
           "TUNER_PROFILE_CURRENT": str(history.pointer),
           "TUNER_PREVIOUS_VERSION": str(outcome.entry.get("previous_version") or "")}
    try:
        proc = subprocess.run(command, shell=True, env=env, capture_output=True, text=True,
                              timeout=3600)
    except subprocess.TimeoutExpired:
        return {"command": command, "returncode": None, "error": "timed out after 3600 s"}
    return {"command": command, "returncode": proc.returncode,
            "stderr_tail": proc.stderr[-2000:], "stdout_tail": proc.stdout[-2000:]}
