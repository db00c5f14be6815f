"""Command registration (filled in by its stage)."""

from __future__ import annotations

import click


def register(cli: click.Group) -> None:
    """Add this module's commands to ``cli``."""
