"""``calibration: metrics`` in retune.yaml: the clock fitted to /metrics before each tune."""

from __future__ import annotations

import dataclasses

import pytest

from tests.jobs.conftest import Job
from tuner.errors import ConfigError


def _window_metrics(job: Job, tmp_path, clock) -> str:  # type: ignore[no-untyped-def]
    """The /metrics a server with ``clock`` shows over the job's log (as the run ingests it)."""
    from click.testing import CliRunner

    from tuner import replay
    from tuner.cli import cli
    from tuner.fidelity.from_metrics import replay_metrics_text
    from tuner.perf.target import Target

    trace = tmp_path / "window.parquet"
    res = CliRunner().invoke(cli, ["ingest", str(job.log), "--format", "mooncake", "-o",
                                   str(trace), "--salt-file", str(tmp_path / "salt")])
    assert res.exit_code == 0, res.output
    target = Target(hardware="mi355x", model="llama-3.1-8b", tp=1, num_gpu_blocks=800)
    served = replay.run(trace, target=dataclasses.replace(target, clock=clock))
    path = tmp_path / "metrics.txt"
    path.write_text(replay_metrics_text(served, model_name="llama-3.1-8b"))
    return str(path)


def test_a_run_fits_the_clock_to_the_metrics_before_tuning(job: Job, tmp_path) -> None:
    from tuner.perf.clock_variant import ClockVariant

    job.append(job.lines)
    truth = ClockVariant(prefill=1.5, decode=0.8, cpu=0.8, transfer=0.8)
    metrics = _window_metrics(job, tmp_path, truth)
    job.configure(calibration="metrics", metrics=[metrics], robust="off")
    out = job.run()
    cal = out.entry["tune"]["calibration"]
    assert cal["used"] is True, cal
    assert cal["factors"]["prefill"] == pytest.approx(1.5, rel=0.05)
    assert cal["factors"]["decode"] == pytest.approx(0.8, rel=0.05)
    assert (job.root / "state" / "calibration.yaml").exists()
    assert out.entry["tune"]["robust"]["skipped"] == "--robust off"


def test_metrics_of_another_window_keep_the_targets_clock(job: Job, tmp_path) -> None:
    job.append(job.lines[:150])
    from tuner.perf.clock_variant import ClockVariant

    other = Job(tmp_path / "other")
    other.append(other.lines)  # 300 requests: not the 150 of this run's window
    metrics = _window_metrics(other, tmp_path, ClockVariant())
    job.configure(calibration="metrics", metrics=[metrics])
    out = job.run()
    cal = out.entry["tune"]["calibration"]
    assert cal["used"] is False and "not the same window" in cal["reason"]
    assert not (job.root / "state" / "calibration.yaml").exists()


def test_config_keys_are_checked(job: Job) -> None:
    job.configure(calibration="metrics")
    with pytest.raises(ConfigError, match="calibration: metrics needs the `metrics:` key"):
        job.config()
    job.configure(calibration="prometheus", metrics=["m.txt"])
    with pytest.raises(ConfigError, match="calibration.*must be none or metrics"):
        job.config()
    job.configure(clock_variants=0)
    with pytest.raises(ConfigError, match="clock_variants.*must be in"):
        job.config()
    job.configure(robust="off", clock_variants=8, robust_share=1.0)
    cfg = job.config()
    assert (cfg.robust, cfg.clock_variants, cfg.robust_share) == ("off", 8, 1.0)
