"""The CPU KV tier through the replay path: the stream's hash-id renumbering keeps the
tier's keys, the summary reports the tier, and bad flags are one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]


def _step(batch) -> float:
    return 0.002 + 2e-6 * batch.num_tokens


def _replay(path: str, trace, tier):
    from tuner.replay._kv_requests import kv_request_ids, load_trace_arrays
    from tuner.replay._stream import TraceArrivals
    from tuner.sim.engine import Simulator
    from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

    if path == "stream":
        requests = TraceArrivals(trace, 16, window=8, min_compact_ids=1 << 10)
    else:
        requests = kv_request_ids(load_trace_arrays(trace), trace.metadata.hash_block_size, 16)
    cache = CacheSettings(block_size=16, num_gpu_blocks=3000, max_model_len=131072)
    sim = Simulator(requests, SchedulerSettings(), cache, _step,
                    options=SimOptions(kv_offload=tier),
                    num_hash_ids=getattr(requests, "num_hash_ids", None))
    result = sim.run()
    return requests, result


def test_renumbering_keeps_the_cpu_tier(tmp_path: Path) -> None:
    """The streamed replay renumbers hash ids under a full CPU tier and gives the
    records the whole-trace interning gives (a dropped tier key would lose hits)."""
    from tuner.sim.kv_connector.settings import OffloadSettings
    from tuner.trace import read_trace, slice_trace

    trace = slice_trace(read_trace(ROOT / "traces" / "agentic_1h.parquet"), 0.0, 8.0)
    tier = OffloadSettings(num_chunks=6000, bytes_per_block=1 << 18, load_bytes_per_s=50e9,
                           store_bytes_per_s=50e9, latency_s=1e-5)
    stream, a = _replay("stream", trace, tier)
    _, b = _replay("interned", trace, tier)
    assert stream.num_renumberings > 0
    assert a.counters["kv_offload_external_hits"] > 0  # the tier served hits
    assert a.counters == b.counters
    assert repr(list(a.requests)) == repr(list(b.requests))


def test_summary_reports_the_tier(mooncake_head_trace: Path) -> None:
    from tuner.metrics import summarize
    from tuner.perf.target import Target
    from tuner.replay import run

    target = Target(hardware="mi355x", model="llama-3.1-8b", num_gpu_blocks=400,
                    kv_offloading_size=4.0)
    result = run(mooncake_head_trace, target=target)
    s = summarize(result)
    assert s.kv_offload is not None
    assert s.kv_offload["cpu_chunks"] == int(4 * 2**30) // (16 * 131072)  # 8B: 128 KiB/token
    assert s.kv_offload["combined_hit_rate"] >= s.prefix_cache_hit_rate
    assert summarize(run(mooncake_head_trace, target=Target(
        hardware="mi355x", model="llama-3.1-8b", num_gpu_blocks=400))).kv_offload is None


@pytest.mark.parametrize("args, message", [
    (["--kv-offloading-size", "8", "--replicas", "2"], "one engine only"),
    (["--kv-offloading-size", "0"], "--kv-offloading-size"),
    (["--kv-offloading-size", "8", "--kv-offloading-eviction-policy", "fifo"], "fifo"),
])
def test_bad_tier_flags_are_one_line_errors(mooncake_head_trace: Path, args, message) -> None:
    from tuner.cli import cli

    res = CliRunner().invoke(cli, ["replay", str(mooncake_head_trace), "--model",
                                   "llama-3.1-8b", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
