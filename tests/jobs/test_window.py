"""Incremental ingest on its own (no tuning): rotation, truncation, compressed files."""

from __future__ import annotations

import gzip
import json
import os
import pathlib

import polars as pl

from tests.jobs.fixtures import mooncake_lines, write_lines
from tuner.jobs.state import JobState
from tuner.jobs.window import SourceSpec, expired_parts, ingest_new, remove_unlisted


def _ingest(tmp: pathlib.Path, state: JobState,
            pattern: str = "logs/*"):  # type: ignore[no-untyped-def]
    return ingest_new([SourceSpec(str(tmp / pattern), "mooncake")], state, tmp / "window",
                      tmp / "work", salt=tmp / "salt")


def _rows(tmp: pathlib.Path) -> pl.DataFrame:
    return pl.read_parquet(str(tmp / "window" / "**" / "*.parquet")).sort("arrival_s")


def test_rename_rotation_keeps_the_watermark(tmp_path: pathlib.Path) -> None:
    (tmp_path / "logs").mkdir()
    lines = mooncake_lines(40, seed=3)
    live = tmp_path / "logs" / "app.log"
    write_lines(live, lines[:20])
    state = JobState()
    assert _ingest(tmp_path, state).num_new_requests == 20
    os.rename(live, tmp_path / "logs" / "app.log.1")  # logrotate's move
    write_lines(tmp_path / "logs" / "app.log.1", lines[20:30], append=True)  # late writes
    write_lines(live, lines[30:])  # the new live file
    out = _ingest(tmp_path, state)
    assert out.num_new_requests == 20  # 10 late + 10 new, nothing twice
    assert any("renamed by rotation" in n for n in out.notes)
    assert _rows(tmp_path).height == 40


def test_truncation_restarts_from_zero_and_compressed_files_once(tmp_path: pathlib.Path) -> None:
    (tmp_path / "logs").mkdir()
    live = tmp_path / "logs" / "app.log"
    write_lines(live, mooncake_lines(30, seed=4))
    state = JobState()
    _ingest(tmp_path, state)
    write_lines(live, mooncake_lines(5, seed=5))  # truncated and rewritten, same inode
    out = _ingest(tmp_path, state)
    assert out.num_new_requests == 5 and any("truncated" in n for n in out.notes)
    with gzip.open(tmp_path / "logs" / "old.jsonl.gz", "wt") as fh:
        fh.write("".join(x + "\n" for x in mooncake_lines(7, seed=6)))
    assert _ingest(tmp_path, state).num_new_requests == 7
    assert _ingest(tmp_path, state).num_new_requests == 0
    assert state.sources[str(tmp_path / "logs" / "old.jsonl.gz")].kind == "whole"


def test_relative_clock_chunks_keep_their_gaps(tmp_path: pathlib.Path) -> None:
    (tmp_path / "logs").mkdir()
    lines = mooncake_lines(30, seed=8, rate_per_s=2)
    live = tmp_path / "logs" / "app.log"
    state = JobState()
    for a, b in ((0, 10), (10, 11), (11, 30)):
        write_lines(live, lines[a:b], append=True)
        _ingest(tmp_path, state)
    ts = [json.loads(x)["timestamp"] / 1000.0 for x in lines]
    got = _rows(tmp_path)["arrival_s"].to_list()
    assert [round(t, 6) for t in got] == [round(t - ts[0], 6) for t in ts]


def test_prune_drops_parts_older_than_the_window(tmp_path: pathlib.Path) -> None:
    (tmp_path / "logs").mkdir()
    lines = mooncake_lines(20, seed=9, rate_per_s=0.1)  # ~200 s of traffic
    live = tmp_path / "logs" / "app.log"
    state = JobState()
    write_lines(live, lines[:10])
    _ingest(tmp_path, state)
    write_lines(live, lines[10:], append=True)
    _ingest(tmp_path, state)
    ts = [json.loads(x)["timestamp"] / 1000 for x in lines]
    first_part_end = ts[9] - ts[0]
    window_s = state.clock_end_s - first_part_end - 1e-3
    gone = expired_parts(tmp_path / "window", state.parts, state.clock_end_s, window_s)
    assert len(gone) == 1 and len(state.parts) == 2
    state.parts = [p for p in state.parts if p not in gone]
    removed = remove_unlisted(tmp_path / "window", state.parts)
    assert len(removed) == 1 and _rows(tmp_path).height == 10
