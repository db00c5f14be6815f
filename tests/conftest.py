"""Suite-wide test setup.

* The repository root goes on ``sys.path``, so every test can import ``tests.envs`` (the one
  place that decides whether a missing environment skips or fails).
* Every test marked ``vllm`` (it runs code in a vLLM environment: importing vLLM alone takes
  10-30 s, a server 35-120 s) is also ``slow``, so ``pytest -m "not slow"`` is the quick
  local loop even where the vLLM environments are exported. CI runs everything.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("vllm") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
