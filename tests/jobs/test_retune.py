"""Two runs over an appended log, idempotence, drift, the hook, history and diff."""

from __future__ import annotations

import json

import polars as pl
import pytest
from click.testing import CliRunner

from tests.jobs.conftest import Job
from tests.jobs.fixtures import mooncake_lines
from tuner.cli import cli
from tuner.jobs import EXIT_KEPT, EXIT_PUBLISHED, load_state


def test_two_runs_over_appended_log_then_idempotent(job: Job) -> None:
    job.append(job.lines[:150])
    first = job.run()
    assert first.decision == "published", first.reason
    assert first.exit_code == EXIT_PUBLISHED and first.version == 1
    assert first.entry["search"] == "full"  # no current profile yet
    assert job.history().current_version() == 1
    size1 = job.log.stat().st_size
    assert next(iter(load_state(job.root / "state").sources.values())).offset == size1

    job.append(job.lines[150:])
    second = job.run()
    assert second.entry["new_requests"] == 150
    assert second.entry["window"]["requests"] == 300
    assert second.entry["search"] == "warm-start", second.entry["drift"]
    assert any("warm start" in n for n in second.entry["tune"]["notes"])
    state = load_state(job.root / "state")
    mark = next(iter(state.sources.values()))
    assert mark.offset == job.log.stat().st_size and mark.num_requests == 300
    # One timeline: the window spans the log's own first..last timestamps.
    ts = [json.loads(x)["timestamp"] for x in job.lines]
    parts = pl.read_parquet(str(job.root / "state" / "window" / "**" / "*.parquet"))
    assert parts.height == 300
    assert abs(parts["arrival_s"].max() - (ts[-1] - ts[0]) / 1000.0) < 1e-6
    assert parts["request_id"].n_unique() == 300

    before = job.state_bytes()
    versions = job.history().versions()
    third = job.run()
    assert third.decision == "kept" and third.exit_code == EXIT_KEPT
    assert "no new requests" in third.reason
    assert job.state_bytes() == before
    assert job.history().versions() == versions
    entries = job.history().changelog()
    assert [e["decision"] for e in entries][0] == "published" and len(entries) == 3


def test_partial_last_line_waits_for_the_next_run(job: Job) -> None:
    job.append(job.lines[:100])
    with open(job.log, "a") as fh:
        fh.write(job.lines[100][:20])  # a writer caught mid-line
    job.configure(trials=1, margin=-1.0)
    job.run()
    mark = next(iter(load_state(job.root / "state").sources.values()))
    assert mark.offset == job.log.stat().st_size - 20
    with open(job.log, "a") as fh:
        fh.write(job.lines[100][20:] + "\n")
    out = job.run()
    assert out.entry["new_requests"] == 1


@pytest.mark.slow  # two retune runs, the second a full search (~5 s)
def test_drift_forces_full_search(job: Job) -> None:
    job.append(job.lines[:150])
    assert job.run().decision == "published"
    last_ms = json.loads(job.lines[149])["timestamp"]
    shifted = mooncake_lines(150, start_ms=last_ms, seed=7, rate_per_s=20,
                             input_blocks=(1, 2), output_len=(300, 400))
    job.configure(window="30s")  # only the new, different traffic
    job.append(shifted)
    out = job.run()
    assert out.entry["drift"]["score"] > 0.5
    assert out.entry["search"] == "full"
    assert "drift" in out.entry["full_search_reason"]
    assert not any("warm start" in n for n in out.entry["tune"]["notes"])


def test_hook_runs_after_publish_and_failure_does_not_unpublish(job: Job) -> None:
    job.append(job.lines[:150])
    marker = job.root / "hook.txt"
    out = job.run(on_publish=f'echo "$TUNER_PROFILE_VERSION $TUNER_PROFILE_PATH" > {marker}; '
                             "exit 9")
    assert out.decision == "published"
    assert out.hook is not None and out.hook["returncode"] == 9 and out.exit_code == 5
    assert marker.read_text().split() == ["1", str(job.history().version_path(1))]
    assert job.history().current_version() == 1


def test_history_and_diff_commands(job: Job) -> None:
    from tests.jobs.conftest import BASE_CONFIG

    # The synchronous engine (the retune key): on these 300 requests its 6-trial search
    # finds settings that beat vLLM's defaults, which the history below needs.
    target = {**BASE_CONFIG["target"], "async_scheduling": False}
    job.append(job.lines[:150])
    job.configure(trials=1, margin=-1.0, target=target)  # v1 = vLLM's defaults
    assert job.run().version == 1
    job.configure(target=target)
    job.append(job.lines[150:])
    assert job.run().version == 2
    pdir = str(job.root / "profiles")
    res = CliRunner().invoke(cli, ["profile", "history", "prod", "--profiles-dir", pdir,
                                   "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["current_version"] == 2 and data["versions"] == [1, 2]
    assert [r["decision"] for r in data["runs"]] == ["published", "published"]
    res = CliRunner().invoke(cli, ["profile", "history", "prod", "--profiles-dir", pdir])
    assert res.output.startswith("prod: current v0002")
    res = CliRunner().invoke(cli, ["profile", "diff", "1", "current", "--name", "prod",
                                   "--profiles-dir", pdir, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    changed = [r["key"] for r in rows["settings"] if r["changed"]]
    assert changed, "v2 should differ from vLLM's defaults"
    assert any(r["key"].startswith("train.") for r in rows["predicted"])
    res = CliRunner().invoke(cli, ["profile", "diff", "prod@7", "prod@1", "--profiles-dir",
                                   pdir])
    assert res.exit_code == 2 and "no such version" in res.output


def test_config_error_names_file_and_key(job: Job) -> None:
    job.config_path.write_text(job.config_path.read_text() + "windoww: 2h\n")
    res = job.run_cli()
    assert res.returncode == 2
    assert res.stderr.strip() == (f"Error: {job.config_path}: unknown key(s) windoww "
                                  "(see docs/retune.md)")


def test_every_config_key_is_documented() -> None:
    import pathlib

    from tuner.jobs.config import _KNOWN, _TARGET_KEYS

    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "retune.md").read_text()
    missing = [k for k in sorted(_KNOWN) + list(_TARGET_KEYS) if k not in doc]
    assert missing == []


def test_back_to_back_runs_in_one_second_get_distinct_run_ids(job: Job) -> None:
    job.append(job.lines[:60])
    job.configure(trials=1, margin=-1.0)
    job.run()
    job.append(job.lines[60:70])
    job.run()  # formerly the same run id -> the same study name -> ConfigError
    ids = [e["run_id"] for e in job.history().changelog()]
    assert len(ids) == 2 and len(set(ids)) == 2


def test_failed_run_is_logged_and_changes_nothing(job: Job) -> None:
    job.append(job.lines[:150])
    job.configure(trials=1, margin=-1.0)
    job.run()
    before = job.state_bytes()
    job.append(job.lines[150:])
    job.configure(target={"hardware": "mi355x", "model": "no-such-model", "tp": 1})
    res = job.run_cli()
    assert res.returncode in (1, 2) and res.stderr.startswith("Error: "), res.stderr
    assert "no-such-model" in res.stderr
    assert job.state_bytes() == before
    assert job.history().current_version() == 1
    last = job.history().changelog()[-1]
    assert last["decision"] == "failed" and "no-such-model" in last["reason"]
