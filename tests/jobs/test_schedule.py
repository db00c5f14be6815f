"""Generated crontab lines, systemd units and the Kubernetes CronJob, and --install."""

from __future__ import annotations

import configparser
import os
import pathlib
import shutil
import stat
import subprocess

import pytest
import yaml
from click.testing import CliRunner

from tests.envs import tuner_executable
from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.jobs import (cron_to_oncalendar, cronjob_manifest, every_to_cron, make_spec,
                        merge_crontab, render)

#: The installed console script of the environment under test (not a path into the checkout).
TUNER_BIN = tuner_executable()


@pytest.mark.parametrize("every,cron", [("30m", "*/30 * * * *"), ("1h", "0 * * * *"),
                                        ("6h", "0 */6 * * *"), ("1d", "0 0 * * *")])
def test_every_to_cron(every: str, cron: str) -> None:
    assert every_to_cron(every) == cron


@pytest.mark.parametrize("bad", ["7m", "5h", "2d", "6x", "0h"])
def test_every_rejects_periods_cron_cannot_keep(bad: str) -> None:
    with pytest.raises(ConfigError):
        every_to_cron(bad)


@pytest.mark.parametrize("cron,calendar", [
    ("*/30 * * * *", "*-*-* *:00/30:00"),
    ("0 */6 * * *", "*-*-* 00/6:00:00"),
    ("15 2 * * 1-5", "Mon..Fri *-*-* 02:15:00"),
    ("0 3 1,15 * *", "*-*-01,15 03:00:00"),
    ("@weekly", "Sun *-*-* 00:00:00"),
])
def test_cron_to_oncalendar(cron: str, calendar: str) -> None:
    assert cron_to_oncalendar(cron) == calendar
    if shutil.which("systemd-analyze"):
        subprocess.run(["systemd-analyze", "calendar", calendar], check=True,
                       capture_output=True)


@pytest.mark.parametrize("bad", ["* * * *", "61 * * * *", "0 25 * * *", "0 0 * * MON"])
def test_bad_cron_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError):
        cron_to_oncalendar(bad)


#: A config ``tuner retune`` can load (schedule refuses one it cannot).
VALID_CONFIG = ("sources: ['logs/*.jsonl']\nstate_dir: state\nprofile: prod\n"
                "profiles_dir: profiles\ntarget: {hardware: mi355x, model: llama-3.1-8b, "
                "tp: 1}\n")


def _write_config(folder: pathlib.Path, name: str = "retune.yaml") -> pathlib.Path:
    cfg = folder / name
    cfg.write_text(VALID_CONFIG)
    return cfg


def _spec(tmp_path: pathlib.Path, **kw):  # type: ignore[no-untyped-def]
    cfg = tmp_path / "retune.yaml"
    cfg.write_text("profile: prod\n")
    return make_spec(every=kw.pop("every", "6h"), cron=kw.pop("cron", None), config=cfg,
                     tuner=TUNER_BIN, **kw)


def test_systemd_units_fields_and_verify(tmp_path: pathlib.Path) -> None:
    files = render(_spec(tmp_path), "systemd")
    service, timer = configparser.ConfigParser(), configparser.ConfigParser()
    service.optionxform = timer.optionxform = str  # type: ignore[method-assign]
    service.read_string(files["tuner-retune.service"])
    timer.read_string(files["tuner-retune.timer"])
    assert service["Service"]["Type"] == "oneshot"
    assert service["Service"]["ExecStart"] == (f"{TUNER_BIN} retune --config "
                                               f"{tmp_path / 'retune.yaml'}")
    assert service["Service"]["SuccessExitStatus"].split() == ["3", "4"]
    assert timer["Timer"]["OnCalendar"] == "*-*-* 00/6:00:00"
    assert timer["Timer"]["Persistent"] == "true"
    assert timer["Timer"]["Unit"] == "tuner-retune.service"
    assert timer["Install"]["WantedBy"] == "timers.target"
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed: fields checked, `verify` not run")
    out = tmp_path / "units"
    out.mkdir()
    for name, text in files.items():
        (out / name).write_text(text)
    res = subprocess.run(["systemd-analyze", "verify", str(out / "tuner-retune.service"),
                          str(out / "tuner-retune.timer")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


# A minimal schema of what the API server requires of a batch/v1 CronJob (fields we emit
# and those Kubernetes rejects when missing); written from the batch/v1 API reference.
_CONTAINER = {"name": str, "image": str, "command": [str],
              "resources": {"requests": {"cpu": str, "memory": str}},
              "volumeMounts": [{"name": str, "mountPath": str}]}
CRONJOB_SCHEMA = {
    "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": str},
    "spec": {"schedule": str, "concurrencyPolicy": ("Allow", "Forbid", "Replace"),
             "jobTemplate": {"spec": {"template": {"spec": {
                 "restartPolicy": ("Never", "OnFailure"), "containers": [_CONTAINER],
                 "volumes": [{"name": str, "persistentVolumeClaim": {"claimName": str}}]}}}}},
}


def _check(value: object, schema: object, where: str = "") -> list[str]:
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{where}: expected a mapping"]
        errs = []
        for key, sub in schema.items():
            if key not in value:
                errs.append(f"{where}.{key}: required")
            else:
                errs += _check(value[key], sub, f"{where}.{key}")
        return errs
    if isinstance(schema, list):
        if not isinstance(value, list) or not value:
            return [f"{where}: expected a non-empty list"]
        return [e for i, v in enumerate(value) for e in _check(v, schema[0], f"{where}[{i}]")]
    if isinstance(schema, tuple):
        return [] if value in schema else [f"{where}: {value!r} not in {schema}"]
    if isinstance(schema, type):
        return [] if isinstance(value, schema) else [f"{where}: not a {schema.__name__}"]
    return [] if value == schema else [f"{where}: {value!r} != {schema!r}"]


def test_cronjob_manifest_matches_schema(tmp_path: pathlib.Path) -> None:
    spec = _spec(tmp_path, every=None, cron="15 */6 * * *", image="reg/tuner:1")
    doc = yaml.safe_load(render(spec, "kubernetes")["tuner-retune.cronjob.yaml"])
    assert _check(doc, CRONJOB_SCHEMA) == []
    assert doc["spec"]["schedule"] == "15 */6 * * *"
    assert doc["spec"]["concurrencyPolicy"] == "Forbid"
    pod = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert "tuner retune --config /var/lib/tuner/retune.yaml" in pod["containers"][0]["command"][2]
    assert pod["containers"][0]["image"] == "reg/tuner:1"
    broken = cronjob_manifest(spec)
    del broken["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert _check(broken, CRONJOB_SCHEMA) == [
        ".spec.jobTemplate.spec.template.spec.containers[0].image: required"]


def test_cronjob_shell_maps_kept_and_locked_to_success(tmp_path: pathlib.Path) -> None:
    doc = cronjob_manifest(_spec(tmp_path))
    script = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0][
        "command"][2]
    for code, expect in ((0, 0), (3, 0), (4, 0), (1, 1), (5, 5)):
        fake = script.replace("tuner retune --config /var/lib/tuner/retune.yaml",
                              f"sh -c 'exit {code}'")
        assert subprocess.run(["/bin/sh", "-c", fake]).returncode == expect


def test_merge_crontab_is_idempotent() -> None:
    line = "0 */6 * * * tuner retune --config /x.yaml # tuner-retune:tuner-retune"
    once = merge_crontab("MAILTO=ops\n5 * * * * backup\n", line, "tuner-retune")
    assert once == "MAILTO=ops\n5 * * * * backup\n" + line + "\n"
    assert merge_crontab(once, line, "tuner-retune") == once
    newer = line.replace("*/6", "*/3")
    assert merge_crontab(once, newer, "tuner-retune").count("tuner-retune:") == 1


def _fake_bin(folder: pathlib.Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_install_crontab_with_fake_crontab(tmp_path: pathlib.Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tab = tmp_path / "tab"
    tab.write_text("5 * * * * backup\n")
    _fake_bin(bindir, "crontab", f'if [ "$1" = "-l" ]; then cat {tab}; else cat > {tab}; fi\n')
    _write_config(tmp_path)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}"}
    args = ["schedule", "--every", "6h", "--config", str(tmp_path / "retune.yaml"),
            "--target", "cron", "--install", "--tuner-bin", "/opt/tuner"]
    res = CliRunner(env=env).invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0 and "cron: installed" in res.output
    lines = tab.read_text().splitlines()
    assert lines[0] == "5 * * * * backup"
    assert lines[1].startswith("0 */6 * * * /opt/tuner retune --config ")
    res = CliRunner(env=env).invoke(cli, args, catch_exceptions=False)
    assert "already installed" in res.output and len(tab.read_text().splitlines()) == 2


def test_install_systemd_user_units_with_fake_systemctl(tmp_path: pathlib.Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    _fake_bin(bindir, "systemctl", f'echo "$@" >> {calls}\n')
    _write_config(tmp_path)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    res = CliRunner(env=env).invoke(cli, [
        "schedule", "--cron", "0 3 * * *", "--config", str(tmp_path / "retune.yaml"),
        "--target", "systemd", "--install"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    unit_dir = tmp_path / "cfg" / "systemd" / "user"
    assert (unit_dir / "tuner-retune.timer").read_text().count("OnCalendar=*-*-* 03:00:00") == 1
    assert calls.read_text().splitlines() == ["--user daemon-reload",
                                              "--user enable --now tuner-retune.timer"]


def test_schedule_needs_exactly_one_period(tmp_path: pathlib.Path) -> None:
    _write_config(tmp_path)
    res = CliRunner().invoke(cli, ["schedule", "--config", str(tmp_path / "retune.yaml"),
                                   "--target", "cron"])
    assert res.exit_code == 2 and res.output.strip() == \
        "Error: give exactly one of --every or --cron"


def _schedule(tmp_path: pathlib.Path, target: str, env: dict[str, str], *extra: str):  # type: ignore[no-untyped-def]
    _write_config(tmp_path)
    return CliRunner(env=env).invoke(cli, [
        "schedule", "--every", "6h", "--config", str(tmp_path / "retune.yaml"),
        "--target", target, "--install", "--tuner-bin", "/opt/tuner", *extra])


def test_install_without_crontab_prints_the_line_and_fails(tmp_path: pathlib.Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("sh", "cat"):  # a PATH without crontab
        os.symlink(shutil.which(tool), bindir / tool)
    res = _schedule(tmp_path, "cron", {"PATH": str(bindir)})
    assert res.exit_code == 1, res.output
    assert "`crontab` is not installed" in res.output
    assert "0 */6 * * * /opt/tuner retune --config " in res.output  # the line is not lost


def test_failing_crontab_is_a_failure(tmp_path: pathlib.Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _fake_bin(bindir, "crontab", 'if [ "$1" = "-l" ]; then echo "no crontab for u" >&2; '
                                 'exit 1; fi\necho "crontab: permission denied" >&2; exit 1\n')
    res = _schedule(tmp_path, "cron", {"PATH": f"{bindir}:{os.environ['PATH']}"})
    assert res.exit_code == 1, res.output
    assert "`crontab -` failed (crontab: permission denied)" in res.output
    assert "/opt/tuner retune --config" in res.output


def test_unreadable_crontab_is_not_overwritten(tmp_path: pathlib.Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrote = tmp_path / "wrote"
    _fake_bin(bindir, "crontab", 'if [ "$1" = "-l" ]; then echo "cannot connect" >&2; exit 1; '
                                 f'fi\ntouch {wrote}\n')
    res = _schedule(tmp_path, "cron", {"PATH": f"{bindir}:{os.environ['PATH']}"})
    assert res.exit_code == 1 and "not touching the crontab" in res.output
    assert not wrote.exists()


def test_failing_daemon_reload_is_a_failure(tmp_path: pathlib.Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _fake_bin(bindir, "systemctl", 'echo "Failed to connect to bus" >&2; exit 1\n')
    res = _schedule(tmp_path, "systemd", {"PATH": f"{bindir}:{os.environ['PATH']}",
                                          "XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert res.exit_code == 1, res.output
    assert "`systemctl --user daemon-reload` failed (Failed to connect to bus)" in res.output
    assert "`systemctl --user enable --now tuner-retune.timer`" in res.output
    assert (tmp_path / "cfg" / "systemd" / "user" / "tuner-retune.timer").is_file()


def test_kubernetes_install_writes_the_manifest_it_names(tmp_path: pathlib.Path) -> None:
    res = _schedule(tmp_path, "kubernetes", {})
    assert res.exit_code == 0, res.output
    manifest = tmp_path / "tuner-retune.cronjob.yaml"
    assert f"kubectl apply -f {manifest}" in res.output
    assert yaml.safe_load(manifest.read_text())["kind"] == "CronJob"
    out = tmp_path / "k8s"
    res = _schedule(tmp_path, "kubernetes", {}, "-o", str(out))
    assert res.exit_code == 0 and "replaced" not in res.output
    assert f"kubectl apply -f {out / 'tuner-retune.cronjob.yaml'}" in res.output
