"""The API server in front of a replay's engine (tuner/perf/api_server.py): a replay's
summary prices it on the client side, with the benchmark fit's costs, and says how loaded
it was; ``--api-server-count`` matters; the engine's records do not change."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from tuner import replay
from tuner.metrics import summarize
from tuner.perf import api_server as api
from tuner.perf.fit import benchmark_rows
from tuner.perf.target import Target
from tuner.trace.schema import TraceRequest

TARGET = Target(hardware="h200", model="llama-3.1-8b", tp=1)


def _burst(n: int, isl: int, osl: int) -> list[TraceRequest]:
    return [TraceRequest(request_id=f"r{i}", arrival_s=0.0, input_len=isl, output_len=osl,
                         block_hashes=tuple(range(i * 1000, i * 1000 + isl // 16)),
                         output_block_hashes=()) for i in range(n)]


@pytest.fixture(scope="module")
def burst():
    """1,000 short prompts at once on an 8B model: ~26k output tokens/s at 40 µs each
    is more than one API server process can stream."""
    return replay.run(_burst(1000, 128, 512), None, target=TARGET, hash_block_size=16)


def test_one_costs_for_fit_and_replay():
    assert benchmark_rows.API_SERVER is api.API_SERVER
    cost = api.api_server_cost(None, dp=2, replicas=3)
    assert cost.servers == 6 and cost.output_token_s == api.API_SERVER.output_token_s
    assert api.api_server_cost(0) is None
    assert api.replay_api_server(TARGET, "vllm-serve") is None  # its own server, measured


def test_saturated_server_raises_ttft_and_says_so(burst):
    engine = summarize(burst)
    one = summarize(burst, api_server=api.api_server_cost(1))
    four = summarize(burst, api_server=api.api_server_cost(4))
    assert engine.api_server is None
    block = one.api_server
    assert block["servers"] == 1 and block["utilisation"] > 0.95  # saturated
    assert block["stretch"] == pytest.approx(max(1.0, block["utilisation"]))
    assert block["engine_ttft_mean_s"] == pytest.approx(engine.ttft_mean_s)
    assert one.ttft_mean_s > 1.15 * engine.ttft_mean_s
    assert one.output_throughput < 0.95 * engine.output_throughput
    assert one.tpot_p50_s > engine.tpot_p50_s
    # four processes share the work: a quarter of the load, TTFT within 2 % of the engine's
    assert four.api_server["utilisation"] == pytest.approx(block["utilisation"] / 4, rel=1e-9)
    assert four.ttft_mean_s < 1.02 * engine.ttft_mean_s
    assert four.ttft_mean_s < one.ttft_mean_s


def test_burst_waits_for_the_tokeniser():
    """Lindley's recursion: requests arriving together leave one intake apart."""
    cost = api.api_server_cost(1)
    clock = api.ClientClock(cost, api.ServerLoad(0.0, 0.0, 1.0), 0.0)
    arrival = np.zeros(5)
    isl = np.full(5, 1000.0)
    done = clock.intake_done(arrival, isl)
    step = cost.intake_s(np.array([1000.0]))[0]
    assert np.allclose(done, step * np.arange(1, 6))
    # the next chunk queues behind the last one; a late arrival finds the server idle
    assert np.allclose(clock.intake_done(np.array([0.0, 10.0]), np.array([1000.0, 1000.0])),
                       [6 * step, 10.0 + step])
    # an engine that admits a request after its intake ends hides the intake queue
    late = api.ClientClock(cost, api.ServerLoad(0.0, 0.0, 1.0), 0.0)
    assert np.allclose(late.delays(arrival, np.full(5, 1.0), isl), 0.0)


def test_engine_records_unchanged(burst):
    """The server is a layer on the summary: the replay itself is the engine's."""
    again = replay.run(_burst(1000, 128, 512), None,
                       target=Target(hardware="h200", model="llama-3.1-8b", tp=1,
                                     api_server_count=0), hash_block_size=16)
    a = [(r.first_token_s, r.finish_s) for r in burst.requests]
    b = [(r.first_token_s, r.finish_s) for r in again.requests]
    assert a == b


def test_cli_reports_and_counts(tmp_path):
    from replay_traces import make_requests
    from tuner.cli import cli
    from tuner.trace.schema import TraceMetadata
    from tuner.trace.store import write_trace

    meta = TraceMetadata(hash_block_size=32, source_format="synth:test")
    path = str(write_trace(tmp_path / "t.parquet", make_requests(20, hbs=32), meta))
    base = ["replay", path, "--hardware", "mi355x", "--model", "llama-3.1-8b",
            "--block-size", "16", "--num-gpu-blocks", "4000"]
    runner = CliRunner()
    res = runner.invoke(cli, base + ["--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["api_server"]["servers"] == 1 and data["api_server"]["utilisation"] > 0
    assert data["ttft_mean_s"] > data["api_server"]["engine_ttft_mean_s"]
    res = runner.invoke(cli, base + ["--json", "--api-server-count", "0"])
    assert json.loads(res.output)["api_server"] is None
    res = runner.invoke(cli, base + ["--api-server-count", "2"])
    assert res.exit_code == 0 and "API server: 2 process(es)" in res.output
    res = runner.invoke(cli, base + ["--api-server-count", "-1"])
    assert res.exit_code != 0 and "--api-server-count" in res.output


def test_profile_records_and_exports_the_count():
    import dataclasses

    import yaml

    from tuner.profile import Profile, ProfileTarget, export_profile
    from tuner.profile.model import profile_from_dict
    from tuner.sim.settings import SchedulerSettings

    target = ProfileTarget(hardware="h200", model="llama-3.1-8b", tp=1, num_gpus=1,
                           api_server_count=4)
    profile = Profile(name="api", scheduler=SchedulerSettings.vllm_defaults(141), target=target)
    assert profile_from_dict(profile.to_dict()).target.api_server_count == 4
    assert "--api-server-count 4" in export_profile(profile, "flags")
    assert yaml.safe_load(export_profile(profile, "yaml"))["api-server-count"] == 4
    default = dataclasses.replace(profile, target=dataclasses.replace(target,
                                                                      api_server_count=None))
    assert "api_server_count" not in default.to_dict()["target"]  # older files unchanged
    assert "api-server-count" not in export_profile(default, "flags")


@pytest.mark.parametrize("step_s", [0.5, 1e-4])
def test_a_closed_loop_replacement_s_intake_runs_during_its_missed_step(step_s):
    """A closed loop's replacement is sent when its predecessor finishes and misses the
    engine step scheduled then (docs/step-time-model.md §1.4); the server tokenises it
    meanwhile, so it reaches the client's clock at the later of the two, not both: a
    step longer than the intake hides it (0.5 s), a shorter one (0.1 ms against the
    ~8.5 ms a 4,000-token prompt takes) leaves the rest of the intake (``client_ttft_s``'s
    rule in the benchmark fit). 300 output tokens keep the replacements apart, so the
    server has no queue when each comes."""
    from tuner.sim.engine import Simulator
    from tuner.sim.load import ClosedLoop
    from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

    isl = 4000
    reqs = [TraceRequest(request_id=f"r{i}", arrival_s=0.0, input_len=isl,
                         output_len=3000 if i == 0 else 300,
                         block_hashes=tuple(range(i * 1000, i * 1000 + isl // 16)),
                         output_block_hashes=()) for i in range(6)]
    result = Simulator(reqs, SchedulerSettings(), CacheSettings(num_gpu_blocks=2000),
                       lambda batch: step_s, load=ClosedLoop(2),
                       options=SimOptions(fast_forward=False)).run()
    rows = list(result.requests)
    assert all(r.status == "finished" for r in rows)
    arrival = np.array([r.arrival_s for r in rows])
    first_sched = np.array([r.first_scheduled_s for r in rows])
    cost = api.api_server_cost(1)
    delay = api.ClientClock(cost, api.ServerLoad(0.0, 0.0, 1.0), 0.0).delays(
        arrival, first_sched, np.full(len(rows), float(isl)))
    intake = float(cost.intake_s(np.array([float(isl)]))[0])
    for r, d in list(zip(rows, delay))[2:]:  # the replacements, request 0 still running
        assert r.first_scheduled_s == pytest.approx(r.arrival_s + step_s, abs=1e-12)
        assert r.first_scheduled_s + d == pytest.approx(r.arrival_s + max(step_s, intake))
