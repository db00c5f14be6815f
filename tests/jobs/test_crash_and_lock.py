"""Crash safety (the job killed between commit steps) and the run lock."""

from __future__ import annotations

import json
import time

import pytest

from tests.jobs.conftest import Job
from tuner.jobs import EXIT_LOCKED, JobLock, JobLocked, load_state

#: Phases in commit order; before "after_pointer" the previous profile must stay current.
PHASES = ["after_ingest", "after_tune", "after_evaluate", "after_intent", "after_version",
          "after_pointer", "after_state", "after_changelog"]
SWAPPED = {"after_pointer", "after_state", "after_changelog"}


def _published_v1(job: Job) -> None:
    """v1 = vLLM's defaults (1 trial, any result published), then the real config."""
    job.append(job.lines[:150])
    job.configure(trials=1, margin=-1.0)
    assert job.run().version == 1
    job.configure()
    job.append(job.lines[150:])


@pytest.mark.slow  # 2-35 s per phase: each phase re-runs a whole retune in a subprocess
@pytest.mark.parametrize("phase", PHASES)
def test_crash_at_phase_keeps_previous_profile_and_rerun_completes(job: Job,
                                                                    phase: str) -> None:
    _published_v1(job)
    state_before = job.state_bytes()
    runs_before = len(job.history().changelog())

    crashed = job.run_cli(env={"TUNER_RETUNE_CRASH_AT": phase})
    assert crashed.returncode == 70, crashed.stderr  # the hook's os._exit code

    hist = job.history()
    if phase in SWAPPED:
        assert hist.current_version() == 2
    else:
        assert hist.current_version() == 1
        assert job.state_bytes() == state_before  # watermark not moved
    load_state(job.root / "state")  # always parseable: never a torn file
    assert hist.current_path() is not None and hist.current_path().is_file()

    rerun = job.run()
    hist = job.history()
    entries = hist.changelog()
    run_ids = [e["run_id"] for e in entries]
    assert len(run_ids) == len(set(run_ids)), "a run was logged twice"
    assert not (job.root / "state" / "pending.json").exists()
    mark = next(iter(load_state(job.root / "state").sources.values()))
    assert mark.offset == job.log.stat().st_size and mark.num_requests == 300
    published = [e["version"] for e in entries if e["decision"] == "published"]
    assert published == [1, 2], entries  # v2 exactly once, no gap, no orphan
    assert hist.versions() == [1, 2] and hist.current_version() == 2
    if phase in SWAPPED:
        assert any(e.get("recovered") for e in entries) or phase == "after_changelog"
        assert rerun.decision == "kept"  # nothing new since the recovered run
    else:
        assert rerun.decision == "published" and rerun.version == 2
        assert len(entries) == runs_before + 1


def test_second_run_exits_at_once_with_lock_code(job: Job) -> None:
    job.append(job.lines[:50])
    with JobLock(job.root / "state"):
        with pytest.raises(JobLocked):
            JobLock(job.root / "state").__enter__()
        t0 = time.monotonic()
        res = job.run_cli()
        elapsed = time.monotonic() - t0
    assert res.returncode == EXIT_LOCKED
    assert "another retune is running (pid" in res.stderr
    assert elapsed < 20  # import time only: it never waits for the lock
    assert not (job.root / "state" / "state.json").exists()  # did nothing


def test_lock_is_released_when_holder_dies(job: Job) -> None:
    job.append(job.lines[:150])
    job.configure(trials=1, margin=-1.0)
    assert job.run_cli(env={"TUNER_RETUNE_CRASH_AT": "after_ingest"}).returncode == 70
    done = job.run_cli()
    assert done.returncode == 0, done.stderr  # flock died with the process
    assert any(ln.startswith("published: ") for ln in done.stdout.splitlines()), done.stdout
    again = job.run_cli("--json")
    assert again.returncode == 3
    out = json.loads(again.stdout)
    assert out["decision"] == "kept" and out["exit_code"] == 3 and out["version"] == 1


def test_parts_of_a_crashed_run_are_dropped_even_if_the_log_was_truncated(job: Job) -> None:
    job.append(job.lines[:150])
    job.configure(trials=1, margin=-1.0)
    assert job.run().version == 1
    job.append(job.lines[150:200])
    assert job.run_cli(env={"TUNER_RETUNE_CRASH_AT": "after_ingest"}).returncode == 70
    window = job.root / "state" / "window"
    assert len(list(window.rglob("*.parquet"))) == 2  # the crashed run's part is on disk
    job.log.write_text("")  # the log is truncated before the rerun ...
    job.append(job.lines[200:230])  # ... and holds other requests
    out = job.run()
    assert any("not in the state" in n for n in out.notes)
    assert out.entry["window"]["requests"] == 180  # 150 + 30, none of the 50 lost ones
