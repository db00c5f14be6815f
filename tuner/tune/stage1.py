"""Stage 1 of a study: the screening trials, in this process or in forked workers.

Split from :mod:`tuner.tune.study`, which drives the stages: this module is what runs the
stage-1 Optuna study's trials. One trial (:func:`_make_objective`) replays a point on the
stage-1 window (the training window when unstaged), with the early stop of
:mod:`tuner.tune.early_stop`, and records it through
:class:`~tuner.tune.study_records.StudyRecords`. :func:`run_trials` runs trials in this
process until the study has its budget; :func:`run_stage1` runs them here or in
``workers`` forked processes that share the study's storage (each with its own
connection and sampler seed; the last one runs the baseline track first,
:mod:`tuner.tune.baseline_track`); a joiner (``tuner tune --join``,
:func:`tuner.tune.study.join`) calls :func:`run_trials` from another process or machine.
:func:`stage1_points` reads the finished trials back for the survivors' pick.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import socket
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from tuner.errors import ConfigError
from tuner.progress import Reporter
from tuner.tune.deployment_space import (base_deployment_of, deployment_for, evaluate_point,
                                         join_settings)
from tuner.tune.early_stop import ReplayStopped, stop_rules
from tuner.tune.evaluate import Evaluator
from tuner.tune.objectives import best_so_far
from tuner.tune.select import Point
from tuner.tune.space import SearchSpace
from tuner.tune.storage import SurplusTrial, open_storage
from tuner.tune.study_records import StudyConfig, StudyRecords, settings_key

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.tune.baseline_track import BaselineTrack


def stage1_sampler(seed: int,
                   space: SearchSpace | None = None) -> "optuna.samplers.BaseSampler":
    """The stage-1 study's sampler: given when the study is created and again to each
    worker with its own seed (a sampler is not stored with the study)."""
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


def finished_trials(study: "optuna.Study") -> int:
    """Stage-1 trials that count towards the budget: COMPLETE and PRUNED (stopped and
    refused points are answers too; FAILED ones are not)."""
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def _is_surplus(trial: "optuna.Trial", n_trials: int) -> bool:
    """A trial with ``n_trials`` live trials (not FAILED) numbered before it is surplus."""
    from optuna.trial import TrialState

    before = sum(1 for t in trial.study.get_trials(deepcopy=False)
                 if t.number < trial.number and t.state != TrialState.FAIL)
    return before >= n_trials


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
        if _is_surplus(trial, config.n_trials):
            StudyRecords.mark_surplus(trial)
            raise SurplusTrial(f"trial {trial.number} is past the budget of {config.n_trials}")
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


def run_trials(study: "optuna.Study", config: StudyConfig, evaluator: Evaluator, *,
               worker_cap: int | None, seed: int, bar: Reporter | None = None,
               early_stop: bool = True) -> None:
    """Run stage-1 trials in this process until the study has ``config.n_trials``
    (COMPLETE + PRUNED, all workers together) or this process ran ``worker_cap``."""
    import optuna

    study.sampler = stage1_sampler(seed, config.space)
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

    if finished_trials(study) >= config.n_trials or worker_cap == 0:
        return
    study.optimize(objective, callbacks=[stop_when_done], gc_after_trial=False,
                   catch=(SurplusTrial,))


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
    run_trials(study, config, evaluator, worker_cap=None, seed=seed, early_stop=early_stop)


def run_stage1(study: "optuna.Study", storage_url: str | None, config: StudyConfig,
               evaluator: Evaluator, workers: int, bar: Reporter,
               early_stop: bool = True, track: BaselineTrack | None = None) -> None:
    """Stage 1 in this process or ``workers`` forked ones; the last of those runs
    ``track`` (the baseline's replays, :mod:`tuner.tune.baseline_track`) first."""
    label = "stage 1" if evaluator.windows.staged else "search"
    bar.stage(label, config.n_trials, min(finished_trials(study), config.n_trials))
    if workers == 1 or storage_url is None:
        run_trials(study, config, evaluator, worker_cap=None, seed=config.seed, bar=bar,
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
            bar.update(min(finished_trials(study), config.n_trials),
                       best_so_far(trials, config.objectives))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()
    failed = [p.name for p in procs if p.exitcode not in (0, None)]
    if failed:
        raise ConfigError(f"stage-1 worker(s) {', '.join(failed)} failed (exit code "
                          f"{[p.exitcode for p in procs]}); rerun with --workers 1 to see the error")
    bar.update(min(finished_trials(study), config.n_trials),
               best_so_far(study.get_trials(deepcopy=False), config.objectives))


def stage1_points(study: "optuna.Study") -> list[Point]:
    """The COMPLETE stage-1 trials as points, one per distinct settings (the first trial
    of each): what the survivors are picked from."""
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


__all__ = ["finished_trials", "run_stage1", "run_trials", "stage1_points", "stage1_sampler"]
