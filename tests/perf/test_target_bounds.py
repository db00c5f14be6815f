"""A deployment the twin cannot hold is refused before anything is built for it (issue:
``--replicas 10000`` / ``--dp 10000`` allocated ~4.8 MB per engine, 48 GB, and ended in a
MemoryError traceback)."""

from __future__ import annotations

import pathlib

import pytest

from tests.bounded import run_tuner
from tuner.errors import ConfigError
from tuner.perf.target import MAX_ENGINES, Target, max_engines

REPO = pathlib.Path(__file__).resolve().parents[2]
TRACE = REPO / "traces" / "agentic_1h.parquet"


@pytest.mark.parametrize("kw,says", [
    ({"replicas": 10_000}, "10,000 engines"),
    ({"dp": 10_000}, "10,000 engines"),
    ({"dp": 100, "replicas": 100}, "10,000 engines"),
    ({"tp": 100_000}, "--tp 100000"),
    ({"tp": 0}, "--tp 0"),
    ({"replicas": 2.5}, "--replicas 2.5"),
])
def test_oversized_deployment_is_refused(kw: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("+", r"\+")):
        Target(**kw)


def test_the_cap_follows_the_memory_limit() -> None:
    assert 1 <= max_engines() <= MAX_ENGINES
    Target(dp=2, replicas=2)  # ordinary fleets pass


@pytest.mark.parametrize("option", [["--replicas", "10000"], ["--dp", "10000"],
                                    ["--replicas", "100", "--dp", "100"]])
def test_replay_refuses_in_one_line_under_a_memory_cap(tmp_path: pathlib.Path,
                                                       option: list[str]) -> None:
    run = run_tuner("replay", str(TRACE), "--model", "llama-3.1-8b", *option, cwd=tmp_path,
                    memory_mb=1500, timeout_s=120)
    assert not run.timed_out and not run.traceback, run.output[-3000:]
    assert run.returncode == 2, run.output[-3000:]
    assert run.output.strip().splitlines()[-1].startswith("Error: --dp ")
    assert "engines: this machine can model at most" in run.output
