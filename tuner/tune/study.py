"""The tuning study: staged multi-objective Optuna search, held-out check, selection.

NOTE(tuner): the model in one paragraph. Optuna cannot prune a multi-objective study
(``Trial.report``/``should_prune`` raise), so fidelity is staged by hand. Stage 1 is an
Optuna study (TPE, Optuna 5's default multi-objective sampler; constraints through
``trial.set_constraint``, which TPE honours) whose trials replay a short slice of the
training window. Its best points by non-dominated rank -- the survivors -- are replayed on
the whole training window in stage 2, recorded as trials of a second study
``<study>.full`` (values, constraints and settings; no params, so any point fits). The
Pareto front of stage 2 and the baseline (vLLM's defaults, also trial 0 of stage 1) are
then replayed on the held-out window, and the recommended point is picked from the
stage-2 front by the rule in :mod:`tuner.tune.select`. Every result lives in the storage,
so a rerun with the same study name resumes where the last run stopped.

Call order inside :func:`tune`::

    open/create study -> fail own dead trials -> enqueue baseline (+ warm start)
    -> stage 1 (1 process, or N forked workers sharing the storage; remote joiners too:
       tuner.tune.stage1)
    -> survivors -> stage 2 (train window) -> held-out window -> select
       (tuner.tune.survivors)
    -> robust check (the pick under clock variants, tuner.tune.robust) -> TuneResult

This module is that order and the study's set-up; what runs a stage lives beside it. A
joiner (:func:`join`, ``tuner tune --join``) only runs stage-1 trials
(:func:`tuner.tune.stage1.run_trials`); the process that created the study runs stages 2
and 3 (:mod:`tuner.tune.survivors`).
"""

from __future__ import annotations

import datetime

import contextlib
import os
import pathlib
import socket
import tempfile
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Sequence

from tuner.errors import ConfigError, StudyNotFound
from tuner.metrics import parse_slo
from tuner.processes import cap_workers, pid_alive
from tuner.progress import Progress, Reporter, check_progress
from tuner.tune.baseline import baseline_settings
from tuner.tune.baseline_track import BaselineTrack
from tuner.tune.deployment_space import base_deployment_of, join_settings, with_deployment
from tuner.tune.spec_space import spec_gain, with_spec_tokens
from tuner.tune.kv_tier_space import kv_tier_gain, with_kv_tier
from tuner.tune.pd_space import check_pd_inputs, parse_disaggregated, with_pd
from tuner.tune.pd_verdict import pd_verdict
from tuner.tune.evaluate import Evaluator, ReplayEvaluator, evaluator_from_spec
from tuner.tune.inputs import check_window_sizes, fixed_space, input_warnings
from tuner.tune.objectives import parse_constraints, parse_objectives
from tuner.tune.options import (DeploymentSearch, SearchOptions, StudyOutput, TuneInputs,
                                WarmStart)
from tuner.tune.overload import overload_report
from tuner.tune.result import TuneResult
from tuner.tune.robust import robust_check, robust_selection
from tuner.tune.select import PickRule, pareto_front, rank, select
from tuner.tune.space import load_space
from tuner.tune.stage1 import (finished_trials, run_stage1, run_trials, stage1_points,
                               stage1_sampler)
from tuner.tune.storage import default_journal_path, open_storage, quiet_optuna, redact_url
from tuner.tune.study_records import StudyConfig, StudyRecords, settings_key
from tuner.tune.survivors import pick_survivors, run_holdout, run_stage2

if TYPE_CHECKING:
    import optuna

# --------------------------------------------------------------------------- public API


def tune(inputs: TuneInputs, search: SearchOptions = SearchOptions(),
         deployment: DeploymentSearch = DeploymentSearch(),
         output: StudyOutput = StudyOutput()) -> TuneResult:
    """Search scheduler settings for ``inputs`` and pick a recommended point.

    Args:
        inputs: what every trial replays (trace or evaluator, target, windows, baseline).
        search: the space, objectives, constraints, trial budget, pick rule, warm start.
        deployment: the baseline's router, a GPU budget's splits and the routers searched
            (:mod:`tuner.tune.deployment_space`).
        output: the study's storage and name, local workers, the progress sink.

    The fields are documented in :mod:`tuner.tune.options`. The result is turned into a
    profile by ``tuner.profile.profile_of``.

    Raises:
        ConfigError: bad space/objectives/constraints, an existing study with another
            configuration, unreachable storage.
    """
    import optuna

    if search.n_trials < 1:
        raise ConfigError(f"n_trials={search.n_trials}: at least one trial is needed")
    if output.workers < 1:
        raise ConfigError(f"workers={output.workers}: must be >= 1")
    n_trials, workers, seed, target = search.n_trials, output.workers, search.seed, inputs.target
    prefer = search.prefer
    workers, worker_note = cap_workers(workers, n_trials)
    rule = prefer if isinstance(prefer, PickRule) else PickRule(prefer=prefer)  # type: ignore[arg-type]
    fixed = dict(inputs.fixed) if inputs.fixed else None
    scheduler = fixed_space(load_space(search.space), fixed)
    pd_mode = parse_disaggregated(deployment.disaggregated)
    check_pd_inputs(pd_mode, speculative=inputs.speculative,
                    kv_sizes=search.kv_offloading_sizes, backend=inputs.backend)
    the_space, deploy_notes = with_deployment(scheduler, target,
                                              gpu_budget=deployment.gpu_budget,
                                              routers=deployment.routers)
    the_space, pd_notes = with_pd(scheduler, the_space, target, mode=pd_mode,
                                  gpu_budget=deployment.gpu_budget,
                                  pool_tps=deployment.pd_tps, routers=deployment.pd_routers,
                                  fill=deployment.pd_gpus,  # type: ignore[arg-type]
                                  prefill_hardware=deployment.pd_prefill_hardware,
                                  transfer_modes=deployment.pd_transfer_modes)
    deploy_notes += pd_notes
    the_space = with_spec_tokens(the_space, inputs.speculative, search.spec_tokens)
    the_space, tier_notes = with_kv_tier(the_space, target, search.kv_offloading_sizes,
                                         search.kv_offloading_policies, search.host_memory_gb)
    evaluator = inputs.evaluator
    if evaluator is None and inputs.backend != "sim" and (the_space.has_deployment
                                                          or target.replicas > 1):
        raise ConfigError(f"--backend {inputs.backend} replays one deployment; --replicas > 1 "
                          "behind a router and --gpu-budget run on the sim backend")
    slo_ms = parse_slo(dict(inputs.slo) if isinstance(inputs.slo, Mapping) else inputs.slo)
    if evaluator is None:
        if inputs.trace is None:
            raise ConfigError("tune() needs a trace (or an evaluator)")
        evaluator = ReplayEvaluator(inputs.trace, target=target, backend=inputs.backend,
                                    holdout=inputs.holdout,
                                    stage1_fraction=inputs.stage1_fraction, slo_ms=slo_ms,
                                    router=deployment.router, speculative=inputs.speculative)
    if inputs.baseline is not None or fixed:
        evaluator.default_settings = baseline_settings(
            evaluator.default_settings, profile=inputs.baseline, fixed=fixed)
    objectives, constraints = search.objectives, search.constraints
    _check_goodput(objectives, constraints, slo_ms)
    size_notes = check_window_sizes(evaluator)
    objs = parse_objectives(objectives, evaluator.known_metrics)
    cons = parse_constraints(constraints, evaluator.known_metrics)
    config = StudyConfig(space=the_space, objectives=objs, constraints=cons, n_trials=n_trials,
                         seed=seed, evaluator=evaluator.spec())
    storage, study_name = output.storage, output.study_name
    with contextlib.ExitStack() as stack:
        storage_url = storage
        if storage_url is None and output.output is not None:
            storage_url = str(default_journal_path(output.output))
        if storage_url is None and workers > 1:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="tuner-study-"))
            storage_url = os.path.join(tmp, "study.optuna-journal")
        if study_name is None:
            study_name = (pathlib.Path(output.output).stem if output.output is not None else
                          f"tune-{str(config.evaluator.get('trace_fingerprint', 'x'))[:12]}-"
                          f"{the_space.name}")
        stack.enter_context(quiet_optuna())
        started = time.perf_counter()
        storage_obj = open_storage(storage_url) if storage_url else optuna.storages.InMemoryStorage()
        study = _create_or_load(storage_obj, study_name, config)
        notes = _resume_note(study, study_name, storage_url)
        notes += _fail_dead_local_trials(study)
        notes += _enqueue_start_points(study, config, evaluator, search.warm_start)
        timings: dict[str, float] = {}
        # the baseline's replays beside stage 1 (not needed when stage 1 is the training
        # window: trial 0 is then stage 2's baseline replay)
        track = (BaselineTrack(storage_url, study_name, config, evaluator)
                 if workers > 1 and storage_url and evaluator.windows.staged else None)
        with Reporter(check_progress(output.progress), unit="trials") as bar:
            t = time.perf_counter()
            run_stage1(study, storage_url, config, evaluator, workers, bar, search.early_stop,
                       track)
            timings["stage1_s"] = time.perf_counter() - t
            stage1 = stage1_points(study)
            baseline_key = settings_key(join_settings(
                evaluator.default_settings,
                base_deployment_of(evaluator) if the_space.has_deployment else None))
            survivors = pick_survivors(stage1, objs,
                                       search.n_survivors or min(32, max(8, n_trials // 10)),
                                       baseline_key)
            t = time.perf_counter()
            stage2 = run_stage2(storage_obj, study_name, config, evaluator, survivors, stage1,
                                workers, bar)
            timings["stage2_s"] = time.perf_counter() - t
        baseline = next(p for p in stage2 if p.is_baseline)
        front = pareto_front(stage2, objs)
        t = time.perf_counter()
        candidates = rank(stage2, baseline, objs, cons, rule)
        run_holdout(storage_obj, study_name, evaluator, front + candidates + [baseline], workers)
        selection = select(stage2, baseline, objs, rule, cons,
                           held_out=evaluator.windows.has_holdout,
                           replay_holdout=lambda pts: run_holdout(
                               storage_obj, study_name, evaluator, pts, workers))
        timings["holdout_s"] = time.perf_counter() - t
        t = time.perf_counter()
        robust = robust_check(
            evaluator, selection, baseline, objs, cons, rule, search.robust, workers=workers,
            baseline_name=("vLLM's defaults" if inputs.baseline is None and not fixed
                           else "the baseline"),
            calibration=target.calibration,
            reselect=lambda failed: select(
                [p for p in stage2 if all(p is not f for f in failed)], baseline, objs, rule,
                cons, held_out=evaluator.windows.has_holdout,
                replay_holdout=lambda pts: run_holdout(storage_obj, study_name, evaluator,
                                                       pts, workers)))
        selection = robust_selection(selection, robust)
        timings["robust_s"] = time.perf_counter() - t
        gain = spec_gain(evaluator, selection.point,
                         window="holdout" if evaluator.windows.has_holdout else "train")
        tier_gain = kv_tier_gain(evaluator, selection.point, the_space,
                                 window="holdout" if evaluator.windows.has_holdout else "train")
        pd = pd_verdict(evaluator, pd_mode, stage1=stage1, stage2=stage2, baseline=baseline,
                        selection=selection, objectives=objs, rule=rule)
        t = time.perf_counter()
        overload = (track.report() if track is not None
                    else overload_report(evaluator, baseline, evaluator.default_settings))
        timings["capacity_s"] = time.perf_counter() - t  # ~0 after the baseline track
        notes = (input_warnings(baseline, evaluator) + size_notes + deploy_notes + tier_notes
                 + notes)
        notes += [worker_note] if worker_note else []
        counts = _counts(study)
        return TuneResult(
            study_name=study_name, storage=redact_url(storage_url), config_attrs=config.to_attrs(),
            space=the_space, objectives=objs, constraints=cons, windows=evaluator.windows,
            baseline=baseline, selection=selection, front=front, stage2=stage2,
            n_complete=counts["complete"], n_refused=counts["refused"],
            n_pruned=counts["pruned"], n_failed=counts["failed"], n_stopped=counts["stopped"],
            n_infeasible=sum(1 for p in stage1 if not p.feasible), prefer=rule.prefer,
            rule=rule, overload=overload, robust=robust,
            seed=seed, wall_s=time.perf_counter() - started, notes=notes,
            evaluator_spec=config.evaluator,
            num_gpus=int(getattr(evaluator, "num_gpus", 1)),
            block_size=getattr(evaluator, "block_size", None), timings=timings,
            max_model_len=getattr(evaluator, "max_model_len", None), spec_gain=gain,
            kv_tier_gain=tier_gain, pd_verdict=pd)


def join(study_name: str, storage: str, n_trials: int | None = None, *, trace: Any = None,
         evaluator: Evaluator | None = None,
         progress: "Progress | None" = None) -> dict[str, Any]:
    """Work on an existing study's stage 1 from another process or machine.

    The study's user attrs hold the space, objectives, constraints, target and trace
    (path and fingerprint); the trace is read from ``trace`` or the stored path and must
    have the same fingerprint. Runs until the study has its ``n_trials`` or this joiner has
    run ``n_trials`` (when given).

    Returns:
        ``{"study": name, "trials_run": k, "study_trials": total, "n_trials": target}``.

    Raises:
        StudyNotFound: no such study in ``storage``.
        ConfigError: the trace differs from the study's, or the study was not made by tuner.
    """
    import optuna

    with quiet_optuna():
        storage_obj = open_storage(storage)
        study = _load(storage_obj, study_name)
        attrs = StudyRecords.config_attrs(study)
        if attrs is None:
            raise ConfigError(f"study {study_name!r} in {redact_url(storage)} was not created by "
                              "`tuner tune`; nothing to join")
        config = StudyConfig.from_attrs(attrs)
        if evaluator is None:
            evaluator = evaluator_from_spec(config.evaluator, trace=trace)
        theirs = evaluator.spec().get("trace_fingerprint")
        if theirs != config.evaluator.get("trace_fingerprint"):
            raise ConfigError(f"cannot join study {study_name!r}: the trace fingerprint "
                              f"{str(theirs)[:16]} differs from the study's "
                              f"{str(config.evaluator.get('trace_fingerprint'))[:16]}; "
                              "use the same trace file")
        before = finished_trials(study)
        with Reporter(check_progress(progress), unit="trials") as bar:
            bar.stage(f"join {study_name}", config.n_trials, before)
            run_trials(study, config, evaluator, worker_cap=n_trials,
                       seed=config.seed + 1000 + os.getpid() % 1000, bar=bar)
        study = optuna.load_study(study_name=study_name, storage=storage_obj)
        after = finished_trials(study)
        return {"study": study_name, "trials_run": after - before, "study_trials": after,
                "n_trials": config.n_trials}


def _check_goodput(objectives: Any, constraints: Sequence[str], slo_ms: dict[str, float]
                   ) -> None:
    named = " ".join([str(objectives or "")] + [str(c) for c in constraints])
    if "goodput" in named and not slo_ms:
        raise ConfigError("goodput needs --slo, e.g. --slo ttft:2000,tpot:50 (milliseconds, "
                          "as vllm bench serve --goodput)")


# --------------------------------------------------------------------------- study set-up


def _load(storage: Any, name: str) -> "optuna.Study":
    import optuna

    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = optuna.get_all_study_names(storage)
        raise StudyNotFound(f"no study {name!r} in this storage; existing: "
                            f"{', '.join(n for n in names if not StudyRecords.is_stage2_name(n)) or 'none'}"
                            ) from None


def _create_or_load(storage: Any, name: str, config: StudyConfig) -> "optuna.Study":
    import optuna

    study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True,
                                directions=[o.direction for o in config.objectives],
                                sampler=stage1_sampler(config.seed, config.space))
    stored = StudyRecords.config_attrs(study)
    if stored is None:
        StudyRecords.write_config(study, config.to_attrs())
        return study
    why = StudyConfig.from_attrs(stored).same_search(config)
    if why is not None:
        raise ConfigError(f"study {name!r} already exists with {why}; pass another --study name "
                          "(or the original settings to resume it)")
    if stored["n_trials"] != config.n_trials:  # resuming with a new budget is allowed
        StudyRecords.write_config(study, {**stored, "n_trials": config.n_trials})
    return study


def _resume_note(study: "optuna.Study", name: str, storage_url: str | None) -> list[str]:
    """Say so when this run continues an existing study instead of starting afresh."""
    from optuna.trial import TrialState

    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
    if not done:
        return []
    return [f"resumed study {name!r} ({redact_url(storage_url)}): {done} trial(s) were already "
            "finished and are kept; pass another --study name to start afresh"]


def _fail_dead_local_trials(study: "optuna.Study") -> list[str]:
    """Fail RUNNING trials whose worker (this host, by pid) is gone: a killed run's
    leftovers, which would otherwise count as in flight forever in a journal file."""
    from optuna.trial import TrialState

    host, notes = socket.gethostname(), []
    now = datetime.datetime.now()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker_host, pid = StudyRecords.worker(trial)
        if worker_host is None and trial.datetime_start is not None and (
                now - trial.datetime_start).total_seconds() > ORPHAN_AFTER_S:
            # A worker killed between ask() and recording its host/pid: nobody owns it.
            StudyRecords.fail_trial(study, trial)
            notes.append(f"trial {trial.number} has been running {ORPHAN_AFTER_S:.0f}+ s "
                         "with no worker recorded; marked failed")
            continue
        if worker_host != host:
            continue
        if isinstance(pid, int) and not pid_alive(pid):
            StudyRecords.fail_trial(study, trial)
            notes.append(f"trial {trial.number} was left running by a dead process; marked failed")
    return notes


#: A RUNNING trial without a recorded worker this old is a killed run's leftover (a live
#: worker records its host and pid right after ask(), within milliseconds).
ORPHAN_AFTER_S = 600.0


def _enqueue_start_points(study: "optuna.Study", config: StudyConfig, evaluator: Evaluator,
                          warm_start: WarmStart | None) -> list[str]:
    """Enqueue vLLM's defaults (trial 0 of a new study) and the warm-start points."""
    notes: list[str] = []
    space = config.space
    base_deployment = base_deployment_of(evaluator)
    base = space.project(evaluator.default_settings, base_deployment)
    if space.contains(base):
        study.enqueue_trial(base, user_attrs=StudyRecords.start_attrs(StudyRecords.BASELINE),
                            skip_if_exists=True)
    else:
        notes.append(f"vLLM's defaults {base} lie outside space {space.name!r}; the baseline is "
                     "evaluated in stage 2 only")
    if warm_start is None:
        return notes
    n = 0
    for point in warm_start.points:
        own = point.deployment if space.has_deployment else None
        params = space.project(point.settings, own or base_deployment)
        if not space.contains(params):
            notes.append(f"warm start: {point.role} point {params} is outside space "
                         f"{space.name!r}; skipped")
            continue
        study.enqueue_trial(params, user_attrs=StudyRecords.start_attrs(
            f"warm-start-{point.role}", warm_start.source), skip_if_exists=True)
        n += 1
    notes.append(f"warm start: enqueued {n} point(s) from profile {warm_start.source!r}")
    return notes


# --------------------------------------------------------------------------- the tally


def _counts(study: "optuna.Study") -> dict[str, int]:
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    return {"complete": sum(t.state == TrialState.COMPLETE for t in trials),
            "pruned": len(pruned),
            "refused": sum(StudyRecords.refused(t) is not None for t in pruned),
            "stopped": sum(StudyRecords.stopped(t) is not None for t in pruned),
            "failed": sum(t.state == TrialState.FAIL and not StudyRecords.surplus(t)
                          for t in trials)}
