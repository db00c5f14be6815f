"""Periodic re-tuning (stage ``jobs``: on top of ``tune`` and ``profile``).

Public API::

    config = tuner.jobs.load_config("retune.yaml")
    outcome = tuner.jobs.run_retune(config)        # outcome.exit_code: 0 / 3 / ...
    files = tuner.jobs.render(tuner.jobs.make_spec(every="6h", cron=None,
                              config="retune.yaml"), "systemd")

See docs/retune.md for the config keys, the decision rule, the commit order and the
exit codes.
"""

from __future__ import annotations

from tuner.durations import parse_duration
from tuner.jobs.config import RetuneConfig, load_config
from tuner.jobs.decide import BOOTSTRAP_OBJECTIVES, Comparison, compare_replays, decide
from tuner.jobs.diff import diff_profiles, resolve_profile_ref
from tuner.jobs.drift import compare as compare_drift
from tuner.jobs.drift import window_stats
from tuner.jobs.history import ProfileHistory
from tuner.jobs.lock import JobLock, JobLocked
from tuner.jobs.retune import (EXIT_CONFIG, EXIT_FAILED, EXIT_HOOK_FAILED, EXIT_KEPT,
                               EXIT_LOCKED, EXIT_PUBLISHED, RetuneOutcome, recover, run_retune)
from tuner.jobs.schedule import (ScheduleSpec, cron_to_oncalendar, cronjob_manifest,
                                 every_to_cron, make_spec, merge_crontab, render,
                                 systemd_units)
from tuner.jobs.state import JobState, SourceMark, load_state, save_state

__all__ = [
    "BOOTSTRAP_OBJECTIVES", "Comparison", "EXIT_CONFIG", "EXIT_FAILED", "EXIT_HOOK_FAILED",
    "EXIT_KEPT", "EXIT_LOCKED", "EXIT_PUBLISHED", "JobLock", "JobLocked", "JobState",
    "ProfileHistory", "RetuneConfig", "RetuneOutcome", "ScheduleSpec", "SourceMark",
    "compare_drift", "compare_replays", "cron_to_oncalendar", "cronjob_manifest", "decide",
    "diff_profiles", "every_to_cron", "load_config", "load_state", "make_spec",
    "merge_crontab", "parse_duration", "recover", "render", "resolve_profile_ref",
    "run_retune", "save_state", "systemd_units", "window_stats",
]
