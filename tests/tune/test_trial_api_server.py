"""Tuning trials are summarised behind vLLM's API server (tuner/perf/api_server.py):
their TTFT is the client's and the record says how loaded the server was; the target's
``api_server_count`` decides it (0: the engine's own figures)."""

from __future__ import annotations

import dataclasses
import pathlib

from tuner.perf.target import Target
from tuner.tune import ReplayEvaluator

TARGET = Target(hardware="mi355x", model="llama-3.1-70b", tp=8, num_gpu_blocks=1500)


def test_trial_records_the_api_server(small_trace: pathlib.Path) -> None:
    served = ReplayEvaluator(small_trace, target=dataclasses.replace(TARGET, api_server_count=2))
    bare = ReplayEvaluator(small_trace, target=dataclasses.replace(TARGET, api_server_count=0))
    a = served.evaluate(served.default_settings, "train")
    b = bare.evaluate(bare.default_settings, "train")
    assert a["api_server_servers"] == 2 and 0 < a["api_server_utilisation"] < 1
    assert "api_server_utilisation" not in b
    assert a["ttft_mean_s"] > b["ttft_mean_s"]  # intake and the first token's way out
    assert a["num_finished"] == b["num_finished"]  # the engine ran the same replay
    # unloaded, the server adds about one intake and one token's way out, not seconds
    assert a["ttft_mean_s"] - b["ttft_mean_s"] < 0.05
