"""Disaggregated prefill/decode through the replay path and ``tuner replay --pd``: the
stream's renumbering keeps the pools' records, the summary reports the pools and the
TTFT split, mixed pools resolve, and bad flags are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
PD_LINK = dict(bytes_per_token_rank=131072, link_bytes_per_s=45e9, link_latency_s=3e-5)


def _step(batch) -> float:
    return 0.002 + 2e-6 * batch.num_tokens


def _replay(path: str, trace):
    from tuner.replay._kv_requests import kv_request_ids, load_trace_arrays
    from tuner.replay._stream import TraceArrivals
    from tuner.sim.disagg import PDSettings
    from tuner.sim.disagg.simulator import PDPool, PDSimulator
    from tuner.sim.settings import CacheSettings, SchedulerSettings

    if path == "stream":
        requests = TraceArrivals(trace, 16, window=8, min_compact_ids=1 << 10)
    else:
        requests = kv_request_ids(load_trace_arrays(trace), trace.metadata.hash_block_size, 16)
    cache = CacheSettings(block_size=16, num_gpu_blocks=3000, max_model_len=131072)
    pool = PDPool(SchedulerSettings(), cache, _step)
    sim = PDSimulator(requests, pool, pool, PDSettings(num_prefill=1, num_decode=2, **PD_LINK),
                      num_hash_ids=getattr(requests, "num_hash_ids", None))
    return requests, sim.run()


def test_streamed_pd_replay_renumbers_and_matches_the_interned_one() -> None:
    from tuner.trace import read_trace, slice_trace

    trace = slice_trace(read_trace(ROOT / "traces" / "agentic_1h.parquet"), 0.0, 8.0)
    stream, a = _replay("stream", trace)
    _, b = _replay("interned", trace)
    assert stream.num_renumberings > 0
    assert a.counters["pd_decode_local_hit_tokens"] > 0
    assert a.counters == b.counters
    assert repr(list(a.requests)) == repr(list(b.requests))


def _cli(trace: Path, *args: str):
    from tuner.cli import cli

    return CliRunner().invoke(cli, ["replay", str(trace), "--hardware", "mi355x", "--model",
                                    "llama-3.1-8b", *args])


def test_replay_pd_json_reports_pools_and_a_ttft_split_that_adds_up(mooncake_head_trace):
    res = _cli(mooncake_head_trace, "--pd", "1:2", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    pd = out["disaggregation"]
    assert (pd["num_prefill"], pd["num_decode"], pd["num_gpus"]) == (1, 2, 3)
    assert pd["pools"]["prefill"]["utilization"] > 0 and pd["pools"]["decode"]["utilization"] > 0
    assert pd["transfers"]["reads"] == out["num_finished"]
    split = sum(part["mean"] for part in pd["ttft_split_s"].values())
    assert split == pytest.approx(out["ttft_mean_s"], rel=1e-9)
    assert pd["ttft_split_s"]["transfer"]["mean"] > 0
    # throughput per GPU counts all three GPUs
    agg = json.loads(_cli(mooncake_head_trace, "--json").output)
    assert "disaggregation" not in agg


def test_replay_pd_prints_the_pools(mooncake_head_trace):
    res = _cli(mooncake_head_trace, "--pd", "2:1", "--prefill-tp", "2")
    assert res.exit_code == 0, res.output
    assert "prefill pool: 2 x TP 2" in res.output and "decode pool: 1 x TP 1" in res.output
    assert "TTFT split (mean): prefill queue" in res.output


def test_mixed_pools_resolve_each_pool_and_cross_the_nic():
    from tuner.perf.pd_link import PDLayout, pd_settings
    from tuner.perf.presets import resolve_target
    from tuner.perf.target import Target
    from tuner.replay import pd_pools

    resolved = resolve_target(Target(hardware="mi300x", model="llama-3.1-70b", tp=8))
    layout = PDLayout(1, 1, prefill_tp=4, prefill_hardware="mi355x")
    prefill, decode = pd_pools(layout, resolved)
    assert (prefill.hardware.name, prefill.tp, decode.hardware.name, decode.tp) == \
        ("mi355x", 4, "mi300x", 8)
    pd = pd_settings(layout, prefill, decode)
    assert pd.link_name == "400 Gb/s RDMA NIC per GPU"
    assert pd.fan_in == 2.0  # 8 decode ranks read from 4 prefill ranks
    same = pd_settings(PDLayout(1, 1, prefill_tp=4, decode_tp=4), *pd_pools(
        PDLayout(1, 1, prefill_tp=4, decode_tp=4), resolve_target(
            Target(hardware="mi355x", model="llama-3.1-70b", tp=4))))
    assert same.link_name.startswith("Infinity Fabric")


@pytest.mark.parametrize("args, message", [
    (["--pd", "0:1"], "Error: --pd '0:1': expected PREFILL:DECODE"),
    (["--pd", "abc"], "Error: --pd 'abc': expected PREFILL:DECODE"),
    (["--prefill-tp", "2"], "Error: --prefill-tp applies to a disaggregated deployment only"),
    (["--pd", "1:1", "--dp", "2"], "Error: --pd with --dp or --replicas > 1"),
    (["--pd", "4:4", "--tp", "2", "--pd-link", "same-node"],
     "Error: --pd-link same-node: the deployment has 16 GPUs"),
    (["--pd", "1:1", "--prefill-hardware", "h200", "--pd-link", "same-node"],
     "Error: --pd-link same-node: the pools are different GPUs"),
])
def test_bad_pd_flags_are_one_line_errors(mooncake_head_trace, args, message):
    res = _cli(mooncake_head_trace, *args)
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines() == [res.output.strip()]
    assert message in res.output and "Traceback" not in res.output


def test_replay_pd_serve_prints_one_server_per_instance_and_the_proxy(mooncake_head_trace):
    res = _cli(mooncake_head_trace, "--pd", "1:2", "--pd-serve")
    assert res.exit_code == 0, res.output
    servers = [ln for ln in res.output.splitlines() if ln.startswith("vllm serve")]
    assert len(servers) == 3 and all("MoRIIOConnector" in s for s in servers)  # mi355x
    assert "--decoder-ports 8200 8201" in res.output
    res = _cli(mooncake_head_trace, "--pd-serve")
    assert res.exit_code == 2 and "add --pd PREFILL:DECODE" in res.output
    res = _cli(mooncake_head_trace, "--pd", "1:2", "--pd-serve", "--pd-router", "llm-d")
    assert res.exit_code == 0, res.output
    assert "kind: EndpointPickerConfig" in res.output and "toy_proxy_server" not in res.output


def test_replay_pd_router_changes_the_choices_and_is_reported(mooncake_head_trace):
    outs = {}
    for router in ("vllm-proxy", "llm-d", "dynamo"):
        res = _cli(mooncake_head_trace, "--pd", "2:2", "--pd-router", router, "--json")
        assert res.exit_code == 0, res.output
        outs[router] = json.loads(res.output)
        assert outs[router]["disaggregation"]["router"] == router
        assert any(f"{router} router" in n for n in outs[router]["notes"])
        assert outs[router]["num_finished"] == outs["vllm-proxy"]["num_finished"]
    # (which instance each router picks: tests/sim/test_pd_routers.py)
    res = _cli(mooncake_head_trace, "--pd-router", "dynamo")
    assert res.exit_code == 2 and "--pd-router applies to a disaggregated" in res.output


def test_the_prefill_pool_runs_its_own_token_budget_and_running_limit(mooncake_head_trace):
    """``--prefill-max-num-batched-tokens`` / ``--prefill-max-num-seqs`` act on the prefill
    pool alone: a 512-token budget cuts every prompt into more, smaller chunks, so prompts
    wait longer for the prefill instance (the TTFT split's prefill queue grows) while the
    decode side is untouched, and the serve commands carry each pool's own limits."""
    base = json.loads(_cli(mooncake_head_trace, "--pd", "1:1", "--json").output)
    res = _cli(mooncake_head_trace, "--pd", "1:1", "--prefill-max-num-batched-tokens", "512",
               "--prefill-max-num-seqs", "8", "--json")
    assert res.exit_code == 0, res.output
    small = json.loads(res.output)
    assert small["num_finished"] == base["num_finished"]
    def part(out, name):
        return out["disaggregation"]["ttft_split_s"][name]["mean"]

    assert part(small, "prefill_queue") > 2 * part(base, "prefill_queue")
    assert part(small, "prefill") != part(base, "prefill")
    assert small["ttft_mean_s"] > base["ttft_mean_s"]
    res = _cli(mooncake_head_trace, "--pd", "1:1", "--prefill-max-num-batched-tokens", "512",
               "--prefill-max-num-seqs", "8", "--set", "max_num_batched_tokens=4096",
               "--set", "max_num_seqs=64", "--pd-serve")
    assert res.exit_code == 0, res.output
    servers = [ln for ln in res.output.splitlines() if ln.startswith("vllm serve")]
    assert "--max-num-batched-tokens 512 --max-num-seqs 8" in servers[0]  # the prefill instance
    assert "--max-num-batched-tokens 4096 --max-num-seqs 64" in servers[1]  # the decode one


@pytest.mark.parametrize("args, message", [
    (["--prefill-max-num-seqs", "8"],
     "Error: --prefill-max-num-seqs applies to a disaggregated deployment only"),
    (["--pd", "1:1", "--prefill-max-num-batched-tokens", "16", "--prefill-max-num-seqs", "64"],
     "Error: the prefill pool's settings (--prefill-max-num-batched-tokens / "
     "--prefill-max-num-seqs): max_num_batched_tokens (16) must be greater than or equal "
     "to max_num_seqs (64)"),
])
def test_bad_prefill_limits_are_one_line_errors(mooncake_head_trace, args, message):
    res = _cli(mooncake_head_trace, *args)
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines() == [res.output.strip()]
    assert message in res.output


def test_replay_pd_push_is_recorded_and_reported(mooncake_head_trace):
    """``--pd-transfer-mode push``: the same requests finish, the prefill instance wrote
    every transfer, and the record and notes say push (pull records keep their keys)."""
    pull = json.loads(_cli(mooncake_head_trace, "--pd", "2:2", "--json").output)
    res = _cli(mooncake_head_trace, "--pd", "2:2", "--pd-transfer-mode", "push", "--json")
    assert res.exit_code == 0, res.output
    push = json.loads(res.output)
    assert push["disaggregation"]["transfer_mode"] == "push"
    assert "transfer_mode" not in pull["disaggregation"]
    assert any("NIXL push" in n for n in push["notes"])
    assert push["num_finished"] == pull["num_finished"]
    assert push["disaggregation"]["transfers"]["reads"] == push["num_finished"]
    # the PUSH_REG hop: push's transfers end later than pull's on the same requests
    assert push["disaggregation"]["ttft_split_s"]["transfer"]["mean"] != \
        pull["disaggregation"]["ttft_split_s"]["transfer"]["mean"]
    res = _cli(mooncake_head_trace, "--pd-transfer-mode", "push")
    assert res.exit_code == 2 and "--pd-transfer-mode applies to a disaggregated" in res.output


def test_replay_pd_push_serve_names_the_push_connector(mooncake_head_trace):
    from tuner.cli import cli

    res = CliRunner().invoke(cli, ["replay", str(mooncake_head_trace), "--hardware", "h200",
                                   "--model", "llama-3.1-8b", "--pd", "1:1", "--pd-serve",
                                   "--pd-transfer-mode", "push"])
    assert res.exit_code == 0, res.output
    servers = [ln for ln in res.output.splitlines() if ln.startswith("vllm serve")]
    assert len(servers) == 2 and all('"kv_connector":"NixlPushConnector"' in s
                                     for s in servers)
    res = _cli(mooncake_head_trace, "--pd", "1:1", "--pd-serve", "--pd-transfer-mode", "push")
    assert res.exit_code == 0, res.output  # mi355x: MoRIIO in its WRITE mode
    servers = [ln for ln in res.output.splitlines() if ln.startswith("vllm serve")]
    assert all('"read_mode":"false"' in s for s in servers)
