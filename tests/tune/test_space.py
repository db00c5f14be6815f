"""Search spaces: built-ins, YAML spaces and their errors, refusal of combinations vLLM rejects."""

from __future__ import annotations

import pathlib

import optuna
import pytest

from tuner.errors import ConfigError
from tuner.sim.settings import SchedulerSettings
from tuner.tune.space import (ADMISSION_WINDOW_CHOICES, admission_space, load_space,
                              scheduler_space, space_from_dict)


def test_admission_space_includes_window_zero_and_the_defaults() -> None:
    space = admission_space()
    assert space.names == ("cache_aware_admission_window", "cache_aware_admission_threshold")
    assert ADMISSION_WINDOW_CHOICES[0] == 0 and ADMISSION_WINDOW_CHOICES[-1] == 256
    for gib in (48, 80, 288):
        assert space.contains(space.project(SchedulerSettings.vllm_defaults(gib)))


def test_scheduler_space_contains_vllm_defaults_for_every_gpu_size() -> None:
    space = scheduler_space()
    assert set(space.names) >= {"prefill_schedule_interval", "max_num_batched_tokens",
                                "max_num_seqs", "long_prefill_token_threshold", "watermark",
                                "scheduler_reserve_full_isl"}
    for gib in (48, 80, 288):
        assert space.contains(space.project(SchedulerSettings.vllm_defaults(gib)))
    dists = space.distributions()
    assert dists["max_num_batched_tokens"].log is True


def test_settings_for_refuses_what_vllm_rejects() -> None:
    space = scheduler_space()
    base = SchedulerSettings()
    params = space.project(base) | {"max_num_batched_tokens": 512, "max_num_seqs": 1024}
    with pytest.raises(ConfigError, match="max_num_batched_tokens .512. must be greater"):
        space.settings_for(base, params)
    ok = space.settings_for(base, params | {"max_num_seqs": 256})
    assert ok.max_num_seqs == 256
    with pytest.raises(ConfigError, match="long_prefill_token_threshold .16384. exceeds"):
        space.settings_for(base, {"long_prefill_token_threshold": 16384}, max_model_len=8192)


def test_suggest_draws_inside_the_space() -> None:
    space = scheduler_space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(30):
        trial = study.ask()
        params = space.suggest(trial)
        assert space.contains(params), params
        study.tell(trial, 0.0)


def test_yaml_space_round_trip(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("""
name: mine
params:
  cache_aware_admission_window: {type: categorical, choices: [0, 8, 32]}
  cache_aware_admission_threshold: {type: float, low: 0.2, high: 0.8, step: 0.1}
  max_num_batched_tokens: {type: int, low: 2048, high: 32768, log: true}
  watermark: {type: float, low: 0.0, high: 0.1}
  scheduler_reserve_full_isl: {type: categorical, choices: [true, false]}
  policy: {type: categorical, choices: [fcfs, priority]}
""")
    space = load_space(path)
    assert space.name == "mine"
    assert space.names[0] == "cache_aware_admission_window"
    again = space_from_dict(space.to_dict())
    assert again == space


@pytest.mark.parametrize("body, message", [
    ("params: {nope: {type: int, low: 1, high: 2}}", "params.nope: not a SchedulerSettings field"),
    ("params: {watermark: {type: float, low: 0.0, high: 1.5}}",
     r"params.watermark.high: watermark=1.5 must be in \[0, 1\)"),
    ("params: {max_num_seqs: {type: float, low: 1, high: 8}}",
     "params.max_num_seqs.type: max_num_seqs is an integer field"),
    ("params: {max_num_seqs: {type: int, low: 8, high: 8}}", r"low \(8\) must be < high \(8\)"),
    ("params: {max_num_seqs: {type: int, low: 8, high: 64, log: true, step: 2}}",
     "'log' and 'step' cannot be combined"),
    ("params: {max_num_seqs: {type: int, low: 0, high: 64, log: true}}",
     "a log scale needs low > 0"),
    ("params: {max_num_seqs: {type: int, low: 1, high: 64, lo: 2}}", r"unknown key\(s\) \['lo'\]"),
    ("params: {policy: {type: categorical, choices: [fcfs, lifo]}}",
     "params.policy.choices: policy='lifo' must be"),
    ("params: {scheduler_reserve_full_isl: {type: int, low: 0, high: 1}}", "use categorical"),
    ("params: {cache_aware_admission_window: {type: categorical, choices: []}}",
     "choices: must be a non-empty list"),
    ("params: {}", "'params' must be a non-empty mapping"),
    ("prams: {}", r"unknown top-level key\(s\) \['prams'\]"),
    ("params: [", "invalid YAML"),
])
def test_bad_yaml_space_names_file_and_key(tmp_path: pathlib.Path, body: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError, match=message) as info:
        load_space(path)
    assert str(path) in str(info.value)


def test_unknown_space_name() -> None:
    with pytest.raises(ConfigError, match="unknown search space 'admision'"):
        load_space("admision")
