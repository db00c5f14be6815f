"""Stages 2 and 3 of a study: the survivors of stage 1 replayed on the whole training
window, then the stage-2 Pareto front and the baseline on the held-out window.

Split from :mod:`tuner.tune.study` (which drives the stages). Both stages store every
replay in the stage-2 study ``<study>.full`` keyed by :func:`settings_key`
(:class:`~tuner.tune.study_records.StudyRecords` owns the keys), so a resumed run replays
only what is missing; both fan replays out over a forked process pool
(:func:`evaluate_many`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

from tuner.processes import forked_pool
from tuner.progress import Reporter
from tuner.sim.settings import SchedulerSettings
from tuner.tune.deployment_space import (base_deployment_of, evaluate_point, join_settings,
                                         split_settings)
from tuner.tune.evaluate import Evaluator
from tuner.tune.objectives import Objective
from tuner.tune.select import Point, pareto_front
from tuner.tune.study_records import StudyConfig, StudyRecords, settings_key

if TYPE_CHECKING:
    import optuna

    from tuner.perf.deployment import Deployment

#: The stage-2 study is the stage-1 study's name plus this suffix.
STAGE2_SUFFIX = StudyRecords.STAGE2_SUFFIX


def pick_survivors(points: Sequence[Point], objectives: Sequence[Objective], n: int,
                   baseline_key: str) -> list[Point]:
    """The best ``n`` stage-1 points by non-dominated rank (feasible first), plus the
    whole first front even if it is larger (capped at 2n)."""
    remaining = [p for p in points if p.feasible]
    chosen: list[Point] = []
    while remaining and len(chosen) < n:
        front = pareto_front(remaining, objectives)
        if not front:
            break
        room = max(n - len(chosen), 0) if chosen else 2 * n
        chosen += front[:room]
        ids = {id(p) for p in front}
        remaining = [p for p in remaining if id(p) not in ids]
    return [p for p in chosen if settings_key(p.settings) != baseline_key]


# --------------------------------------------------------------------------- stages 2 and 3

_POOL_EVALUATOR: Evaluator | None = None  # set in the parent before forking a Pool
#: what a pool worker calls with the evaluator and one job (set with the evaluator)
_POOL_FN: Callable[..., dict[str, Any]] = evaluate_point

#: One replay of a stored point: its scheduler settings, its deployment (None: the
#: evaluator's own) and the window.
Job = tuple[SchedulerSettings, "Deployment | None", str]


def _job(settings: dict[str, Any], window: str) -> Job:
    """A stored point's settings dict (the study's record form) read once into the two
    objects a replay takes."""
    scheduler, deployment = split_settings(settings)
    return scheduler, deployment, window


def _pool_eval(job: tuple[Any, ...]) -> dict[str, Any]:
    assert _POOL_EVALUATOR is not None, "tuner bug: pool evaluator not set before fork"
    return _POOL_FN(_POOL_EVALUATOR, *job)


def evaluate_many(evaluator: Evaluator, jobs: Sequence[tuple[Any, ...]], workers: int,
                  on_done: Callable[[int, dict[str, Any]], None],
                  evaluate: Callable[..., dict[str, Any]] = evaluate_point) -> None:
    """Evaluate ``jobs`` (``evaluate(evaluator, *job)`` each; by default one stored
    point's replay), calling ``on_done(i, metrics)`` in the parent as each finishes (so
    every result is stored before the next one). Stages 2 and 3 and the robust check's
    clock variants (:mod:`tuner.tune.robust`) share this pool."""
    global _POOL_EVALUATOR, _POOL_FN
    if workers <= 1 or len(jobs) <= 1:
        for i, job in enumerate(jobs):
            on_done(i, evaluate(evaluator, *job))
        return
    _POOL_EVALUATOR, _POOL_FN = evaluator, evaluate
    try:
        with forked_pool(min(workers, len(jobs))) as pool:
            for i, metrics in enumerate(pool.imap(_pool_eval, jobs)):
                on_done(i, metrics)
    finally:
        _POOL_EVALUATOR, _POOL_FN = None, evaluate_point



def baseline_point(config: StudyConfig, evaluator: Evaluator, number: int = -1) -> Point:
    """The baseline as stage 2 replays it: the evaluator's default settings (and, in a
    space that searches the deployment, its deployment), no metrics yet."""
    base_deployment = base_deployment_of(evaluator) if config.space.has_deployment else None
    return Point(number=number,
                 params=config.space.project(evaluator.default_settings, base_deployment),
                 settings=join_settings(evaluator.default_settings, base_deployment),
                 metrics={}, is_baseline=True)


def open_stage2(storage: Any, study_name: str, config: StudyConfig) -> "optuna.Study":
    """The stage-2 study ``<study>.full``, created on first use."""
    import optuna

    return optuna.create_study(storage=storage, study_name=StudyRecords.stage2_name(study_name),
                               load_if_exists=True,
                               directions=[o.direction for o in config.objectives])


def run_stage2(storage: Any, study_name: str, config: StudyConfig, evaluator: Evaluator,
                survivors: list[Point], stage1: list[Point], workers: int,
                bar: Reporter) -> list[Point]:
    """Replay the survivors and the baseline on the whole training window (stage 2).

    Results are trials of ``<study>.full`` (no params; settings and metrics in user attrs),
    so a resumed run replays only what is missing. Without staging, stage-1 metrics are
    already on the training window and are reused.
    """
    study2 = open_stage2(storage, study_name, config)
    done = StudyRecords.stage2_trials(study2)
    by_key = {settings_key(p.settings): p for p in stage1}
    base = baseline_point(config, evaluator)
    base_stage1 = by_key.get(settings_key(base.settings))
    base.number = base_stage1.number if base_stage1 else -1
    todo: list[Point] = [base] + survivors
    results: list[Point | None] = [None] * len(todo)
    jobs: list[tuple[int, dict[str, Any]]] = []
    for i, p in enumerate(todo):
        key = settings_key(p.settings)
        trial = done.get(key)
        if trial is not None:
            results[i] = _point_from_stage2(p, StudyRecords.metrics(trial), config)
        elif not evaluator.windows.staged and key in by_key:
            # Unstaged: stage 1 already replayed the whole training window.
            results[i] = _point_from_stage2(p, by_key[key].metrics, config)
            record_stage2(study2, config, results[i])  # type: ignore[arg-type]
        else:
            jobs.append((i, p.settings))
    bar.stage("stage 2", len(todo), len(todo) - len(jobs))

    def store(j: int, metrics: dict[str, Any]) -> None:
        i = jobs[j][0]
        results[i] = _point_from_stage2(todo[i], metrics, config)
        record_stage2(study2, config, results[i])  # type: ignore[arg-type]
        bar.update(sum(r is not None for r in results))

    evaluate_many(evaluator, [_job(s, "train") for _, s in jobs], workers, store)
    return [r for r in results if r is not None]


def _point_from_stage2(p: Point, metrics: dict[str, Any], config: StudyConfig) -> Point:
    feasible = all(c.violation(metrics) <= 0 for c in config.constraints)
    return Point(number=p.number, params=p.params, settings=p.settings, metrics=metrics,
                 feasible=feasible, is_baseline=p.is_baseline, extra=dict(p.extra))


def record_stage2(study2: "optuna.Study", config: StudyConfig, p: Point) -> None:
    """Store ``p``'s training-window replay as a trial of the stage-2 study (what a
    resumed run, or stage 2 after the baseline track, reuses)."""
    from optuna.trial import TrialState, create_trial

    values = [p.value(o) for o in config.objectives]
    ok = all(math.isfinite(v) for v in values)
    study2.add_trial(create_trial(
        state=TrialState.COMPLETE if ok else TrialState.FAIL, values=values if ok else None,
        constraints={str(c): c.violation(p.metrics) for c in config.constraints} or None,
        user_attrs=StudyRecords.stage2_attrs(p)))


def run_holdout(storage: Any, study_name: str, evaluator: Evaluator, points: list[Point],
                 workers: int) -> None:
    """Fill ``point.holdout`` (replays stored in the stage-2 study's user attrs)."""
    import optuna

    if not evaluator.windows.has_holdout:
        return
    study2 = optuna.load_study(study_name=StudyRecords.stage2_name(study_name), storage=storage)
    stored = StudyRecords.holdouts(study2)
    jobs: list[Point] = []
    for p in points:
        key = settings_key(p.settings)
        if key in stored:
            p.holdout = stored[key]
        elif all(q is not p for q in jobs):
            jobs.append(p)

    def store(j: int, metrics: dict[str, Any]) -> None:
        jobs[j].holdout = metrics
        StudyRecords.write_holdout(study2, jobs[j].settings, metrics)
        stored[settings_key(jobs[j].settings)] = metrics

    evaluate_many(evaluator, [_job(p.settings, "holdout") for p in jobs], workers, store)
    for p in points:  # the same settings may appear as two Point objects
        if p.holdout is None:
            p.holdout = stored.get(settings_key(p.settings))
