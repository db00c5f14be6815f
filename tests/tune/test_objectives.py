"""Objective and constraint parsing."""

from __future__ import annotations

import pytest

from tuner.errors import ConfigError
from tuner.tune.objectives import (Constraint, Objective, parse_constraints, parse_objectives)


def test_default_objectives_maximise_interactivity_and_throughput() -> None:
    assert parse_objectives(None) == (Objective("p90_interactivity", "maximize"),
                                      Objective("output_throughput_per_gpu", "maximize"))


def test_directions_inferred_or_given() -> None:
    objs = parse_objectives("ttft_p90_s,prefix_cache_hit_rate,kv_usage_mean:min")
    assert [o.direction for o in objs] == ["minimize", "maximize", "minimize"]
    assert parse_objectives(["preemptions:max"])[0].direction == "maximize"
    with pytest.raises(ConfigError, match="write it as kv_usage_mean:max or kv_usage_mean:min"):
        parse_objectives("kv_usage_mean")
    with pytest.raises(ConfigError, match="direction must be max or min"):
        parse_objectives("ttft_p90_s:down")
    with pytest.raises(ConfigError, match="not a replay metric"):
        parse_objectives("speed:max", known=["p90_interactivity"])


def test_constraints_parse_and_violation_sign() -> None:
    (ttft, hit) = parse_constraints(["ttft_p90_s<=2.0", "prefix_cache_hit_rate >= 0.5"])
    assert ttft == Constraint("ttft_p90_s", "<=", 2.0)
    assert ttft.violation({"ttft_p90_s": 1.5}) == -0.5
    assert ttft.violation({"ttft_p90_s": 2.5}) == 0.5
    assert hit.violation({"prefix_cache_hit_rate": 0.75}) == -0.25
    assert ttft.violation({"ttft_p90_s": float("nan")}) > 0
    assert ttft.violation({}) > 0
    for bad in ("ttft_p90_s<2", "ttft_p90_s<=fast", "<=2"):
        with pytest.raises(ConfigError, match="KEY<=NUMBER"):
            parse_constraints([bad])
