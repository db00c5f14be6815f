"""The README's two fresh-machine commands stay the contract that .ci/run and the CLI honour."""

from __future__ import annotations

import pathlib
import re
import shlex

import click
import pytest
from click.testing import CliRunner

from tuner.cli import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _bash_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    test_command = _bash_blocks()[1]
    assert "pytest" in test_command and "[test]" in test_command
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci_lines, ".ci/run must run the README's test command verbatim"


@pytest.mark.parametrize("index", [0, 1])
def test_readme_commands_use_real_options(index: int) -> None:
    """Every `tuner ...` step of the two commands parses with the real CLI (--help stops it)."""
    for step in _bash_blocks()[index].split("&&"):
        words = shlex.split(step.strip())
        if not words or not words[0].endswith("/tuner"):
            continue
        args = words[1:]
        cmd_path = [a for a in args[:2] if not a.startswith("-")][:2]
        group = cli
        for name in cmd_path:
            sub = getattr(group, "commands", {}).get(name)
            if sub is None:
                break
            group = sub
        try:
            group.make_context(group.name or "tuner", args[len(cmd_path):])
        except click.BadParameter:
            pass  # a file the command's earlier steps create (e.g. /tmp/mooncake.parquet)
        except click.UsageError as exc:  # unknown option, missing argument, bad choice
            pytest.fail(f"README step `{step.strip()}`: {exc}")
        result = CliRunner().invoke(cli, [*cmd_path, "--help"])
        assert result.exit_code == 0
