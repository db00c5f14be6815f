"""The traces shipped in traces/: present, attributed, and what traces/README.md says."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tuner.trace import read_trace

ROOT = Path(__file__).resolve().parents[2]


def test_mooncake_copy_and_notice(data: Path) -> None:
    bundled = ROOT / "traces" / "mooncake_synthetic.jsonl"
    assert hashlib.sha256(bundled.read_bytes()).digest() == \
        hashlib.sha256((data / "mooncake_synthetic.jsonl").read_bytes()).digest()
    for notice in (ROOT / "traces" / "NOTICE", data / "NOTICE"):
        assert "Apache License, Version 2.0" in " ".join(notice.read_text().split())
    assert len(bundled.read_text().splitlines()) == 3993


def test_agentic_sample_metadata_and_size() -> None:
    path = ROOT / "traces" / "agentic_1h.parquet"
    assert path.stat().st_size <= 15 * 2**20
    trace = read_trace(path)
    meta = trace.metadata
    assert (meta.source_format, meta.hash_block_size) == ("synth:agentic", 64)
    assert len(trace) == 17_594  # traces/README.md; regenerate with traces/regenerate.sh
    start, end = trace.time_range()
    assert start >= 0 and 3500 < end < 3600
    assert "--rate 5 --seed 42" in (ROOT / "traces" / "README.md").read_text()
    assert "--rate" in (ROOT / "traces" / "regenerate.sh").read_text()
