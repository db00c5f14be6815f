"""Trace report: per-request ideal reuse agrees with trace_stats; the page has its charts."""

from __future__ import annotations

import pathlib

import pytest

from tuner.report import trace_report, write_page
from tuner.report.trace_report import trace_columns
from tuner.trace import TraceRequest, read_trace, trace_stats
from tuner.trace.schema import TraceMetadata
from tuner.trace.store import Trace


def test_ideal_hits_match_trace_stats(small_trace: pathlib.Path) -> None:
    trace = read_trace(small_trace)
    cols = trace_columns(trace)
    stats = trace_stats(trace)
    assert len(cols.arrival_s) == stats.requests
    assert cols.ideal_hit_tokens.sum() == stats.ideal_hit_tokens
    assert cols.ideal_hit_tokens.sum() / cols.input_len.sum() == pytest.approx(
        stats.ideal_prefix_hit_rate)
    assert (cols.ideal_hit_tokens <= cols.input_len).all()


def test_ideal_hits_by_hand() -> None:
    # r0 presents blocks 1,2 (+ output block 9): nothing before it -> 0. r1 leads with
    # 1,2,9 (9 from r0's output) then a new block -> 3 blocks = 48 tokens. r2 leads with a
    # seen hash (identity only, as trace_stats counts) -> 16; r2's own blocks never count.
    reqs = [TraceRequest(request_id="r0", arrival_s=0.0, input_len=40, output_len=20,
                         block_hashes=(1, 2), output_block_hashes=(9,)),
            TraceRequest(request_id="r1", arrival_s=1.0, input_len=70, output_len=5,
                         block_hashes=(1, 2, 9, 7)),
            TraceRequest(request_id="r2", arrival_s=2.0, input_len=20, output_len=5,
                         block_hashes=(2,))]
    trace = Trace.from_requests(reqs, TraceMetadata(hash_block_size=16, source_format="test"))
    assert trace_columns(trace).ideal_hit_tokens.tolist() == [0, 48, 16]


def test_trace_page(small_trace: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = write_page(trace_report(small_trace), tmp_path / "t.html")
    html = out.read_text()
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg"') == 5
    for title in ("Arrival rate over time", "Prompt length distribution",
                  "Output length distribution", "Prefix reuse over time",
                  "Per-request prefix reuse"):
        assert f"<h3>{title}</h3>" in html
    assert "<script" not in html
    assert oct(out.stat().st_mode & 0o777) != oct(0o600)  # readable by others (umask)
    assert not list(tmp_path.glob(".*tuner-tmp"))  # no temp file left behind
