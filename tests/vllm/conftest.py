"""Fixtures for tests that need a vLLM environment (helpers in ``vllm_env.py``)."""

from __future__ import annotations

import pytest
from vllm_env import vllm_python


@pytest.fixture(params=["0.33", "0.32"])
def any_vllm(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(version, python) for each vLLM environment; skipped when its env var is unset."""
    return request.param, vllm_python(request.param)
