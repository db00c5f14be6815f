"""``tuner calibrate`` / ``tuner validate``: argument errors (no server needed)."""

from __future__ import annotations

import pathlib

from click.testing import CliRunner

from tuner.cli import cli

TRACE_DIR = pathlib.Path(__file__).resolve().parents[1] / "data" / "trace"


def _invoke(args: list[str]):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def test_commands_have_help_with_an_example() -> None:
    for name in ("calibrate", "validate"):
        result = _invoke([name, "--help"])
        assert result.exit_code == 0
        assert "Example" in result.output and "tuner " + name in result.output


def test_calibrate_needs_exactly_one_server_source(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = _invoke(["calibrate", "-o", str(tmp_path / "c.yaml")])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        "Error: use exactly one of --endpoint URL (attach) or --launch (start vllm serve)")
    result = _invoke(["calibrate", "--endpoint", "http://127.0.0.1:1", "--launch",
                      "-o", str(tmp_path / "c.yaml")])
    assert result.exit_code == 2
    assert not (tmp_path / "c.yaml").exists()


def test_calibrate_rejects_a_bad_probe_spec(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = _invoke(["calibrate", "--endpoint", "http://127.0.0.1:1", "--mixed", "8x128",
                      "-o", str(tmp_path / "c.yaml")])
    assert result.exit_code == 2
    assert "Error: --mixed '8x128': expected NxLxP" in result.output


def test_calibrate_unreachable_endpoint_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = _invoke(["calibrate", "--endpoint", "http://127.0.0.1:1", "--hardware",
                      "h100", "--model", "llama-3.1-8b", "-o", str(tmp_path / "c.yaml")])
    assert result.exit_code == 2
    assert "Error: cannot reach the server at http://127.0.0.1:1" in result.output
    assert not (tmp_path / "c.yaml").exists()


def test_launch_without_a_vllm_python_names_the_flag(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for var in ("TUNER_VLLM_PYTHON", "TUNER_VLLM032_PYTHON"):
        monkeypatch.delenv(var, raising=False)
    result = _invoke(["calibrate", "--launch", "-o", str(tmp_path / "c.yaml")])
    assert result.exit_code == 2
    assert "Error: launching vllm serve needs --vllm-python PATH" in result.output
