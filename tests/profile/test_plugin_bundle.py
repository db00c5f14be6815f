"""The plugin bundle's contents (tests/vllm/test_plugin_bundle_envs.py loads it in vLLM)."""

from __future__ import annotations

import ast
import pathlib
import stat
import sys

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.profile.plugin_bundle import PACKAGE_DIR, plugin_modules

REPO = pathlib.Path(__file__).resolve().parents[2]
PROFILE = REPO / "profiles" / "agentic-mi355x.yaml"


def test_export_plugin_dir_writes_the_modules_and_the_lines(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "plugin"
    result = CliRunner().invoke(cli, ["export", str(PROFILE), "--format", "plugin",
                                      "-o", str(folder)])
    assert result.exit_code == 0, result.output
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    expected = sorted([".tuner-plugin", "README.txt", "tuner/__init__.py",
                       *(f"tuner/{m.split('.')[1]}.py" for m in plugin_modules())])
    assert names == expected
    for name in names:
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o644, name
    assert (folder / "tuner" / "vllm_plugin.py").read_bytes() == (
        PACKAGE_DIR / "vllm_plugin.py").read_bytes()
    lines = result.output.splitlines()
    assert f"export PYTHONPATH={folder}${{PYTHONPATH:+:$PYTHONPATH}}" in lines
    assert "    --scheduler-cls tuner.vllm_plugin.CacheAwareAsyncScheduler \\" in lines
    assert "--additional-config '{\"cache_aware_admission_window\": " in result.output
    readme = (folder / "README.txt").read_text()
    assert f"export PYTHONPATH={folder}" in readme and "Needs only vLLM" in readme


def test_bundled_modules_need_only_vllm_and_the_standard_library() -> None:
    for name in plugin_modules():
        path = PACKAGE_DIR / f"{name.split('.')[1]}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for mod in mods:
                top = mod.split(".")[0]
                assert top in ("tuner", "vllm", "__future__") or top in sys.stdlib_module_names, (
                    f"{path.name} imports {mod}")


def test_plugin_output_that_is_a_file_is_refused(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "plugin"
    target.write_text("x")
    result = CliRunner().invoke(cli, ["export", str(PROFILE), "--format", "plugin",
                                      "-o", str(target)])
    assert result.exit_code == 2
    assert "is a file; this output is a folder" in result.output


@pytest.mark.parametrize("fmt", ["flags", "yaml"])
def test_export_to_a_file(tmp_path: pathlib.Path, fmt: str) -> None:
    out = tmp_path / f"p.{fmt}"
    result = CliRunner().invoke(cli, ["export", str(PROFILE), "--format", fmt, "-o", str(out)])
    assert result.exit_code == 0, result.output
    printed = CliRunner().invoke(cli, ["export", str(PROFILE), "--format", fmt]).stdout
    assert out.read_text() == printed
    result = CliRunner().invoke(cli, ["export", str(PROFILE), "--format", fmt,
                                      "-o", str(PROFILE)])
    assert result.exit_code == 2 and "is also an input" in result.output
