"""trace_stats by hand, slice_trace windows, and the synthesizer's determinism and shape."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from tuner.errors import ConfigError
from tuner.trace import (
    Trace, TraceMetadata, TraceRequest, format_trace_stats, read_trace, slice_trace, stats_rows,
    synthesize, trace_stats,
)

META = TraceMetadata(hash_block_size=10, source_format="test")


def _small() -> Trace:
    return Trace.from_requests([
        TraceRequest("a", 0.0, 25, 20, (1, 2, 3), (4, 5), session_id="s", turn=1),
        # Repeats a's prompt + output: 1 2 (full) then 4 5 (a's output blocks) then new.
        TraceRequest("b", 10.0, 60, 5, (1, 2, 4, 5, 6, 7), session_id="s", turn=2,
                     parent_id="a"),
        TraceRequest("c", 20.0, 15, 1, (1, 9), status="aborted"),
        TraceRequest("d", 80.0, 5, 1, (8,)),
    ], META)


def test_stats_by_hand() -> None:
    s = trace_stats(_small())
    # a: 0; b: 4 blocks seen (1, 2 from a's prompt, 4, 5 from a's output) = 40 tokens;
    # c: block 1 = 10 tokens; d: 0. Prompt tokens 25 + 60 + 15 + 5 = 105.
    assert s.ideal_hit_tokens == 50
    assert s.ideal_prefix_hit_rate == pytest.approx(50 / 105)
    assert s.requests == 4 and s.duration_s == 80.0
    assert s.distinct_blocks == 9 and s.distinct_block_tokens == 90
    assert s.sessions == 1 and s.turns_per_session_max == 2
    assert s.arrival_rate_peak_per_min == 3 and s.failed_or_aborted == 1
    assert s.input_len_mean == pytest.approx(26.25) and s.output_len_max == 20
    # Reuse distances: b's 4 hits come from a (10 s); c's hit was last used by b (10 s).
    assert s.reuse_distance_p50_s == 10.0 and s.reuse_distance_p99_s == 10.0
    d = s.to_dict()
    for key in ("requests", "duration_s", "input_len_mean", "output_len_mean",
                "ideal_prefix_hit_rate", "distinct_blocks"):
        assert key in d


def test_stats_text_by_hand() -> None:
    # the figures of test_stats_by_hand, as `tuner trace stats` prints them: 4 arrivals
    # over 80 s, input mean 26.25 -> 26, hit rate 50/105, 9 distinct 10-token blocks
    text = format_trace_stats(trace_stats(_small()))
    assert text.splitlines() == [
        "requests               4",
        "span                   80.0 s",
        "arrival rate           0.05/s mean, 3/min peak",
        "input tokens           mean 26, p50 20, p90 50, p99 59, max 60",
        "output tokens          mean 7, p50 3, p90 16, p99 20, max 20",
        "sessions               1 (2.0 turns mean, 2 max)",
        "ideal prefix-hit rate  0.4762 (unbounded cache)",
        "distinct KV blocks     9 x 10 tokens = 90 tokens",
        "reuse distance         p50 10.0 s, p90 10.0 s, p99 10.0 s",
    ]
    rows = stats_rows(trace_stats(_small()))
    assert [k for k, _ in rows] == [line[:21].rstrip() for line in text.splitlines()]


def test_hit_capped_at_input_len() -> None:
    t = Trace.from_requests([TraceRequest("a", 0, 25, 1, (1, 2, 3)),
                             TraceRequest("b", 1, 25, 1, (1, 2, 3))], META)
    assert trace_stats(t).ideal_hit_tokens == 25


def test_slice_windows_and_speedup() -> None:
    t = _small()
    cut = slice_trace(t, start_s=5, end_s=80)
    assert [r.request_id for r in cut.requests()] == ["b", "c"]
    assert [r.arrival_s for r in cut.requests()] == [5.0, 15.0]
    fast = slice_trace(t, start_s=0, end_s=30, speedup=2.0)
    assert [r.arrival_s for r in fast.requests()] == [0.0, 5.0, 10.0]
    last = slice_trace(t, last_s=60)
    assert [r.request_id for r in last.requests()] == ["c", "d"]
    assert last.time_range() == (0.0, 60.0)
    with pytest.raises(ConfigError, match="either --last or --start"):
        slice_trace(t, start_s=1, last_s=5)
    with pytest.raises(ConfigError, match="no requests"):
        slice_trace(t, start_s=30, end_s=40)
    with pytest.raises(ConfigError, match="speedup"):
        slice_trace(t, speedup=0)


def test_slice_moves_origin() -> None:
    t = Trace.from_requests(_small().requests(), META.replace(origin_utc="2026-11-29T00:00:00+00:00"))
    assert slice_trace(t, start_s=3600 * 0 + 10).metadata.origin_utc == "2026-11-29T00:00:10+00:00"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", ["agentic", "chat", "rag"])
def test_synth_is_byte_identical(tmp_path: Path, kind: str) -> None:
    a = synthesize(kind, duration_s=120, rate=3, seed=5)
    b = synthesize(kind, duration_s=120, rate=3, seed=5)
    a.write(tmp_path / "a.parquet")
    b.write(tmp_path / "b.parquet")
    assert _digest(tmp_path / "a.parquet") == _digest(tmp_path / "b.parquet")
    c = synthesize(kind, duration_s=120, rate=3, seed=6)
    assert c.fingerprint() != a.fingerprint()
    assert len(read_trace(tmp_path / "a.parquet")) == len(a) > 0


def test_synth_agentic_turns_extend_previous_turn() -> None:
    trace = synthesize("agentic", duration_s=600, rate=4, seed=1, hash_block_size=64)
    rows = trace.requests()
    by_id = {r.request_id: r for r in rows}
    checked = 0
    for r in rows:
        prev = by_id.get(r.parent_id) if r.parent_id else None
        if prev is None or r.input_len < prev.input_len:  # session start or compaction
            continue
        n = prev.input_len // 64
        cached = prev.block_hashes[:n] + prev.output_block_hashes
        assert r.block_hashes[:len(cached)] == cached
        assert len(prev.output_block_hashes) == (prev.input_len + prev.output_len) // 64 - n
        assert r.input_len > prev.input_len + prev.output_len - 1
        assert r.arrival_s > prev.arrival_s
        checked += 1
    assert checked > 100
    s = trace_stats(trace)
    assert 0.8 < s.ideal_prefix_hit_rate < 0.99
    assert s.sessions > 10 and all(len(r.block_hashes) == -(-r.input_len // 64) for r in rows)
    # Shared system prompts: sessions of one variant share their first blocks.
    firsts = {r.block_hashes[0] for r in rows if r.turn == 1}
    assert 1 <= len(firsts) <= 4


def test_synth_random_lengths_and_unique_prompts() -> None:
    t = synthesize("random", isl=8192, osl=1024, range_ratio=0.8, num_prompts=640, seed=3)
    rows = t.requests()
    inp = np.array([r.input_len for r in rows])
    out = np.array([r.output_len for r in rows])
    assert len(rows) == 640 and all(r.arrival_s == 0.0 for r in rows)
    assert inp.min() >= 6553 and inp.max() <= 8192 and out.min() >= 819 and out.max() <= 1024
    assert 7100 < inp.mean() < 7600  # uniform on [6553, 8192]: mean ~7372
    assert trace_stats(t).ideal_prefix_hit_rate == 0.0
    paced = synthesize("random", num_prompts=100, rate=10.0, seed=3)
    assert 5 < paced.time_range()[1] < 20


def test_synth_rag_shares_popular_documents() -> None:
    s = trace_stats(synthesize("rag", duration_s=300, rate=5, seed=2))
    assert 0.3 < s.ideal_prefix_hit_rate < 0.95


def test_synth_errors() -> None:
    with pytest.raises(ConfigError, match="unknown synth kind"):
        synthesize("video", duration_s=1, rate=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs a positive duration"):
        synthesize("agentic", rate=1)
    with pytest.raises(ConfigError, match="unknown agentic parameter"):
        synthesize("agentic", duration_s=10, rate=1, bogus=3)
    with pytest.raises(ConfigError, match="range-ratio"):
        synthesize("random", range_ratio=1.5)
