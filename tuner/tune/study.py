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
    -> stage 1 (1 process, or N forked workers sharing the storage; remote joiners too)
    -> survivors -> stage 2 (train window) -> held-out window -> select
    -> robust check (the pick under clock variants, tuner.tune.robust) -> TuneResult

A joiner (:func:`join`, ``tuner tune --join``) only runs stage-1 trials; the process that
created the study runs stages 2 and 3 (:mod:`tuner.tune.survivors`).
"""

from __future__ import annotations

import datetime

import contextlib
import math
import multiprocessing
import os
import pathlib
import socket
import tempfile
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Sequence

from tuner.errors import ConfigError, StudyNotFound
from tuner.metrics import parse_slo
from tuner.processes import cap_workers, pid_alive
from tuner.progress import Progress, Reporter, check_progress
from tuner.tune.baseline import baseline_settings
from tuner.tune.baseline_track import BaselineTrack
from tuner.tune.deployment_space import (base_deployment_of, deployment_for, evaluate_point,
                                         join_settings, with_deployment)
from tuner.tune.spec_space import spec_gain, with_spec_tokens
from tuner.tune.kv_tier_space import kv_tier_gain, with_kv_tier
from tuner.tune.pd_space import check_pd_inputs, parse_disaggregated, with_pd
from tuner.tune.pd_verdict import pd_verdict
from tuner.tune.early_stop import ReplayStopped, stop_rules
from tuner.tune.evaluate import Evaluator, ReplayEvaluator, evaluator_from_spec
from tuner.tune.inputs import check_window_sizes, fixed_space, input_warnings
from tuner.tune.objectives import best_so_far, parse_constraints, parse_objectives
from tuner.tune.options import (DeploymentSearch, SearchOptions, StudyOutput, TuneInputs,
                                WarmStart)
from tuner.tune.overload import overload_report
from tuner.tune.result import TuneResult
from tuner.tune.robust import robust_check, robust_selection
from tuner.tune.select import PickRule, Point, pareto_front, rank, select
from tuner.tune.space import SearchSpace, load_space
from tuner.tune.storage import default_journal_path, open_storage, quiet_optuna, redact_url
from tuner.tune.study_records import StudyConfig, StudyRecords, settings_key
from tuner.tune.survivors import pick_survivors, run_holdout, run_stage2

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

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
            _run_stage1(study, storage_url, config, evaluator, workers, bar, search.early_stop,
                        track)
            timings["stage1_s"] = time.perf_counter() - t
            stage1 = _stage1_points(study)
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
        before = _finished(study)
        with Reporter(check_progress(progress), unit="trials") as bar:
            bar.stage(f"join {study_name}", config.n_trials, before)
            _optimize(study, config, evaluator, worker_cap=n_trials,
                      seed=config.seed + 1000 + os.getpid() % 1000, bar=bar)
        study = optuna.load_study(study_name=study_name, storage=storage_obj)
        after = _finished(study)
        return {"study": study_name, "trials_run": after - before, "study_trials": after,
                "n_trials": config.n_trials}


def _check_goodput(objectives: Any, constraints: Sequence[str], slo_ms: dict[str, float]
                   ) -> None:
    named = " ".join([str(objectives or "")] + [str(c) for c in constraints])
    if "goodput" in named and not slo_ms:
        raise ConfigError("goodput needs --slo, e.g. --slo ttft:2000,tpot:50 (milliseconds, "
                          "as vllm bench serve --goodput)")


# --------------------------------------------------------------------------- study set-up


def _sampler(seed: int, space: SearchSpace | None = None) -> "optuna.samplers.BaseSampler":
    import optuna

    # TPE is Optuna 5's default multi-objective sampler; it reads trial.constraints itself.
    # constant_liar keeps parallel workers from proposing the same point. A space with
    # conditional parameters (the router only for splits with replicas) samples by group,
    # so the joint model covers each sub-space instead of falling back to independent
    # draws for every parameter that is not always present.
    import warnings

    if space is None or not any(p.when for p in space.params):
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    with warnings.catch_warnings():  # ``group`` is marked experimental since Optuna 2.8
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                          group=True)


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
                                sampler=_sampler(config.seed, config.space))
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


# --------------------------------------------------------------------------- stage 1


def _finished(study: "optuna.Study") -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def _counts(study: "optuna.Study") -> dict[str, int]:
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    return {"complete": sum(t.state == TrialState.COMPLETE for t in trials),
            "pruned": len(pruned),
            "refused": sum(StudyRecords.refused(t) is not None for t in pruned),
            "stopped": sum(StudyRecords.stopped(t) is not None for t in pruned),
            "failed": sum(t.state == TrialState.FAIL for t in trials)}


def _round(value: Any) -> Any:
    # Optuna's float grid gives 0.35000000000000003; profiles should say 0.35.
    return round(value, 6) if isinstance(value, float) else value


def _make_objective(config: StudyConfig, evaluator: Evaluator, window: str,
                    early_stop: bool = True) -> Callable[["optuna.Trial"], Sequence[float]]:
    import optuna

    host, pid = socket.gethostname(), os.getpid()
    base = evaluator.default_settings
    base_deployment = base_deployment_of(evaluator)
    # Replays that prove a latency bound violated stop there (tuner.tune.early_stop); the
    # baseline (trial 0) always runs whole: reports compare every trial with it.
    rules = stop_rules(config.constraints) if early_stop else ()

    def objective(trial: "optuna.Trial") -> Sequence[float]:
        StudyRecords.mark_worker(trial, host, pid)
        params = {k: _round(v) for k, v in config.space.suggest(trial).items()}
        try:
            settings = config.space.settings_for(base, params,
                                                 max_model_len=evaluator.max_model_len)
            deployment = deployment_for(config.space, base_deployment, params)
        except ConfigError as exc:
            # Refused before anything runs: vLLM itself would reject this combination.
            StudyRecords.refuse(trial, str(exc))
            raise optuna.TrialPruned(f"refused: {exc}") from None
        stop = () if StudyRecords.role(trial) == StudyRecords.BASELINE else rules
        try:
            metrics = evaluate_point(evaluator, settings, deployment, window, stop)
        except ReplayStopped as stopped:
            # Proven infeasible: never a survivor. PRUNED, with the violation's lower
            # bound as its constraint value, so TPE ranks it among the infeasible trials.
            StudyRecords.record_stopped(trial, join_settings(settings, deployment),
                                        stopped.reason)
            trial.set_constraint(stopped.rule.constraint, stopped.violation)
            raise optuna.TrialPruned(f"stopped: {stopped.reason}") from None
        except ConfigError as exc:
            if deployment is None:
                raise
            # The replay can refuse a deployment it cannot model for this trace (a
            # session router over a trace without session ids): recorded, not fatal.
            StudyRecords.refuse(trial, str(exc))
            raise optuna.TrialPruned(f"refused: {exc}") from None
        StudyRecords.record_replay(trial, join_settings(settings, deployment), metrics)
        for con in config.constraints:
            trial.set_constraint(str(con), con.violation(metrics))
        values = []
        for obj in config.objectives:
            if obj.key not in metrics:
                raise ConfigError(f"objective {obj.key!r} is not a replay metric; known: "
                                  f"{', '.join(sorted(metrics))}")
            v = metrics[obj.key]
            if v is None or not math.isfinite(float(v)):
                StudyRecords.refuse(trial, f"{obj.key} is undefined on this window "
                                           "(no request finished?)")
                raise optuna.TrialPruned(f"{obj.key} undefined")
            values.append(float(v))
        return values

    return objective


def _optimize(study: "optuna.Study", config: StudyConfig, evaluator: Evaluator, *,
              worker_cap: int | None, seed: int, bar: Reporter | None = None,
              early_stop: bool = True) -> None:
    """Run stage-1 trials in this process until the study has ``config.n_trials``
    (COMPLETE + PRUNED, all workers together) or this process ran ``worker_cap``."""
    import optuna

    study.sampler = _sampler(seed, config.space)
    window = "stage1" if evaluator.windows.staged else "train"
    objective = _make_objective(config, evaluator, window, early_stop)
    ran = 0

    def stop_when_done(st: "optuna.Study", _trial: "FrozenTrial") -> None:
        nonlocal ran
        ran += 1
        trials = st.get_trials(deepcopy=False)
        done = sum(t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
                   for t in trials)
        # Trials other workers are running count too, or each worker starts one more once
        # the last ones are under way (--workers 500 --trials 2 ran about 27).
        running = sum(t.state == optuna.trial.TrialState.RUNNING for t in trials)
        if bar is not None:
            bar.update(min(done, config.n_trials), best_so_far(trials, config.objectives))
        if (done + running >= config.n_trials
                or (worker_cap is not None and ran >= worker_cap)):
            st.stop()

    if _finished(study) >= config.n_trials or worker_cap == 0:
        return
    study.optimize(objective, callbacks=[stop_when_done], gc_after_trial=False)


def _worker_main(storage_url: str, study_name: str, config: StudyConfig, evaluator: Evaluator,
                 seed: int, early_stop: bool = True,
                 first: Callable[[], None] | None = None) -> None:
    """Entry of a forked stage-1 worker: its own storage connection, its own sampler;
    ``first`` (the baseline track) runs before its trials."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if first is not None:
        first()
    study = optuna.load_study(study_name=study_name, storage=open_storage(storage_url))
    _optimize(study, config, evaluator, worker_cap=None, seed=seed, early_stop=early_stop)


def _run_stage1(study: "optuna.Study", storage_url: str | None, config: StudyConfig,
                evaluator: Evaluator, workers: int, bar: Reporter,
                early_stop: bool = True, track: BaselineTrack | None = None) -> None:
    """Stage 1 in this process or ``workers`` forked ones; the last of those runs
    ``track`` (the baseline's replays, :mod:`tuner.tune.baseline_track`) first."""
    label = "stage 1" if evaluator.windows.staged else "search"
    bar.stage(label, config.n_trials, min(_finished(study), config.n_trials))
    if workers == 1 or storage_url is None:
        _optimize(study, config, evaluator, worker_cap=None, seed=config.seed, bar=bar,
                  early_stop=early_stop)
        return
    # Fork, not spawn: the evaluator (trace slices already in memory) is inherited, and the
    # parent's storage handle is never used by a child (each opens its own).
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_worker_main, name=f"tuner-worker-{i}",
                         args=(storage_url, study.study_name, config, evaluator, config.seed + i,
                               early_stop, track.run if track and i == workers - 1 else None))
             for i in range(workers)]
    for proc in procs:
        proc.start()
    try:
        while any(p.is_alive() for p in procs):
            time.sleep(0.5)
            if track is not None:
                track.poll()
            trials = study.get_trials(deepcopy=False)
            bar.update(min(_finished(study), config.n_trials), best_so_far(trials, config.objectives))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()
    failed = [p.name for p in procs if p.exitcode not in (0, None)]
    if failed:
        raise ConfigError(f"stage-1 worker(s) {', '.join(failed)} failed (exit code "
                          f"{[p.exitcode for p in procs]}); rerun with --workers 1 to see the error")
    bar.update(min(_finished(study), config.n_trials),
               best_so_far(study.get_trials(deepcopy=False), config.objectives))


def _stage1_points(study: "optuna.Study") -> list[Point]:
    from optuna.trial import TrialState

    points: dict[str, Point] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        settings = StudyRecords.settings(t)
        if settings is None:
            continue
        key = settings_key(settings)
        if key in points:  # the same point sampled twice: keep the first
            continue
        points[key] = Point(number=t.number, params={k: _round(v) for k, v in t.params.items()},
                            settings=settings,
                            metrics=StudyRecords.metrics(t),
                            feasible=all(v <= 0 for v in t.constraints.values()),
                            is_baseline=StudyRecords.role(t) == StudyRecords.BASELINE,
                            extra={"role": StudyRecords.role(t)})
    return list(points.values())
