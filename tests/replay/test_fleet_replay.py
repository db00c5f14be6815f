"""Data-parallel deployments and fleets through ``tuner.replay.run`` and ``tuner replay``.

The issue's "done when" checks on synthetic traffic (numbers in docs/twin-vs-vllm.md):
DP 2 against DP 1 on an overloaded trace and at equal per-engine load, the routers' hit
rates on a multi-turn trace over 4 replicas, and the CLI's flags, JSON and errors.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tuner import replay
from tuner.cli import cli
from tuner.metrics import summarize
from tuner.perf.target import Target
from tuner.sim.fleet import RouterSettings
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.trace.store import write_trace
from tuner.trace.synth import synthesize

H200_8B = {"hardware": "h200", "model": "llama-3.1-8b", "tp": 1}


@pytest.fixture(scope="module")
def chat():
    """Two minutes of multi-turn chat at 20 requests/s (2,256 requests, sessions known)."""
    return synthesize("chat", duration_s=120, rate=20, seed=5)


def _summary(trace, load=OpenLoop(), router=RouterSettings(), **target):
    result = replay.run(trace, target=Target(**{**H200_8B, **target}), load=load,
                        router=router)
    return summarize(result), result


def test_dp2_cuts_the_ttft_of_an_overloaded_trace(chat):
    """At 4x speed one H200 falls behind (the queue grows); two DP ranks keep up."""
    one, _ = _summary(chat, OpenLoop(speedup=4))
    two, result = _summary(chat, OpenLoop(speedup=4), dp=2)
    assert one.queue_growth_per_s > 10
    assert two.ttft_p90_s < 0.1 * one.ttft_p90_s
    assert two.num_gpus == 2 and len(two.engines) == 2
    assert abs(two.engines[0].num_requests - two.engines[1].num_requests) < 0.1 * len(
        result.requests)


@pytest.mark.parametrize("concurrency", [16, 64])
def test_dp2_gives_the_throughput_per_gpu_of_dp1_at_equal_load(concurrency):
    """Each engine at the same load (a closed loop of C requests on one engine, 2C on
    two): output throughput per GPU within 5 %."""
    trace = synthesize("random", num_prompts=600, isl=2048, osl=256, range_ratio=0.5,
                       seed=5)
    one, _ = _summary(trace, ClosedLoop(concurrency))
    two, _ = _summary(trace, ClosedLoop(2 * concurrency), dp=2)
    assert two.output_throughput_per_gpu == pytest.approx(one.output_throughput_per_gpu,
                                                          rel=0.05)


def test_routers_hit_rates_on_a_multi_turn_trace_with_4_replicas():
    """Round-robin scatters a session's turns; prefix-aware (KV events) finds their
    cached prefix; session affinity keeps every turn on one replica and reaches the
    trace's ideal hit rate. (Half the module's chat: the same two minutes at 10
    requests/s, 1,157 requests, enough sessions to return to a replica.)"""
    chat = synthesize("chat", duration_s=120, rate=10, seed=5)
    rates = {}
    for policy in ("round-robin", "prefix-aware", "session"):
        summary, _ = _summary(chat, replicas=4, router=RouterSettings(policy))
        rates[policy] = summary.prefix_cache_hit_rate
        assert summary.num_gpus == 4 and len(summary.engines) == 4
    assert rates["prefix-aware"] > rates["round-robin"] + 0.05
    assert rates["session"] >= rates["prefix-aware"] - 0.01
    heavier, _ = _summary(chat, replicas=4,
                          router=RouterSettings("prefix-aware", overlap_weight=8.0))
    assert heavier.prefix_cache_hit_rate > rates["prefix-aware"]


def test_one_engine_keeps_the_single_engine_simulator(chat):
    from tuner.sim.engine import Simulator

    backend = replay.prepare(chat, target=Target(**H200_8B))
    try:
        assert type(backend._simulator) is Simulator
    finally:
        backend.close()


# ----------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def chat_path(tmp_path_factory, chat):
    return str(write_trace(tmp_path_factory.mktemp("fleet") / "chat.parquet",
                           list(chat.requests())[:300], chat.metadata))


def invoke(*args):
    return CliRunner().invoke(cli, ["replay", *args], catch_exceptions=False)


BASE = ["--hardware", "h200", "--model", "llama-3.1-8b"]


def test_cli_fleet_json_and_engine_column(tmp_path, chat_path):
    out = tmp_path / "rows.parquet"
    res = invoke(chat_path, *BASE, "--data-parallel-size", "2", "--replicas", "2",
                 "--router", "prefix-aware", "--router-overlap-weight", "2", "--json",
                 "--out", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["num_gpus"] == 4
    assert data["router"] == {"policy": "prefix-aware", "overlap_weight": 2.0,
                              "block_size": 0}
    assert [e["engine"] for e in data["engines"]] == [0, 1, 2, 3]
    assert sum(e["num_requests"] for e in data["engines"]) == 300
    assert "TP1 x DP2 x 2 replicas" in data["target"]
    engines = pq.read_table(out).column("engine").to_pylist()
    assert sorted(set(engines)) == [0, 1, 2, 3]


def test_cli_prints_the_per_engine_table(chat_path):
    res = invoke(chat_path, *BASE, "--dp", "2")
    assert res.exit_code == 0, res.output
    assert "Per engine (replica x DP rank)" in res.output


@pytest.mark.parametrize("args, error", [
    (["--router", "session"], "Error: --router session needs --replicas > 1"),
    (["--replicas", "2", "--router-overlap-weight", "2"],
     "Error: --router-overlap-weight applies to --router prefix-aware only"),
    (["--replicas", "2", "--router", "least-loaded", "--router-block-size", "32"],
     "Error: --router-block-size applies to --router prefix-aware only"),
    (["--replicas", "2", "--router", "prefix-aware", "--router-block-size", "24"],
     "Error: router block_size=24 must be a multiple of the KV block size 16"),
    (["--enable-expert-parallel"],
     "Error: --enable-expert-parallel: llama-3.1-8b is not a mixture-of-experts model"),
    (["--replicas", "2", "--backend", "vllm-core"],
     "Error: --backend vllm-core replays one deployment; --replicas and --router run on "
     "the sim backend"),
])
def test_cli_fleet_errors_are_one_line(chat_path, args, error):
    res = CliRunner().invoke(cli, ["replay", chat_path, *BASE, *args])
    assert res.exit_code == 2, res.output
    assert res.output.startswith(error), res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def test_cli_session_router_on_a_trace_without_sessions(tmp_path):
    trace = synthesize("random", num_prompts=40, isl=256, osl=16, seed=1)
    path = str(write_trace(tmp_path / "random.parquet", list(trace.requests()),
                           trace.metadata))
    res = CliRunner().invoke(cli, ["replay", path, *BASE, "--replicas", "2",
                                   "--router", "session"])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("Error: --router session: the trace has no session ids")


def test_per_engine_figures_follow_the_measurement_window(chat):
    """Under a window the per-engine request counts, hits and preemptions are recounted
    from the table's engine column; they add up to the deployment's."""
    result = replay.run(chat, target=Target(**H200_8B, replicas=2),
                        router=RouterSettings("session"))
    whole = summarize(result)
    windowed = summarize(result, measure_from_s=60.0)
    assert sum(e.num_requests for e in whole.engines) == whole.num_requests == 2256
    assert sum(e.num_requests for e in windowed.engines) == windowed.num_requests < 2256
    assert sum(e.prefix_cache_hits for e in windowed.engines) == windowed.prefix_cache_hits
    assert sum(e.prefix_cache_queries for e in windowed.engines) == \
        windowed.prefix_cache_queries
    assert [e.num_steps for e in windowed.engines] == [e.num_steps for e in whole.engines]
    single = summarize(replay.run(chat, target=Target(**H200_8B)))
    assert len(single.engines) == 1 and single.engines[0].num_requests == 2256
    assert single.engines[0].prefix_cache_hit_rate == single.prefix_cache_hit_rate


def test_the_sim_backend_takes_router_settings_only() -> None:
    """One typed router from the CLI to the fleet: a dict form is read where it is loaded
    (a profile, a study's record), never repacked by the backend."""
    from tuner.errors import ConfigError

    trace = synthesize("chat", duration_s=5, rate=2, seed=1)
    with pytest.raises(ConfigError, match="expected RouterSettings"):
        replay.run(trace, target=Target(**H200_8B, replicas=2), router={"policy": "session"})
    result = replay.run(trace, target=Target(**H200_8B, replicas=2),
                        router=RouterSettings("session"))
    assert len(result.requests) == len(trace)
