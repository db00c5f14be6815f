"""``export`` does what it says or refuses (issue: ``--check-vllm /nonexistent/python``
passed as "skipped"; a plugin for ``--vllm-version 0.30.0``/``0.99.0`` contradicted its own
README (0.32-0.33); ``--kv-cache-dtype fp8_ds_mla`` on a non-MLA model was accepted)."""

from __future__ import annotations

import pathlib

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.perf.target import Target

REPO = pathlib.Path(__file__).resolve().parents[2]
PROFILE = REPO / "profiles" / "agentic-mi355x.yaml"


def _invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    return res.exit_code, res.output


@pytest.mark.parametrize("python", ["/nonexistent/python", "/bin/false", "/bin/true"])
def test_a_requested_vllm_check_that_cannot_run_fails(python: str) -> None:
    code, out = _invoke("export", str(PROFILE), "--check-vllm", python)
    assert code != 0, out
    assert "vLLM check: failed" in out and "skipped" not in out


@pytest.mark.parametrize("version", ["0.30.0", "0.31.1", "0.99.0", "0.34.0"])
def test_plugin_for_an_unchecked_release_is_refused(tmp_path: pathlib.Path, version: str) -> None:
    code, out = _invoke("export", str(PROFILE), "--format", "plugin", "--vllm-version", version,
                        "-o", str(tmp_path / "plugin"))
    assert code == 2, out
    assert f"vLLM {version}: tuner's scheduler plugin" in out and "0.32 and 0.33" in out
    assert not (tmp_path / "plugin").exists()


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_plugin_for_checked_releases_passes(tmp_path: pathlib.Path, version: str) -> None:
    code, out = _invoke("export", str(PROFILE), "--format", "plugin", "--vllm-version", version)
    assert code == 0, out


def test_fp8_ds_mla_needs_an_mla_model() -> None:
    from tuner.perf.presets import resolve_target

    with pytest.raises(ConfigError, match="fp8_ds_mla is the FP8 layout of MLA"):
        resolve_target(Target(model="llama-3.1-8b", kv_cache_dtype="fp8_ds_mla"))
    code, out = _invoke("replay", str(REPO / "traces" / "agentic_1h.parquet"), "--model",
                        "llama-3.1-8b", "--kv-cache-dtype", "fp8_ds_mla")
    assert code == 2 and "use fp8" in out


def test_a_failed_vllm_check_writes_nothing(tmp_path: pathlib.Path) -> None:
    """The check runs before the export is written: a failed check leaves no file behind
    (it used to write the export and then fail)."""
    out_file = tmp_path / "serve.sh"
    code, out = _invoke("export", str(PROFILE), "--check-vllm", "/nonexistent/python",
                        "-o", str(out_file))
    assert code != 0 and "vLLM check: failed" in out, out
    assert not out_file.exists()
