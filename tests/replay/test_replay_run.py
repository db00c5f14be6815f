"""tuner.replay.run end to end on the twin, on small hand-built traces."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tuner import replay
from tuner.errors import ConfigError
from tuner.metrics import itl_samples_from_steps, summarize, weighted_percentile
from tuner.replay import Backend, ideal_hit_rate, reblock_request
from tuner.replay import _backend
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.perf.presets import resolve_target
from tuner.sim.settings import SchedulerSettings, SimOptions
from tuner.perf.target import Target
from tuner.trace import TraceRequest

from replay_traces import make_requests

SMALL = Target(hardware="h200", model="llama-3.1-8b", tp=1, block_size=16, num_gpu_blocks=4000)
CHECKED = SimOptions(check_invariants=True)


def _wall_free(summary) -> dict:
    d = summary.to_dict()
    for key in ("wall_s", "speed_ratio"):
        d.pop(key)
    return d


def test_every_request_finishes_with_its_output_length(small_requests):
    result = replay.run(small_requests, target=SMALL, hash_block_size=16, options=CHECKED)
    assert [r.request_id for r in result.requests] == [r.request_id for r in small_requests]
    for src, got in zip(small_requests, result.requests):
        assert got.status == "finished"
        assert got.output_len == src.output_len
        assert got.arrival_s == pytest.approx(src.arrival_s)
        assert got.arrival_s <= got.first_scheduled_s < got.first_token_s <= got.finish_s
    s = summarize(result)
    assert s.num_finished == len(small_requests)
    # every generated token but the first is one pooled gap
    assert sum(c for _, c in result.itl_samples) == sum(r.output_len - 1 for r in small_requests)


def test_tiny_cache_preempts_and_still_finishes_exactly():
    requests = make_requests(40, seed=3, spacing_s=0.0)  # all at t=0: maximum pressure
    tiny = dataclasses.replace(SMALL, num_gpu_blocks=40)
    settings = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=16)
    result = replay.run(requests, settings, target=tiny, hash_block_size=16, options=CHECKED)
    s = summarize(result)
    assert s.preemptions > 0
    finished = [r for r in result.requests if r.status == "finished"]
    rejected = [r for r in result.requests if r.status == "rejected"]
    assert len(finished) + len(rejected) == len(requests)
    by_id = {r.request_id: r for r in requests}
    assert all(r.output_len == by_id[r.request_id].output_len for r in finished)
    # rejected: a sequence longer than the whole cache (39 usable blocks of 16 tokens)
    assert all(by_id[r.request_id].input_len + by_id[r.request_id].output_len - 1 > 39 * 16
               for r in rejected)


def test_unbounded_cache_hit_rate_equals_ideal_with_last_token_rule(small_requests):
    """Unbounded cache, one request at a time: the twin's hit rate is the attainable ideal.

    The ideal counts leading full 16-token blocks already seen (prompt blocks and the
    output blocks earlier requests completed); vLLM's last-token rule then caps a fully
    cached prompt one block short: here 3 requests are exactly a cached system prompt.
    """
    ideal = ideal_hit_rate(small_requests, block_size=16)
    assert ideal.attainable_hits < ideal.full_block_hits  # the rule does bite in this trace
    result = replay.run(small_requests, target=SMALL, hash_block_size=16,
                        load=ClosedLoop(1), options=CHECKED)
    s = summarize(result)
    assert s.prefix_cache_queries == ideal.prefix_cache_queries
    assert s.prefix_cache_hits == ideal.attainable_hits
    assert s.prefix_cache_hit_rate == ideal.attainable_rate
    # the counter (vLLM's count at first admission) equals the per-request sum
    assert s.prefix_cache_hits == sum(r.num_cached_tokens for r in result.requests)


def test_unbounded_hit_rate_equals_trace_stats_ideal_minus_last_token_rule():
    """Against ``tuner trace stats``' ideal rate (an independent implementation): with
    whole-block prompts the only difference is vLLM's last-token rule, which takes exactly
    one block from every prompt that is entirely cached already."""
    from tuner.trace.schema import TraceMetadata
    from tuner.trace.stats import trace_stats
    from tuner.trace.store import Trace

    requests = make_requests(40, seed=11, aligned=True)
    stats = trace_stats(Trace.from_requests(requests, TraceMetadata(
        hash_block_size=16, source_format="synth:test")))
    seen: set[int] = set()
    fully_cached = 0
    for r in requests:
        fully_cached += all(h in seen for h in r.block_hashes)
        seen.update(r.block_hashes)
    assert fully_cached >= 2
    result = replay.run(requests, target=SMALL, hash_block_size=16, load=ClosedLoop(1))
    s = summarize(result)
    assert s.prefix_cache_queries == sum(r.input_len for r in requests)
    assert s.prefix_cache_hits == stats.ideal_hit_tokens - 16 * fully_cached
    assert s.prefix_cache_hit_rate == pytest.approx(
        stats.ideal_prefix_hit_rate - 16 * fully_cached / s.prefix_cache_queries, abs=1e-15)


def test_unbounded_hit_rate_through_reblocking():
    """A trace hashed at 64 tokens replayed at 16: same rule after re-blocking."""
    coarse = make_requests(25, seed=5, hbs=64)
    result = replay.run(coarse, target=SMALL, hash_block_size=64, load=ClosedLoop(1))
    kv = [reblock_request(r, 64, 16) for r in coarse]
    assert all(len(r.block_hashes) == r.input_len // 16 for r in kv)
    assert summarize(result).prefix_cache_hits == ideal_hit_rate(kv, block_size=16).attainable_hits


def test_open_loop_overlap_can_only_lose_hits(small_requests):
    """At trace times, a request admitted while its prefix is still being prefilled hits
    only what is already scheduled, so the rate is at most the attainable ideal."""
    result = replay.run(small_requests, target=SMALL, hash_block_size=16)
    assert summarize(result).prefix_cache_hits <= ideal_hit_rate(
        small_requests, block_size=16).attainable_hits


def test_determinism(small_requests):
    a = summarize(replay.run(small_requests, target=SMALL, hash_block_size=16))
    b = summarize(replay.run(list(small_requests), target=SMALL, hash_block_size=16))
    assert _wall_free(a) == _wall_free(b)


def test_closed_loop_keeps_concurrency_and_issues_in_order(small_requests):
    result = replay.run(small_requests, target=SMALL, hash_block_size=16, load=ClosedLoop(1))
    reqs = result.requests
    assert max(result.timeseries["num_running"]) == 1
    for prev, nxt in zip(reqs, reqs[1:]):  # issued when the previous one finished
        assert nxt.arrival_s == pytest.approx(prev.finish_s)
    four = replay.run(small_requests, target=SMALL, hash_block_size=16, load=ClosedLoop(4))
    running = four.timeseries["num_running"]
    assert max(running) == 4
    assert max(n + w for n, w in zip(running, four.timeseries["num_waiting"])) <= 4


def test_open_loop_speedup_compresses_arrivals(small_requests):
    base = replay.run(small_requests, target=SMALL, hash_block_size=16)
    fast = replay.run(small_requests, target=SMALL, hash_block_size=16, load=OpenLoop(speedup=4))
    for r, f in zip(base.requests, fast.requests):
        assert f.arrival_s == pytest.approx(r.arrival_s / 4)


def test_step_records_rebuild_the_pooled_itl(small_requests):
    """Per-request gaps rebuilt from step records pool to exactly the twin's ITL pool."""
    result = replay.run(small_requests, target=SMALL, hash_block_size=16,
                        options=SimOptions(record_steps=True))
    rebuilt = itl_samples_from_steps(result.steps, result.requests)
    pooled = [g for gaps in rebuilt.values() for g in gaps]
    assert sum(c for _, c in pooled) == sum(c for _, c in result.itl_samples)
    for q in (1, 50, 90, 99):
        assert weighted_percentile(pooled, q) == pytest.approx(
            weighted_percentile(result.itl_samples, q), rel=1e-12)
    for r in result.requests:  # and per request they reproduce its mean ITL
        gaps = rebuilt[r.request_id]
        assert len(gaps) == r.output_len - 1
        if gaps:
            assert sum(g for g, _ in gaps) / len(gaps) == pytest.approx(r.mean_itl_s)


# ------------------------------------------------------------------ what run() hands a backend


class _Capture(Backend):
    name = "capture"
    seen: dict = {}

    def prepare(self, requests, settings, target, load, options):
        _Capture.seen = dict(requests=list(requests), settings=settings, target=target, load=load)

    def run(self, progress=None):
        raise ConfigError("capture backend stops here")

    def close(self):
        _Capture.seen["closed"] = True


@pytest.fixture
def capture(monkeypatch):
    monkeypatch.setattr(_backend, "_REGISTRY", dict(_backend._REGISTRY))
    replay.register_backend("capture", _Capture)
    return _Capture


def test_run_defaults_reblocking_and_close(capture):
    coarse = make_requests(6, seed=1, hbs=64)
    with pytest.raises(ConfigError, match="capture backend stops here"):
        replay.run(coarse, target=SMALL, backend="capture", hash_block_size=64)
    seen = capture.seen
    assert seen["closed"] is True  # close() runs even when run() raised
    assert seen["settings"] == resolve_target(SMALL).default_settings  # None -> GPU defaults
    assert isinstance(seen["load"], OpenLoop) and seen["load"].speedup == 1.0
    assert seen["target"].cache.block_size == 16
    for src, got in zip(coarse, seen["requests"]):
        assert got.block_hashes == reblock_request(src, 64, 16).block_hashes
        assert len(got.block_hashes) == src.input_len // 16


def test_run_reads_trace_files(tmp_path, capture):
    from tuner.trace.schema import TraceMetadata
    from tuner.trace.store import write_trace

    reqs = make_requests(5, seed=2, hbs=32)
    path = write_trace(tmp_path / "t.parquet", reqs, TraceMetadata(hash_block_size=32,
                                                                   source_format="synth:test"))
    with pytest.raises(ConfigError):
        replay.run(str(path), target=SMALL, backend="capture")
    assert [r.block_hashes for r in capture.seen["requests"]] == [
        reblock_request(r, 32, 16).block_hashes for r in reqs]


def test_run_errors():
    with pytest.raises(ConfigError, match="no requests"):
        replay.run([], target=SMALL)
    with pytest.raises(ConfigError, match="unknown backend 'warp'; available: .*sim"):
        replay.run(make_requests(2), target=SMALL, backend="warp", hash_block_size=16)
    bad = SchedulerSettings(enable_chunked_prefill=False, max_num_batched_tokens=2048,
                            max_num_seqs=256)
    with pytest.raises(ConfigError, match="chunked prefill disabled"):
        replay.run(make_requests(2), bad, target=SMALL, hash_block_size=16)
    with pytest.raises(ConfigError, match="cannot re-block from 24-token to 16-token blocks"):
        replay.run(make_requests(2, hbs=24), target=SMALL, hash_block_size=24)


def test_ideal_hit_rate_by_hand():
    B = 16
    a = TraceRequest("a", 0.0, 40, 9, (1, 2, 3), (4,))  # 2 full prompt blocks; stream 49 tok
    b = TraceRequest("b", 1.0, 32, 1, (1, 2))  # exactly a's first two blocks
    c = TraceRequest("c", 2.0, 60, 5, (1, 2, 4, 9))  # a's prompt blocks + a's output block
    d = TraceRequest("d", 3.0, 50, 1, (1, 7, 8, 9))  # diverges after one block
    got = ideal_hit_rate([a, b, c, d], block_size=B)
    # a: 0. b: 32 seen -> capped at (32-1)//16*16 = 16. c: a left floor(48/16)=3 blocks
    # (1, 2, 4) -> 48, cap (59//16)*16 = 48. d: 16.
    assert got.prefix_cache_queries == 40 + 32 + 60 + 50
    assert got.full_block_hits == 0 + 32 + 48 + 16
    assert got.attainable_hits == 0 + 16 + 48 + 16
    assert got.attainable_rate == pytest.approx(80 / 182)
    # a request longer than max_model_len is skipped (the engine rejects it)
    assert ideal_hit_rate([a, b], block_size=B, max_model_len=40).num_requests == 1
    assert math.isclose(ideal_hit_rate([], block_size=B).attainable_rate, 0.0)
