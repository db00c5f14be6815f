"""retune publishes only for the deployment it is configured for (issue: ``target: null``
published a mi355x / llama-3.1-70b profile with exit 0; a changed target was answered "no
new requests" and kept the old profile; ``on_error: ignore`` exited 1, not 2)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.jobs.conftest import BASE_CONFIG, Job


@pytest.mark.parametrize("target", [None, {}, {"hardware": "mi355x"}, {"model": "llama-3.1-8b"},
                                    "mi355x"])
def test_a_target_is_required(job: Job, target: object) -> None:
    job.append(job.lines[:50])
    cfg = {**BASE_CONFIG, "target": target}
    if target is None:
        del cfg["target"]
    job.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    res = job.run_cli()
    assert res.returncode == 2, res.stdout + res.stderr
    assert "target: required" in res.stderr
    assert not (job.root / "profiles").exists()


@pytest.mark.parametrize("key,value,says", [
    ("on_error", "ignore", "on_error: must be fail or skip"),
    ("prefer", "fastest", "prefer: must be"),
    ("margin", float("nan"), "margin: must be in"),
    ("trials", 2.5, "trials: expected an integer"),
    ("trials", True, "trials: expected an integer"),
    ("trials", 10**9, "trials: must be in"),
    ("confidence", 1.5, "confidence: must be in"),
    ("min_requests", 0, "min_requests: must be in"),
    ("bootstrap_samples", "many", "bootstrap_samples: expected an integer"),
    ("window", "0s", "window"),
])
def test_a_bad_value_is_a_config_error_exit_2(job: Job, key: str, value: object,
                                              says: str) -> None:
    job.configure(**{key: value})
    res = job.run_cli()
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith(f"Error: {job.config_path}") and says in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_a_changed_target_is_refused_and_keeps_the_profile(job: Job) -> None:
    job.append(job.lines[:150])
    job.configure(trials=1, margin=-1.0)
    assert job.run().version == 1
    before = job.state_bytes()
    assert json.loads(before)["target"] == BASE_CONFIG["target"]
    job.append(job.lines[150:])
    job.configure(target={**BASE_CONFIG["target"], "model": "qwen3-8b"})
    res = job.run_cli()
    assert res.returncode == 2, res.stdout + res.stderr
    assert "target changed since the last run (model: 'llama-3.1-8b' -> 'qwen3-8b')" in res.stderr
    assert "start a new history" in res.stderr
    assert job.state_bytes() == before
    assert job.history().current_version() == 1
    # A state from before targets were recorded: the current profile's target decides.
    state = json.loads(before)
    del state["target"]
    (job.root / "state" / "state.json").write_text(json.dumps(state))
    res = job.run_cli()
    assert res.returncode == 2, res.stdout + res.stderr
    assert "was tuned for another target (model: 'llama-3.1-8b')" in res.stderr
    assert job.history().current_version() == 1
