"""tuner.outputs: every -o is checked (inputs, devices, folders, symlinks) and atomic."""

from __future__ import annotations

import os
import pathlib
import stat

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import OutputError
from tuner.outputs import AtomicOutput, check_output, write_text

REPO = pathlib.Path(__file__).resolve().parents[1]
MOONCAKE = REPO / "traces" / "mooncake_synthetic.jsonl"


@pytest.fixture(autouse=True)
def _test_salt(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("TUNER_SALT", "test-salt")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def _mooncake(tmp_path: pathlib.Path, lines: int = 50) -> pathlib.Path:
    src = tmp_path / "log.jsonl"
    with open(MOONCAKE, "rb") as fh:
        src.write_bytes(b"".join(fh.readline() for _ in range(lines)))
    return src


def _ingest(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["ingest", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


def test_ingest_refuses_to_overwrite_its_input(tmp_path: pathlib.Path) -> None:
    src = _mooncake(tmp_path)
    before = src.read_bytes()
    code, out = _ingest(str(src), "-o", str(src))
    assert code == 2
    assert "is also an input" in out and "Traceback" not in out
    assert src.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]  # no temp file left


def test_hard_link_to_an_input_is_the_input(tmp_path: pathlib.Path) -> None:
    src = _mooncake(tmp_path)
    os.link(src, tmp_path / "alias.parquet")
    with pytest.raises(OutputError, match="is also an input"):
        check_output(tmp_path / "alias.parquet", inputs=[src])


@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_non_regular_outputs_are_refused(tmp_path: pathlib.Path, kind: str) -> None:
    src = _mooncake(tmp_path)
    target = tmp_path / "pipe.parquet" if kind == "fifo" else pathlib.Path("/dev/null")
    if kind == "fifo":
        os.mkfifo(target)
    code, out = _ingest(str(src), "-o", str(target))
    assert code == 2, out
    assert ("a FIFO" if kind == "fifo" else "a character device") in out
    mode = os.stat(target).st_mode
    assert stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISCHR(mode)


def test_directory_output_is_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / "folder").mkdir()
    with pytest.raises(OutputError, match="is a directory"):
        check_output(tmp_path / "folder")


def test_symlink_output_is_written_through(tmp_path: pathlib.Path) -> None:
    src = _mooncake(tmp_path)
    (tmp_path / "real").mkdir()
    link = tmp_path / "current.parquet"
    link.symlink_to(tmp_path / "real" / "t.parquet")
    code, out = _ingest(str(src), "-o", str(link))
    assert code == 0, out
    assert link.is_symlink(), "the link was replaced by a regular file"
    assert (tmp_path / "real" / "t.parquet").read_bytes()[:4] == b"PAR1"
    code, out = _ingest(str(src), "-o", str(link))
    assert code == 0
    assert "replaced existing" in out and "through the symlink" in out
    assert link.is_symlink()


def test_replacing_an_existing_file_is_said(tmp_path: pathlib.Path) -> None:
    src = _mooncake(tmp_path)
    out_path = tmp_path / "t.parquet"
    code, out = _ingest(str(src), "-o", str(out_path))
    assert code == 0 and "replaced" not in out
    code, out = _ingest(str(src), "-o", str(out_path))
    assert code == 0 and f"replaced existing {out_path}" in out


def test_parent_that_is_a_file_and_unwritable_folder(tmp_path: pathlib.Path) -> None:
    src = _mooncake(tmp_path)
    code, out = _ingest(str(src), "-o", str(src / "sub.parquet"))
    assert code == 2 and "is a file, not a folder" in out and "Traceback" not in out
    code, out = _ingest(str(src), "-o", "/proc/x.parquet")
    assert code == 2 and "cannot create a file in /proc" in out and "Traceback" not in out


def test_slice_refuses_its_input(tmp_path: pathlib.Path) -> None:
    trace = tmp_path / "t.parquet"
    assert _ingest(str(_mooncake(tmp_path)), "-o", str(trace))[0] == 0
    before = trace.read_bytes()
    result = CliRunner().invoke(cli, ["trace", "slice", str(trace), "--last", "10",
                                      "-o", str(trace)])
    assert result.exit_code == 2 and "is also an input" in result.output
    assert trace.read_bytes() == before


def test_atomic_output_keeps_old_file_on_error(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "p.yaml"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with AtomicOutput(target) as out:
            out.tmp_path.write_text("half")
            raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]


def test_modes(tmp_path: pathlib.Path) -> None:
    old = os.umask(0o077)
    try:
        write_text(tmp_path / "plain.txt", "x")
        write_text(tmp_path / "profile.yaml", "x", mode=0o644)
        (tmp_path / "kept.txt").write_text("y")
        os.chmod(tmp_path / "kept.txt", 0o640)
        write_text(tmp_path / "kept.txt", "z")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "plain.txt").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "profile.yaml").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "kept.txt").st_mode) == 0o640


def test_profiles_are_world_readable(tmp_path: pathlib.Path) -> None:
    from tuner.profile import load_profile, save_profile

    golden = next((REPO / "profiles").glob("*.yaml"))
    old = os.umask(0o077)
    try:
        path = save_profile(load_profile(golden), tmp_path / "p.yaml")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


def test_no_module_writes_by_its_own_temp_and_rename() -> None:
    """One writer: mkstemp + os.replace appear only in tuner/outputs.py."""
    offenders = []
    for path in (REPO / "tuner").rglob("*.py"):
        if path.name == "outputs.py":
            continue
        text = path.read_text()
        if "mkstemp(" in text and "os.replace(" in text:
            offenders.append(str(path.relative_to(REPO)))
    assert offenders == []
