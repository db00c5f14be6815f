"""No command clobbers a file (issue): a plugin export into a folder it did not write, an
``-o`` naming any file the command reads (--baseline, --warm-start), a read-only output,
``-o -``, and temporary files left behind by SIGTERM or SIGHUP."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from tuner.cli import cli

REPO = pathlib.Path(__file__).resolve().parents[1]
PROFILE = REPO / "profiles" / "agentic-mi355x.yaml"
MOONCAKE = REPO / "traces" / "mooncake_synthetic.jsonl"


@pytest.fixture(autouse=True)
def _test_salt(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("TUNER_SALT", "test-salt")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def _invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    return res.exit_code, res.output


# -- item 4: plugin export into a folder ---------------------------------------------------
@pytest.mark.parametrize("existing", ["README.txt", "tuner/__init__.py", "notes/x.md"])
def test_plugin_export_refuses_a_folder_it_did_not_write(tmp_path: pathlib.Path,
                                                         existing: str) -> None:
    folder = tmp_path / "dest"
    (folder / existing).parent.mkdir(parents=True)
    (folder / existing).write_text("mine\n")
    code, out = _invoke("export", str(PROFILE), "--format", "plugin", "-o", str(folder))
    assert code == 2, out
    assert "not empty" in out and ".tuner-plugin" in out
    assert (folder / existing).read_text() == "mine\n"
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == [pathlib.Path(existing).name]


def test_plugin_export_into_the_checkout_is_refused(tmp_path: pathlib.Path) -> None:
    """Pointed at a project's own checkout it used to rewrite its tuner/*.py."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "tuner", checkout / "tuner", ignore=shutil.ignore_patterns("__pycache__"))
    before = (checkout / "tuner" / "__init__.py").read_bytes()
    code, out = _invoke("export", str(PROFILE), "--format", "plugin", "-o", str(checkout))
    assert code == 2, out
    assert (checkout / "tuner" / "__init__.py").read_bytes() == before


def test_plugin_export_may_replace_its_own_folder(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    assert _invoke("export", str(PROFILE), "--format", "plugin", "-o", str(folder))[0] == 0
    assert (folder / ".tuner-plugin").is_file()
    code, out = _invoke("export", str(PROFILE), "--format", "plugin", "-o", str(folder))
    assert code == 0, out


# -- item 5: every file the command reads is an input ------------------------------------
@pytest.fixture
def small_trace(tmp_path: pathlib.Path) -> pathlib.Path:
    src = tmp_path / "log.jsonl"
    with open(MOONCAKE, "rb") as fh:
        src.write_bytes(b"".join(fh.readline() for _ in range(40)))
    out = tmp_path / "t.parquet"
    assert _invoke("ingest", str(src), "-o", str(out))[0] == 0
    return out


@pytest.mark.parametrize("option", ["--baseline", "--warm-start"])
def test_tune_refuses_to_replace_a_profile_it_reads(tmp_path: pathlib.Path,
                                                    small_trace: pathlib.Path,
                                                    option: str) -> None:
    prof = tmp_path / "P.yaml"
    shutil.copy(PROFILE, prof)
    before = prof.read_bytes()
    code, out = _invoke("tune", str(small_trace), "--hardware", "mi355x", "--model",
                        "llama-3.1-8b", "--tp", "1", "--trials", "2", option, str(prof),
                        "-o", str(prof))
    assert code == 2, out
    assert "is also an input" in out
    assert prof.read_bytes() == before


def test_export_refuses_to_replace_its_check_interpreter_or_profile(tmp_path: pathlib.Path) -> None:
    prof = tmp_path / "P.yaml"
    shutil.copy(PROFILE, prof)
    code, out = _invoke("export", str(prof), "--format", "yaml", "-o", str(prof))
    assert code == 2 and "is also an input" in out


# -- item 6: read-only outputs, "-o -" ----------------------------------------------------
def test_read_only_output_is_refused(tmp_path: pathlib.Path, small_trace: pathlib.Path) -> None:
    ro = tmp_path / "ro.yaml"
    ro.write_text("keep\n")
    ro.chmod(0o444)
    code, out = _invoke("export", str(PROFILE), "--format", "yaml", "-o", str(ro))
    assert code == 2, out
    assert "read-only" in out
    assert ro.read_text() == "keep\n"


@pytest.mark.parametrize("command", [
    ["export", str(PROFILE), "--format", "yaml"],
    ["export", str(PROFILE), "--format", "plugin"],
    ["ingest", str(MOONCAKE)],
    ["trace", "synth", "--kind", "chat", "--duration", "1m", "--rate", "1"],
])
def test_dash_output_is_refused_not_a_file_named_dash(tmp_path: pathlib.Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      command: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out = _invoke(*command, "-o", "-")
    assert code == 2, out
    assert "'-'" in out
    assert not (tmp_path / "-").exists()


# -- item 6: SIGTERM / SIGHUP clean up like Ctrl-C ---------------------------------------
@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """~1M Mooncake lines (one line repeated): seconds of ingest to interrupt."""
    src = tmp_path_factory.mktemp("big") / "big.jsonl"
    line = MOONCAKE.read_bytes().splitlines()[0] + b"\n"
    with open(src, "wb") as fh:
        for _ in range(10):
            fh.write(line * 100_000)
    return src


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signal_during_ingest_leaves_no_temporary_file(tmp_path: pathlib.Path,
                                                       big_log: pathlib.Path,
                                                       sig: signal.Signals) -> None:
    src = big_log
    out = tmp_path / "out" / "o.parquet"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TUNER_SALT": "x"}
    proc = subprocess.Popen([sys.executable, "-c", "from tuner.cli import main; main()",
                             "ingest", str(src), "-o", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list(out.parent.glob(".o.parquet.*.tmp")):
        time.sleep(0.05)
    assert list(out.parent.glob(".o.parquet.*.tmp")), "ingest never started writing"
    proc.send_signal(sig)
    output = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 128 + sig, output
    assert "Traceback" not in output
    assert list(out.parent.iterdir()) == [], list(out.parent.iterdir())


def test_a_command_run_in_process_gives_back_the_callers_signal_handlers() -> None:
    """The CLI's SIGTERM/SIGHUP cleanup lasts for the command only: a notebook or a test
    worker that runs a command through Click's runner keeps its own handlers afterwards
    (left installed, a later fork pool's workers inherited the CLI's handler)."""
    import signal

    from click.testing import CliRunner

    from tuner.cli import cli

    def mine(signum, frame):  # type: ignore[no-untyped-def]
        return None

    before = signal.signal(signal.SIGTERM, mine)
    try:
        assert CliRunner().invoke(cli, ["trace", "--help"]).exit_code == 0
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
