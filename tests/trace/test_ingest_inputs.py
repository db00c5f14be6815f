"""Odd inputs get a one-line answer that says what to do (issue: ``trace synth --rate nan``
and ``--param turns=-3`` ended in tracebacks; ingesting a ``.parquet`` printed binary;
ingesting ``-`` said "not seekable"; a 3-byte or world-readable salt was not warned about)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tuner.cli import cli

REPO = pathlib.Path(__file__).resolve().parents[2]
TRACE = REPO / "traces" / "agentic_1h.parquet"
MOONCAKE = REPO / "traces" / "mooncake_synthetic.jsonl"


def _invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    res = CliRunner(env=env).invoke(cli, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    return res.exit_code, res.output


@pytest.mark.parametrize("args,says", [
    (["--kind", "chat", "--duration", "1m", "--rate", "nan"], "--rate"),
    (["--kind", "chat", "--duration", "1m", "--rate", "1e300"], "synth makes at most"),
    (["--kind", "chat", "--duration", "1m", "--rate", "1", "--param", "turns=-3"], "turns"),
    (["--kind", "chat", "--duration", "1m", "--rate", "1", "--param", "turns=nan"], "turns"),
    (["--kind", "agentic", "--duration", "1m", "--rate", "1", "--param",
      "system_prompt_tokens=inf"], "system_prompt_tokens"),
    (["--kind", "random", "--num-prompts", "1000000000"], "num_prompts"),
    (["--kind", "random", "--isl", "-5"], "isl"),
    (["--kind", "random", "--rate", "-1"], "--rate"),
    (["--kind", "rag", "--duration", "1m", "--rate", "1", "--param", "zipf_a=0"], "zipf_a"),
])
def test_synth_refuses_bad_numbers_in_one_line(tmp_path: pathlib.Path, args: list[str],
                                               says: str) -> None:
    out = tmp_path / "s.parquet"
    code, output = _invoke("trace", "synth", *args, "-o", str(out))
    assert code == 2, output
    # one error line: ours, or Click's for an option value it refuses (after its usage hint)
    errors = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and says in errors[0], output
    assert "Traceback" not in output
    assert not out.exists()


@pytest.mark.parametrize("fmt", [[], ["--format", "mooncake"], ["--format", "openai-jsonl"]])
def test_ingesting_a_parquet_trace_says_so_without_binary(tmp_path: pathlib.Path,
                                                          fmt: list[str]) -> None:
    code, out = _invoke("ingest", str(TRACE), "-o", str(tmp_path / "o.parquet"), *fmt)
    assert code == 2, out
    assert "is a Parquet file" in out and "PAR1" not in out and "\ufffd" not in out


def test_binary_input_is_named_binary(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "blob.bin"
    src.write_bytes(bytes(range(256)) * 4)
    code, out = _invoke("ingest", str(src), "-o", str(tmp_path / "o.parquet"))
    assert code == 2 and "binary data, not a text log" in out and "\ufffd" not in out


def test_stdin_and_pipes_say_what_to_do(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TUNER_SALT": "test-salt"}
    for args in (["ingest", "-", "-o", "o.parquet"],
                 ["ingest", "-", "-o", "o.parquet", "--format", "mooncake"],
                 ["ingest", "/dev/stdin", "-o", "o.parquet"]):
        done = subprocess.run([sys.executable, "-c", "from tuner.cli import main; main()",
                               *args], input=MOONCAKE.read_bytes()[:2000], cwd=tmp_path,
                              env=env, capture_output=True)
        err = done.stderr.decode()
        assert done.returncode == 2, err
        assert "save the input to a file first" in err and "seekable" not in err, err


@pytest.mark.parametrize("content,mode,says", [
    (b"abc", 0o600, "the salt has 3 bytes"),
    (b"0123456789abcdef0123456789abcdef", 0o644, "readable by other users (mode 0644)"),
])
def test_weak_salt_is_warned_about(tmp_path: pathlib.Path, content: bytes, mode: int,
                                   says: str) -> None:
    salt = tmp_path / "salt"
    salt.write_bytes(content)
    salt.chmod(mode)
    env = {k: v for k, v in os.environ.items() if k != "TUNER_SALT"}
    res = CliRunner(env={**env, "TUNER_SALT": ""}).invoke(
        cli, ["ingest", str(MOONCAKE), "-o", str(tmp_path / "o.parquet"), "--salt-file",
              str(salt)])
    assert res.exit_code == 0, res.output
    assert f"Warning: " in res.output and says in res.output


def test_a_good_salt_is_not_warned_about(tmp_path: pathlib.Path) -> None:
    salt = tmp_path / "salt"
    salt.write_bytes(b"0123456789abcdef0123456789abcdef")
    salt.chmod(0o600)
    res = CliRunner(env={"TUNER_SALT": ""}).invoke(
        cli, ["ingest", str(MOONCAKE), "-o", str(tmp_path / "o.parquet"), "--salt-file",
              str(salt)])
    assert res.exit_code == 0 and "Warning" not in res.output, res.output
