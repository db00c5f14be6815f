"""A replay priced from aiconfigurator-core's measured tables (``--step-time-source aic``)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from tuner import replay
from tuner.metrics import summarize
from tuner.perf.presets import resolve_target
from tuner.perf.target import Target

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("aiconfigurator_core") is None,
    reason="aiconfigurator-core not installed (pip install -e '.[aic]')")


def test_a_replay_on_h200_with_the_tables_differs_from_analytic(small_requests):
    finish = {}
    for source in ("analytic", "aic"):
        target = Target(hardware="h200", model="llama-3.1-8b", block_size=16,
                        num_gpu_blocks=4000, step_time_source=source)
        result = replay.run(small_requests, target=target, hash_block_size=16)
        assert summarize(result).num_finished == len(small_requests)
        finish[source] = [r.finish_s for r in result.requests]
        assert resolve_target(target).step_time_source.split()[0] == source
    assert finish["aic"] != finish["analytic"]


def test_replay_json_names_the_source(tmp_path, small_requests):
    from tuner.cli import cli
    from tuner.trace import TraceMetadata, write_trace

    trace = write_trace(tmp_path / "trace.parquet", small_requests,
                        TraceMetadata(hash_block_size=16, source_format="synth:test"))
    out = CliRunner().invoke(cli, ["replay", str(trace), "--hardware", "h200", "--model",
                                   "llama-3.1-8b", "--step-time-source", "aic", "--json",
                                   "--no-progress"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["step_time_source"].startswith("aic (h200_sxm vLLM ")
    assert data["target"].endswith(data["step_time_source"])
