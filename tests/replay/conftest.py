"""Fixtures for replay tests."""

from __future__ import annotations

import pytest
from replay_traces import make_requests

from tuner.trace import TraceRequest


@pytest.fixture
def small_requests() -> list[TraceRequest]:
    return make_requests()
