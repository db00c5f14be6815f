"""parse_settings: --set strings -> validated SchedulerSettings."""

from __future__ import annotations

import pytest

from tuner.errors import ConfigError
from tuner.replay import parse_settings
from tuner.sim.settings import SchedulerSettings


def test_types_and_spellings():
    s = parse_settings(["cache_aware_admission_window=16", "max-num-seqs=256",
                        "cache_aware_admission_threshold=0.25", "scheduling_policy=priority",
                        "enable_chunked_prefill=off", "max_num_batched_tokens=16_384"])
    assert s.cache_aware_admission_window == 16 and isinstance(s.cache_aware_admission_window, int)
    assert s.max_num_seqs == 256
    assert s.cache_aware_admission_threshold == 0.25
    assert s.policy == "priority"
    assert s.enable_chunked_prefill is False
    assert s.max_num_batched_tokens == 16384


def test_base_kept_and_last_assignment_wins():
    base = SchedulerSettings(max_num_batched_tokens=2048, max_num_seqs=256)
    s = parse_settings(["watermark=0.1", "watermark=0.05"], base)
    assert s.watermark == 0.05
    assert s.max_num_batched_tokens == 2048 and s.max_num_seqs == 256
    assert parse_settings([], base) == base


@pytest.mark.parametrize("items, message", [
    (["foo=1"], "--set 'foo=1': unknown scheduler setting 'foo'; known: max_num_batched_tokens"),
    (["max_num_seqs=abc"], "--set max_num_seqs='abc': expected an integer"),
    (["max_num_seqs=1.5"], "--set max_num_seqs='1.5': expected an integer"),
    (["watermark=x"], "--set watermark='x': expected a number"),
    (["enable_chunked_prefill=maybe"], "expected a boolean"),
    (["policy=lifo"], "--set policy='lifo': must be one of fcfs, priority"),
    (["window"], "--set 'window': expected FIELD=VALUE"),
    (["watermark=1.5"], "watermark=1.5 must be in [0, 1)"),
    (["cache_aware_admission_threshold=2"], "cache_aware_admission_threshold=2.0 must be in [0, 1]"),
    (["max_num_seqs=0"], "max_num_seqs=0 must be >= 1"),
    (["max_num_seqs=9000"], "must be greater than or equal to max_num_seqs (9000)"),
])
def test_errors_name_field_and_range(items, message):
    with pytest.raises(ConfigError) as info:
        parse_settings(items)
    assert message in str(info.value)
