"""A tiny real study for the report tests: a synthesized agentic trace, the twin, a few
trials (about 10 s on one core), plus its profile next to the study journal."""

from __future__ import annotations

import pathlib

import pytest

from tuner.profile import save_profile
from tuner.perf.target import Target
from tuner.trace import synthesize

#: A KV cache small enough that the admission window changes the outcome.
TARGET = Target(hardware="mi355x", model="llama-3.1-70b", tp=8, num_gpu_blocks=800)


def make_trace(path: pathlib.Path) -> pathlib.Path:
    trace = synthesize("agentic", duration_s=120.0, rate=3.0, seed=1, hash_block_size=16,
                       system_prompt_tokens=(2000, 4000), task_tokens=500,
                       tool_output_tokens=600, output_tokens=150, think_time_s=5.0)
    trace.write(path)
    return path


@pytest.fixture(scope="session")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return make_trace(tmp_path_factory.mktemp("report-trace") / "agentic.parquet")


@pytest.fixture(scope="session")
def small_study(tmp_path_factory: pytest.TempPathFactory,
                small_trace: pathlib.Path) -> pathlib.Path:
    """The profile path; its journal (``small.optuna-journal``) lies next to it."""
    from tuner.profile import profile_of
    from tuner.tune import SearchOptions, StudyOutput, TuneInputs, tune

    out = tmp_path_factory.mktemp("report-study") / "small.yaml"
    result = tune(TuneInputs(small_trace, target=TARGET),
                  SearchOptions(n_trials=8, seed=0, n_survivors=4), output=StudyOutput(output=out))
    save_profile(profile_of(result, "small"), out)
    return out
