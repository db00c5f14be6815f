"""Every record tuner keeps in its Optuna studies, written and read back in one place.

A tuning run keeps two studies in one storage (journal file or database):

* ``NAME`` (stage 1): one trial per sampled point. Study user attr ``tuner`` holds the
  :class:`StudyConfig` (a joiner rebuilds the search from it). Trial user attrs: ``role``
  (``baseline`` / ``warm-start-profile`` / ``warm-start-pareto``; absent for a sampled
  point), ``warm_start`` (the warm-start profile's name), ``host`` and ``pid`` (the worker
  running it, so a rerun can fail a dead worker's trial), ``refused`` (why vLLM would
  reject the point; the trial is PRUNED), ``stopped`` (the replay proved a constraint
  violated and stopped, :mod:`tuner.tune.early_stop`; PRUNED, ``settings`` but no
  ``metrics``, the violation's lower bound as its constraint), ``settings`` and
  ``metrics`` (the replay; a
  study that searches the deployment keeps it in ``settings["deployment"]``, see
  :func:`tuner.tune.deployment_space.join_settings`, and per-engine summaries in
  ``metrics["engines"]``).
* ``NAME.full`` (stage 2): one trial per survivor replayed on the whole training window.
  Trial user attrs: ``key`` (:func:`settings_key`), ``settings``, ``params``, ``metrics``,
  ``stage1_trial``, ``role`` (``baseline`` / ``survivor``). Study user attrs
  ``holdout:<key>`` hold each point's held-out replay.

:mod:`tuner.tune.study` and :mod:`tuner.tune.survivors` write these through
:class:`StudyRecords`; :mod:`tuner.report.study_data` reads them back through it. Only
public Optuna API is used (a dead worker's trial is failed with ``Study.tell``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner import __version__
from tuner.sim.settings import SchedulerSettings
from tuner.tune.objectives import Constraint, Objective, parse_constraints, parse_objectives
from tuner.tune.select import Point
from tuner.tune.space import SearchSpace, space_from_dict

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial


def settings_key(settings: SchedulerSettings | dict[str, Any]) -> str:
    """The identity of a point across studies and resumed runs (its settings as JSON)."""
    data = settings.to_dict() if isinstance(settings, SchedulerSettings) else settings
    return json.dumps(data, sort_keys=True)


@dataclass(frozen=True, slots=True)
class StudyConfig:
    """What defines a study; stored in its user attrs so a joiner can rebuild it."""

    space: SearchSpace
    objectives: tuple[Objective, ...]
    constraints: tuple[Constraint, ...]
    n_trials: int  # stage-1 trials in total (COMPLETE + PRUNED), all workers together
    seed: int
    evaluator: dict[str, Any]  # Evaluator.spec()

    def to_attrs(self) -> dict[str, Any]:
        return {"space": self.space.to_dict(), "objectives": [str(o) for o in self.objectives],
                "constraints": [str(c) for c in self.constraints], "n_trials": self.n_trials,
                "seed": self.seed, "evaluator": self.evaluator, "tool_version": __version__}

    @classmethod
    def from_attrs(cls, data: dict[str, Any]) -> "StudyConfig":
        return cls(space=space_from_dict(data["space"], source="study attrs"),
                   objectives=parse_objectives(data["objectives"]),
                   constraints=parse_constraints(data["constraints"]),
                   n_trials=int(data["n_trials"]), seed=int(data["seed"]),
                   evaluator=data["evaluator"])

    def same_search(self, other: "StudyConfig") -> str | None:
        """Why ``other`` cannot continue this study, or None when it can."""
        if self.space.to_dict() != other.space.to_dict():
            return "a different search space"
        if self.objectives != other.objectives:
            return "different objectives"
        if self.constraints != other.constraints:
            return "different constraints"
        mine = self.evaluator.get("trace_fingerprint")
        theirs = other.evaluator.get("trace_fingerprint")
        if mine != theirs:
            return "a different trace (fingerprint)"
        if self.evaluator.get("target") != other.evaluator.get("target"):
            return "a different target"
        if self.evaluator.get("windows") != other.evaluator.get("windows"):
            return "different windows (--holdout / stage1 fraction)"
        for key, what in (("baseline", "a different baseline (--baseline / --set)"),
                          ("slo_ms", "different SLOs (--slo)"),
                          ("router", "a different baseline router (--router)")):
            # studies made before these keys existed ran vLLM's defaults and no SLO
            if key in self.evaluator and key in other.evaluator \
                    and self.evaluator[key] != other.evaluator[key]:
                return what
        return None


class StudyRecords:
    """The keys (class attributes) and the writers and readers of tuner's study records."""

    CONFIG = "tuner"  # stage-1 study attr: StudyConfig.to_attrs()
    STAGE2_SUFFIX = ".full"  # the stage-2 study's name is the stage-1 name plus this
    HOLDOUT_PREFIX = "holdout:"  # stage-2 study attr per point: held-out metrics
    ROLE, WARM_START, HOST, PID = "role", "warm_start", "host", "pid"
    BASELINE_TRACK = "baseline_track_worker"  # study attr: the worker that ran the track
    REFUSED, SETTINGS, METRICS = "refused", "settings", "metrics"
    STOPPED = "stopped"  # why the replay stopped early (the trial is PRUNED)
    SURPLUS = "surplus"  # a trial begun past the budget by a racing worker (FAIL, not run)
    KEY, PARAMS, STAGE1_TRIAL = "key", "params", "stage1_trial"
    BASELINE, SURVIVOR = "baseline", "survivor"  # roles

    # ------------------------------------------------------------------ names
    @classmethod
    def stage2_name(cls, study_name: str) -> str:
        return study_name + cls.STAGE2_SUFFIX

    @classmethod
    def is_stage2_name(cls, study_name: str) -> bool:
        return study_name.endswith(cls.STAGE2_SUFFIX)

    # ------------------------------------------------------------------ study config
    @classmethod
    def config_attrs(cls, study: "optuna.Study") -> dict[str, Any] | None:
        """The stored :meth:`StudyConfig.to_attrs`, or None for a study tuner did not make."""
        return study.user_attrs.get(cls.CONFIG)

    @classmethod
    def write_config(cls, study: "optuna.Study", attrs: dict[str, Any]) -> None:
        study.set_user_attr(cls.CONFIG, attrs)

    # ------------------------------------------------------------------ stage-1 trials
    @classmethod
    def start_attrs(cls, role: str, warm_start: str | None = None) -> dict[str, Any]:
        """User attrs of an enqueued start point (the baseline or a warm-start point)."""
        attrs: dict[str, Any] = {cls.ROLE: role}
        if warm_start is not None:
            attrs[cls.WARM_START] = warm_start
        return attrs

    @classmethod
    def mark_worker(cls, trial: "optuna.Trial", host: str, pid: int) -> None:
        trial.set_user_attr(cls.HOST, host)
        trial.set_user_attr(cls.PID, pid)

    @classmethod
    def mark_baseline_track(cls, study: "optuna.Study", host: str, pid: int) -> None:
        """Which worker ran the baseline track (``tuner.tune.baseline_track``): a worker
        busy with it may run no stage-1 trial at all, yet took part in the study."""
        study.set_user_attr(cls.BASELINE_TRACK, {cls.HOST: host, cls.PID: pid})

    @classmethod
    def baseline_track_worker(cls, study: "optuna.Study") -> tuple[str | None, int | None]:
        """(host, pid) of the worker that ran the baseline track; (None, None) if none did."""
        worker = study.user_attrs.get(cls.BASELINE_TRACK) or {}
        return worker.get(cls.HOST), worker.get(cls.PID)

    @classmethod
    def worker(cls, trial: "FrozenTrial") -> tuple[str | None, int | None]:
        """(host, pid) of the worker that ran ``trial``; (None, None) if never recorded."""
        return trial.user_attrs.get(cls.HOST), trial.user_attrs.get(cls.PID)

    @classmethod
    def refuse(cls, trial: "optuna.Trial", reason: str) -> None:
        trial.set_user_attr(cls.REFUSED, reason)

    @classmethod
    def record_replay(cls, trial: "optuna.Trial", settings: dict[str, Any],
                      metrics: dict[str, Any]) -> None:
        trial.set_user_attr(cls.SETTINGS, settings)
        trial.set_user_attr(cls.METRICS, metrics)

    @classmethod
    def record_stopped(cls, trial: "optuna.Trial", settings: dict[str, Any],
                       reason: str) -> None:
        """A replay stopped once it proved a constraint violated (tuner.tune.early_stop):
        its settings and why, no metrics (the replay did not finish)."""
        trial.set_user_attr(cls.SETTINGS, settings)
        trial.set_user_attr(cls.STOPPED, reason)

    @classmethod
    def mark_surplus(cls, trial: "optuna.Trial") -> None:
        trial.set_user_attr(cls.SURPLUS, True)

    @classmethod
    def surplus(cls, trial: "FrozenTrial") -> bool:
        return bool(trial.user_attrs.get(cls.SURPLUS))

    @classmethod
    def stopped(cls, trial: "FrozenTrial") -> str | None:
        return trial.user_attrs.get(cls.STOPPED)

    @classmethod
    def role(cls, trial: "FrozenTrial") -> str | None:
        return trial.user_attrs.get(cls.ROLE)

    @classmethod
    def refused(cls, trial: "FrozenTrial") -> str | None:
        return trial.user_attrs.get(cls.REFUSED)

    @classmethod
    def settings(cls, trial: "FrozenTrial") -> dict[str, Any] | None:
        return trial.user_attrs.get(cls.SETTINGS)

    @classmethod
    def metrics(cls, trial: "FrozenTrial") -> dict[str, Any]:
        return trial.user_attrs.get(cls.METRICS, {})

    @staticmethod
    def fail_trial(study: "optuna.Study", trial: "FrozenTrial") -> None:
        """Mark another process's RUNNING trial failed (public ``Study.tell``)."""
        from optuna.trial import TrialState

        study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)

    # ------------------------------------------------------------------ stage 2
    @classmethod
    def stage2_attrs(cls, p: Point) -> dict[str, Any]:
        """User attrs of the stage-2 trial recording point ``p``."""
        return {cls.KEY: settings_key(p.settings), cls.SETTINGS: p.settings,
                cls.PARAMS: p.params, cls.METRICS: p.metrics, cls.STAGE1_TRIAL: p.number,
                cls.ROLE: cls.BASELINE if p.is_baseline else cls.SURVIVOR}

    @classmethod
    def stage2_key(cls, trial: "FrozenTrial") -> str:
        a = trial.user_attrs
        return a[cls.KEY] if cls.KEY in a else settings_key(a.get(cls.SETTINGS, {}))

    @classmethod
    def stage2_trials(cls, study2: "optuna.Study") -> dict[str, "FrozenTrial"]:
        """settings_key -> the COMPLETE stage-2 trial: every training-window replay
        stored so far (what stage 2 and the baseline track look up before replaying)."""
        from optuna.trial import TrialState

        return {cls.stage2_key(t): t
                for t in study2.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}

    @classmethod
    def stage2_point(cls, trial: "FrozenTrial",
                     holdouts: dict[str, dict[str, Any]] | None = None) -> Point:
        """The :class:`Point` a stage-2 trial records (feasible from its constraints)."""
        a = trial.user_attrs
        return Point(number=int(a.get(cls.STAGE1_TRIAL, -1)), params=a.get(cls.PARAMS, {}),
                     settings=a.get(cls.SETTINGS, {}), metrics=a.get(cls.METRICS, {}),
                     feasible=all(v <= 0 for v in (trial.constraints or {}).values()),
                     is_baseline=a.get(cls.ROLE) == cls.BASELINE,
                     holdout=(holdouts or {}).get(cls.stage2_key(trial)))

    # ------------------------------------------------------------------ held-out window
    @classmethod
    def holdouts(cls, study2: "optuna.Study") -> dict[str, dict[str, Any]]:
        """settings_key -> held-out metrics, for every point replayed on the held-out window."""
        n = len(cls.HOLDOUT_PREFIX)
        return {k[n:]: v for k, v in study2.user_attrs.items() if k.startswith(cls.HOLDOUT_PREFIX)}

    @classmethod
    def write_holdout(cls, study2: "optuna.Study", settings: dict[str, Any],
                      metrics: dict[str, Any]) -> None:
        study2.set_user_attr(cls.HOLDOUT_PREFIX + settings_key(settings), metrics)


__all__ = ["StudyConfig", "StudyRecords", "settings_key"]
