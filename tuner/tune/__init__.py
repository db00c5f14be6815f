"""Optuna search over vLLM scheduler settings (stage ``tune``: after ``metrics``).

Public API (the four argument objects are documented in :mod:`tuner.tune.options`)::

    result = tuner.tune.tune(
        TuneInputs("trace.parquet", target=Target(hardware="mi355x", model="llama-3.1-70b",
                                                  tp=8)),
        SearchOptions(n_trials=200))
    profile = tuner.profile.profile_of(result, "agentic")  # the profile stage builds it
    tuner.tune.join("agentic", "postgresql://tuner@db/tuner", n_trials=50)

See ``docs/tuning.md`` for the stages, the selection rule and parallel studies.
"""

from __future__ import annotations

from tuner.tune.evaluate import Evaluator, ReplayEvaluator, Windows
from tuner.tune.objectives import (DEFAULT_OBJECTIVES, Constraint, Objective, parse_constraints,
                                   parse_objectives)
from tuner.tune.options import (DeploymentSearch, SearchOptions, StartPoint, StudyOutput,
                                TuneInputs, WarmStart)
from tuner.tune.result import TuneResult
from tuner.tune.select import PREFER_CHOICES, Point, Selection, pareto_front, select
from tuner.tune.space import (BUILTIN_SPACES, Param, SearchSpace, admission_space, load_space,
                              scheduler_space)
from tuner.tune.storage import default_journal_path, open_storage, redact_url
from tuner.tune.study import StudyConfig, join, tune

__all__ = [
    "BUILTIN_SPACES", "Constraint", "DEFAULT_OBJECTIVES", "DeploymentSearch", "Evaluator",
    "Objective", "PREFER_CHOICES", "Param", "Point", "ReplayEvaluator", "SearchOptions",
    "SearchSpace", "Selection", "StartPoint", "StudyConfig", "StudyOutput", "TuneInputs",
    "TuneResult", "Windows", "WarmStart", "admission_space", "default_journal_path", "join",
    "load_space", "open_storage", "pareto_front", "parse_constraints", "parse_objectives",
    "redact_url", "scheduler_space", "select", "tune",
]
