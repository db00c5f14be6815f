"""The baseline's own replays, run beside stage 1 instead of after it.

Why: three of the study's late replays depend on nothing stage 1 finds: the baseline on
the whole training window (stage 2's first job), the baseline on the held-out window, and
the capacity search behind the overload report (:mod:`tuner.tune.overload`), which reads
only those two. Run after stage 1 they ran one after another while the other core idled
whenever no survivor was left to pair them with (the README's overloaded job: every
stage-1 point infeasible, so stage 2, the held-out check and the capacity report were
three serial replays, about a third of the tune's wall time). Run first, in one of the
``--workers`` processes while the others screen, they fill a core that stage 1 would
otherwise use, and that process then joins stage 1.

What changes: nothing the study decides. The replays are the same calls
(``evaluate_point`` on ``train`` and ``holdout``, :func:`overload_report` on their
metrics), stored where stage 2 and the held-out check look for them first (the stage-2
trial keyed by the baseline's settings, the ``holdout:<key>`` attr: what a resumed run
reuses), so those stages skip them; the overload report comes back over a pipe. The
track looks them up as those stages do (``StudyRecords.stage2_trials``; the held-out
replay is :func:`~tuner.tune.survivors.run_holdout` itself), so both always agree on
what is stored.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from tuner.tune.deployment_space import evaluate_point, split_settings
from tuner.tune.evaluate import Evaluator
from tuner.tune.overload import OverloadReport, overload_report
from tuner.tune.storage import open_storage
from tuner.tune.study_records import StudyConfig, StudyRecords, settings_key
from tuner.tune.survivors import baseline_point, open_stage2, record_stage2, run_holdout


@dataclass
class BaselineTrack:
    """The baseline's training-window and held-out replays and its capacity search, for
    one forked worker to run before its stage-1 trials (:meth:`run`); the parent reads
    the overload report with :meth:`report` after the workers are joined."""

    storage_url: str
    study_name: str
    config: StudyConfig
    evaluator: Evaluator
    _reader: Any = field(default=None, repr=False)
    _writer: Any = field(default=None, repr=False)
    _received: list[OverloadReport | None] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._reader, self._writer = multiprocessing.get_context("fork").Pipe(duplex=False)

    def run(self) -> None:
        """In the worker: replay what is not stored yet, store it, send the report."""
        import optuna

        evaluator, config = self.evaluator, self.config
        storage = open_storage(self.storage_url)
        study = optuna.load_study(study_name=self.study_name, storage=storage)
        StudyRecords.mark_baseline_track(study, socket.gethostname(), os.getpid())
        number = next((t.number for t in study.get_trials(deepcopy=False)
                       if StudyRecords.role(t) == StudyRecords.BASELINE), -1)
        base = baseline_point(config, evaluator, number)
        key = settings_key(base.settings)
        study2 = open_stage2(storage, self.study_name, config)
        stored = StudyRecords.stage2_trials(study2).get(key)
        if stored is not None:
            base.metrics = StudyRecords.metrics(stored)
        else:
            scheduler, deployment = split_settings(base.settings)
            base.metrics = evaluate_point(evaluator, scheduler, deployment, "train")
            record_stage2(study2, config, base)
        run_holdout(storage, self.study_name, evaluator, [base], workers=1)
        self._writer.send(overload_report(evaluator, base, evaluator.default_settings))

    def poll(self) -> None:
        """In the parent, while stage 1 runs: take the report once it is sent (so a
        worker never blocks on a full pipe), then close both ends."""
        if not self._received and self._reader.poll():
            self._received.append(self._reader.recv())
            self._reader.close()
            self._writer.close()

    def report(self) -> OverloadReport | None:
        """The overload report the worker sent (LookupError: it sent none)."""
        self.poll()
        if not self._received:
            raise LookupError("the baseline track sent no overload report")
        return self._received[0]


__all__ = ["BaselineTrack"]
