"""Every command has --help with an example, as the developers' guide requires."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from tuner.cli import cli


def _walk(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, cmd in sorted(group.commands.items()):
        path = prefix + (name,)
        yield path, cmd
        if isinstance(cmd, click.Group):
            yield from _walk(cmd, path)


COMMANDS = list(_walk(cli))


def test_top_level_lists_command_groups() -> None:
    out = CliRunner().invoke(cli, ["--help"]).output
    for name in ("ingest", "trace", "replay", "tune", "export"):
        assert name in out


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=" ".join)
def test_help_has_example(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output, f"`tuner {' '.join(path)} --help` has no Example block"


def test_version() -> None:
    from tuner import __version__

    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output
