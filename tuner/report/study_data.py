"""What a study report reads: the study's trials, its stage-2 points, the profile.

Sources, most to least complete:

1. the Optuna storage (``tuner tune`` writes stage-1 trials to study ``NAME`` and the
   stage-2/held-out replays to ``NAME.full``; every key is read back through
   :class:`tuner.tune.study_records.StudyRecords`, which wrote it);
2. the profile alone (``predicted`` and ``pareto`` sections), when the storage is gone.

:func:`load_report_data` finds the storage for a profile the way ``tuner tune`` placed it:
``--storage`` when given, else the journal named in the profile's provenance, else the
journal next to the profile (``profiles/NAME.optuna-journal``).
"""

from __future__ import annotations

import math
import os
import pathlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.errors import ConfigError, StudyNotFound
from tuner.tune import (Objective, Point, default_journal_path, open_storage, pareto_front,
                        parse_objectives, redact_url, select)
from tuner.tune.storage import journal_path, quiet_optuna
from tuner.tune.deployment_space import DEPLOYMENT_KEY, join_settings
from tuner.tune.study_records import StudyRecords, settings_key

if TYPE_CHECKING:
    import optuna

    from tuner.profile import Profile


@dataclass(frozen=True, slots=True)
class TrialRow:
    """One stage-1 trial as the report shows it."""

    number: int
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    values: tuple[float, ...] | None  # objective values on the stage-1 window
    params: dict[str, Any]
    role: str | None  # baseline, warm-start-*, or None for a sampled trial
    feasible: bool
    refused: str | None  # why vLLM would reject it (never replayed)


@dataclass(slots=True)
class ReportData:
    """Everything a study report shows; fields are None where the source lacks them."""

    title: str
    objectives: tuple[Objective, ...]
    study_name: str | None = None
    storage: str | None = None  # redacted
    config: dict[str, Any] | None = None  # the StudyConfig attrs
    trials: list[TrialRow] = field(default_factory=list)
    stage2: list[Point] = field(default_factory=list)  # training window (+ holdout)
    baseline: Point | None = None
    chosen: Point | None = None
    rule: str = ""
    reason: str = ""
    profile: "Profile | None" = None
    study: "optuna.Study | None" = None  # stage-1 study, for parameter importance
    notes: list[str] = field(default_factory=list)
    importance_method: str = ""  # set by the importance section (fANOVA or PED-ANOVA)

    @property
    def front(self) -> list[Point]:
        return pareto_front(self.stage2, self.objectives) if self.stage2 else []

    @property
    def evaluator_spec(self) -> dict[str, Any]:
        if self.config and isinstance(self.config.get("evaluator"), dict):
            return self.config["evaluator"]
        return {}


def find_study_storage(profile_path: pathlib.Path | None, profile: "Profile | None",
                       storage: str | None) -> str | None:
    """The storage of a profile's study: ``storage`` if given, else the journal named in
    the profile's provenance (as written, or beside the profile), else the journal next to
    the profile; None when none of them exists."""
    if storage is not None:
        return storage
    if profile is None or profile_path is None:
        return None
    stored = (profile.provenance.get("study") or {}).get("storage")
    candidates: list[pathlib.Path] = []
    if isinstance(stored, str) and journal_path(stored) is not None:
        p = journal_path(stored)
        assert p is not None
        candidates += [p, profile_path.parent / p.name]
    candidates.append(default_journal_path(profile_path))
    for c in candidates:
        if c.is_file():
            return str(c)
    return None


def _study_names(storage_obj: Any) -> list[str]:
    import optuna

    return [n for n in optuna.get_all_study_names(storage_obj)
            if not StudyRecords.is_stage2_name(n)]


def load_report_data(*, profile: str | os.PathLike[str] | None = None, study: str | None = None,
                     storage: str | None = None) -> ReportData:
    """Gather a report's data from a profile and/or a study.

    Args:
        profile: a profile YAML path (its provenance names the study and storage).
        study: a study name (needed without a profile when the storage holds several).
        storage: a database URL or journal path; overrides the profile's.

    Raises:
        ConfigError: neither a profile nor a storage, or several studies and no name.
        StudyNotFound: the named study is not in the storage.
        ProfileError: the profile is invalid.
    """
    from tuner.profile import load_profile

    prof = load_profile(profile) if profile is not None else None
    ppath = pathlib.Path(profile) if profile is not None else None
    url = find_study_storage(ppath, prof, storage)
    if prof is None and url is None:
        raise ConfigError("a study report needs a profile or --storage (the study's database "
                          "URL or journal file)")
    notes: list[str] = []
    name = study or ((prof.provenance.get("study") or {}).get("name") if prof else None)
    if url is None:
        notes.append("The study's storage was not found (no --storage, no journal next to the "
                      "profile): trial history, parameter importance and the stage-1 cloud are "
                      "missing; the Pareto set and metrics come from the profile.")
        return _from_profile_only(prof, notes)  # type: ignore[arg-type]
    import optuna

    with quiet_optuna():
        storage_obj = open_storage(url)
        if name is None:
            names = _study_names(storage_obj)
            if len(names) != 1:
                raise ConfigError(f"{redact_url(url)} holds {len(names)} studies "
                                  f"({', '.join(names) or 'none'}); name one with --study")
            name = names[0]
        try:
            st = optuna.load_study(study_name=name, storage=storage_obj)
        except KeyError:
            raise StudyNotFound(f"no study {name!r} in {redact_url(url)}; existing: "
                                f"{', '.join(_study_names(storage_obj)) or 'none'}") from None
        try:
            st2 = optuna.load_study(study_name=StudyRecords.stage2_name(name), storage=storage_obj)
        except KeyError:
            st2 = None
        data = _from_study(st, st2, prof, notes)
    data.storage = redact_url(url)
    return data


def _objectives(config: dict[str, Any] | None, prof: "Profile | None") -> tuple[Objective, ...]:
    if config and config.get("objectives"):
        return parse_objectives(config["objectives"])
    if prof is not None and prof.predicted.get("objectives"):
        return parse_objectives(prof.predicted["objectives"])
    return parse_objectives(None)


def _from_study(st: "optuna.Study", st2: "optuna.Study | None", prof: "Profile | None",
                notes: list[str]) -> ReportData:
    from optuna.trial import TrialState

    config = StudyRecords.config_attrs(st)
    if config is None:
        notes.append(f"Study {st.study_name!r} was not created by `tuner tune`; objectives are "
                     "assumed to be the defaults.")
    objectives = _objectives(config, prof)
    rows = []
    for t in st.get_trials(deepcopy=False):
        if StudyRecords.surplus(t):  # begun past the budget by a racing worker, never run
            continue
        rows.append(TrialRow(
            number=t.number, state=t.state.name,
            values=tuple(t.values) if t.values is not None else None,
            params=dict(t.params), role=StudyRecords.role(t),
            feasible=all(v <= 0 for v in (t.constraints or {}).values()),
            refused=StudyRecords.refused(t)))
    stage2: list[Point] = []
    if st2 is not None:
        held = StudyRecords.holdouts(st2)
        stage2 = [StudyRecords.stage2_point(t, held)
                  for t in st2.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    else:
        notes.append("The stage-2 study (training-window replays) is missing: the tuning run "
                     "did not reach stage 2; the Pareto chart is empty.")
    data = ReportData(title=f"Study report: {st.study_name}", objectives=objectives,
                      study_name=st.study_name, config=config, trials=rows, stage2=stage2,
                      profile=prof, study=st, notes=notes)
    data.baseline = next((p for p in stage2 if p.is_baseline), None)
    _choose(data)
    return data


def _choose(data: ReportData) -> None:
    """The chosen point: the profile's settings if given, else the selection rule."""
    if data.baseline is None:
        return
    prof = data.profile
    if prof is not None:
        searched = any(DEPLOYMENT_KEY in p.settings for p in data.stage2)
        want = settings_key(join_settings(prof.scheduler, prof.deployment())
                            if searched else prof.scheduler.to_dict())
        match = next((p for p in data.stage2 if settings_key(p.settings) == want), None)
        sel = prof.predicted.get("selection") or {}
        data.rule, data.reason = str(sel.get("rule", "")), str(sel.get("reason", ""))
        if match is not None:
            data.chosen = match
            return
        data.notes.append("The profile's settings are not among the study's stage-2 points; "
                          "the chosen point is re-derived by the selection rule.")
    prefer = ((prof.predicted.get("selection") or {}).get("prefer") if prof else None) or \
        "throughput"
    selection = select(data.front, data.baseline, data.objectives, prefer)
    data.chosen = selection.point
    data.rule, data.reason = data.rule or selection.rule, data.reason or selection.reason


def _from_profile_only(prof: "Profile", notes: list[str]) -> ReportData:
    objectives = _objectives(None, prof)
    pred = prof.predicted
    train = pred.get("train") or {}
    hold = pred.get("holdout") or {}
    points = []
    for i, p in enumerate(prof.pareto):
        metrics = {k: v for k, v in (p.get("train") or {}).items()}
        points.append(Point(number=int(p.get("trial") if p.get("trial") is not None else i),
                            params=p.get("params") or {}, settings=p.get("settings") or {},
                            metrics=metrics, holdout=p.get("holdout")))
    base = Point(number=-1, params={}, settings={}, metrics=dict(train.get("baseline") or {}),
                 is_baseline=True, holdout=dict(hold.get("baseline") or {}) or None)
    chosen = Point(number=int((pred.get("selection") or {}).get("stage1_trial") or -1),
                   params={}, settings=prof.scheduler.to_dict(),
                   metrics=dict(train.get("tuned") or {}),
                   is_baseline=bool((pred.get("selection") or {}).get("is_baseline")),
                   holdout=dict(hold.get("tuned") or {}) or None)
    sel = pred.get("selection") or {}
    return ReportData(title=f"Profile report: {prof.name}", objectives=objectives,
                      study_name=(prof.provenance.get("study") or {}).get("name"),
                      stage2=points + [base] if train.get("baseline") else points,
                      baseline=base if train.get("baseline") else None, chosen=chosen,
                      rule=str(sel.get("rule", "")), reason=str(sel.get("reason", "")),
                      profile=prof, notes=notes)


def finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
