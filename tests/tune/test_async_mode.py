"""The scheduling mode a tune replays is the mode its profile deploys (issue 14 item 3)."""

from __future__ import annotations

import json
import pathlib

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.perf.target import Target
from tuner.profile import load_profile

TARGET = ["--hardware", "mi355x", "--model", "llama-3.1-70b", "--tp", "8",
          "--num-gpu-blocks", "1500"]


@pytest.mark.parametrize("flags,mode", [((), True), (("--no-async-scheduling",), False)])
def test_the_profile_records_the_mode_its_trials_replayed(small_trace: pathlib.Path,
                                                          tmp_path: pathlib.Path,
                                                          flags: tuple[str, ...],
                                                          mode: bool) -> None:
    out = tmp_path / "p.yaml"
    res = CliRunner().invoke(cli, ["tune", str(small_trace), *TARGET, *flags, "--trials", "2",
                                   "--json", "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["async_scheduling"] is mode
    profile = load_profile(out)
    assert profile.target.async_scheduling is mode
    assert ("--no-async-scheduling" in data["flags"]) is not mode


def test_a_baseline_mode_decides_unless_the_target_names_another() -> None:
    from tuner.profile.recommend import _mode_of_baseline
    from tuner.tune.baseline import parse_serve_flags

    sync = parse_serve_flags("vllm serve m --no-async-scheduling")
    assert _mode_of_baseline(sync, Target()).async_scheduling is False
    assert _mode_of_baseline(sync, Target(async_scheduling=False)).async_scheduling is False
    assert _mode_of_baseline(None, Target()).async_scheduling is None
    with pytest.raises(ConfigError, match="--baseline --no-async-scheduling disagrees with "
                                          "--async-scheduling"):
        _mode_of_baseline(sync, Target(async_scheduling=True))
