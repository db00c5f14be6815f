"""Shared fixtures for the trace tests: the data directory and a fixed test salt."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "trace"


@pytest.fixture(autouse=True)
def _test_salt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every test runs with a known salt and never touches ~/.config."""
    monkeypatch.setenv("TUNER_SALT", "test-salt")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def data() -> Path:
    return DATA
