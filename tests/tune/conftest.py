from __future__ import annotations

import pathlib
import sys

import pytest

# tests/tune/fake.py and tracegen.py are imported as modules of the tests package path.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from tests.tune.fake import FakeEvaluator  # noqa: E402
from tests.tune.tracegen import write_small_trace  # noqa: E402


@pytest.fixture
def fake() -> FakeEvaluator:
    return FakeEvaluator()


@pytest.fixture(scope="session")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return write_small_trace(tmp_path_factory.mktemp("trace") / "small.parquet")
