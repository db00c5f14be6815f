"""Mooncake ingest: the bundled sample, compressed inputs, and every bad-input path."""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path

import pytest
import zstandard

from tuner.errors import TraceFormatError
from tuner.trace import detect_format, ingest, read_trace, trace_stats


def _hand_hit_rate(path: Path) -> float:
    """Independent check on the raw ids: the leading run of ids seen before, x512, capped."""
    seen: set[int] = set()
    hit = total = 0
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        run = 0
        for h in rec["hash_ids"]:
            if h not in seen:
                break
            run += 1
        hit += min(run * 512, rec["input_length"])
        total += rec["input_length"]
        seen.update(rec["hash_ids"])
    return hit / total


def test_mooncake_sample(tmp_path: Path, data: Path) -> None:
    src = data / "mooncake_synthetic.jsonl"
    report = ingest([src], tmp_path / "m.parquet", progress=False)
    assert report.requests == 3993 and report.format == "mooncake"
    assert report.out_of_order == 0 and report.skipped == 0
    trace = read_trace(tmp_path / "m.parquet")
    assert len(trace) == 3993 and trace.metadata.hash_block_size == 512
    assert trace.metadata.origin_utc is None  # mooncake times are relative
    stats = trace_stats(trace)
    expected = _hand_hit_rate(src)
    assert stats.ideal_prefix_hit_rate == pytest.approx(expected, abs=1e-12)
    assert stats.ideal_prefix_hit_rate == pytest.approx(0.6512, abs=1e-4)
    assert stats.input_len_mean == pytest.approx(15325.48, abs=0.01)
    first = trace.requests()[0]
    assert first.input_len == 40160 and first.output_len == 6
    assert len(first.block_hashes) == math.ceil(40160 / 512)
    assert first.request_id == "mooncake_synthetic-1"
    assert stats.duration_s == pytest.approx(1022.025)


def test_raw_ids_never_stored(tmp_path: Path, data: Path) -> None:
    ingest([data / "mooncake_synthetic.jsonl"], tmp_path / "m.parquet", progress=False)
    hashes = read_trace(tmp_path / "m.parquet").requests()[0].block_hashes
    assert not set(hashes) & set(range(100))


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_compressed_inputs_give_the_same_trace(tmp_path: Path, data: Path, compress: str) -> None:
    raw = (data / "mooncake_synthetic.jsonl").read_bytes()[:200_000]
    raw = raw[:raw.rfind(b"\n") + 1]
    plain = tmp_path / "part.jsonl"
    plain.write_bytes(raw)
    packed = tmp_path / f"part.jsonl.{'gz' if compress == 'gzip' else 'zst'}"
    packed.write_bytes(gzip.compress(raw) if compress == "gzip"
                       else zstandard.ZstdCompressor().compress(raw))
    assert detect_format(packed) == "mooncake"
    ingest([plain], tmp_path / "a.parquet", progress=False)
    ingest([packed], tmp_path / "b.parquet", progress=False)
    assert read_trace(tmp_path / "a.parquet").fingerprint() == \
        read_trace(tmp_path / "b.parquet").fingerprint()


def test_slow_path_equals_fast_path(tmp_path: Path) -> None:
    rows = [{"timestamp": i * 10, "input_length": 600, "output_length": 5,
             "hash_ids": [0, 1] if i % 2 else [0, 2 + i]} for i in range(6)]
    lines = [json.dumps(r) for r in rows]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n")
    ingest(tmp_path / "a.jsonl", tmp_path / "a.parquet", progress=False)
    ingest(tmp_path / "b.jsonl", tmp_path / "b.parquet", progress=False)  # blank line: slow path
    a = [(r.arrival_s, r.block_hashes) for r in read_trace(tmp_path / "a.parquet").requests()]
    b = [(r.arrival_s, r.block_hashes) for r in read_trace(tmp_path / "b.parquet").requests()]
    assert a == b


def _write(tmp_path: Path, *objs: object) -> Path:
    p = tmp_path / "in.jsonl"
    p.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return p


GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


@pytest.mark.parametrize("bad,message", [
    ('{"timestamp": 1, "input_length": 6', "in.jsonl:2: json: not valid JSON (Expecting ',' delimiter)"),
    ({**GOOD, "input_length": -3, "hash_ids": []},
     "in.jsonl:2: input_length: -3 tokens; a prompt has at least 1"),
    ({**GOOD, "output_length": -1}, "in.jsonl:2: output_length: -1 tokens is negative"),
    ({**GOOD, "input_length": 10**9, "hash_ids": [1]},
     "in.jsonl:2: input_length: 1,000,000,000 tokens is absurd (limit 16,777,216)"),
    ({**GOOD, "hash_ids": [1, 2, 3]},
     "in.jsonl:2: hash_ids: 3 block ids for 600 tokens at 512-token blocks (expected 2; "
     "wrong --hash-block-size?)"),
    ({k: v for k, v in GOOD.items() if k != "timestamp"}, "in.jsonl:2: timestamp: missing"),
    ({**GOOD, "input_length": "600"}, "in.jsonl:2: input_length: not an integer ('600')"),
    ({**GOOD, "hash_ids": [1, -2]}, "in.jsonl:2: hash_ids: not a list of non-negative integers"),
    ("[1, 2]", "in.jsonl:2: json: not a JSON object"),
])
def test_bad_record_fails_with_line_and_field(tmp_path: Path, bad: object, message: str) -> None:
    src = _write(tmp_path, GOOD, bad, GOOD)
    out = tmp_path / "out.parquet"
    with pytest.raises(TraceFormatError) as err:
        ingest([src], out, progress=False)
    assert str(err.value) == f"{src.parent}/{message}"
    assert not out.exists() and list(tmp_path.iterdir()) == [src]


def test_skip_quarantines_bad_lines(tmp_path: Path) -> None:
    src = _write(tmp_path, GOOD, "garbage", {**GOOD, "output_length": -1}, GOOD)
    report = ingest([src], tmp_path / "out.parquet", on_error="skip", progress=False)
    assert report.requests == 2 and report.skipped == 2
    q = [json.loads(x) for x in Path(report.quarantine).read_text().splitlines()]
    assert [(r["line"], r["error"].split(":")[0]) for r in q] == [(2, "json"), (3, "output_length")]
    assert q[0]["raw"] == "garbage"
    assert report.quarantine == str(tmp_path / "out.parquet.quarantine.jsonl")


def test_empty_inputs(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(TraceFormatError, match="empty.jsonl: empty input: no records"):
        ingest([empty], tmp_path / "o.parquet", progress=False)
    with pytest.raises(TraceFormatError, match="empty input: no valid records"):
        ingest([empty], tmp_path / "o.parquet", format="mooncake", progress=False)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    with pytest.raises(TraceFormatError, match="empty input"):
        ingest([blank], tmp_path / "o.parquet", progress=False)
    allbad = _write(tmp_path, "nope")
    with pytest.raises(TraceFormatError, match=r"no valid records \(1 skipped"):
        ingest([allbad], tmp_path / "o.parquet", format="mooncake", on_error="skip",
               progress=False)
    assert not (tmp_path / "o.parquet").exists()
    with pytest.raises(TraceFormatError, match="no source files"):
        ingest([], tmp_path / "o.parquet", progress=False)


def test_unknown_and_mixed_formats(tmp_path: Path, data: Path) -> None:
    odd = tmp_path / "odd.txt"
    odd.write_text("hello world\n")
    with pytest.raises(TraceFormatError, match=r"odd.txt:1: format: unknown format"):
        ingest([odd], tmp_path / "o.parquet", progress=False)
    with pytest.raises(TraceFormatError, match="mixed formats .*mooncake.*azure-csv"):
        ingest([data / "mooncake_synthetic.jsonl", data / "azure_code_sample.csv"],
               tmp_path / "o.parquet", progress=False)
    # A line of another format inside a mooncake file is a bad record, named.
    src = _write(tmp_path, GOOD, {"timestamp": 1.0})
    with pytest.raises(TraceFormatError, match=r"in.jsonl:2: input_length: missing"):
        ingest([src], tmp_path / "o.parquet", format="mooncake", progress=False)
    # ... even a Bailian record, which has every Mooncake field.
    bailian = (data / "bailian_sample.jsonl").read_text().splitlines()[0]
    src = _write(tmp_path, GOOD, bailian)
    with pytest.raises(TraceFormatError) as err:
        ingest([src], tmp_path / "o.parquet", progress=False)
    assert str(err.value) == (f"{src}:2: chat_id: unexpected field: a record of another format "
                              "in this mooncake file; ingest each format separately")


def test_out_of_order_is_sorted_and_counted(tmp_path: Path) -> None:
    src = _write(tmp_path, {**GOOD, "timestamp": 5000}, {**GOOD, "timestamp": 7000},
                 {**GOOD, "timestamp": 1000}, {**GOOD, "timestamp": 9000},
                 {**GOOD, "timestamp": 6000})
    report = ingest([src], tmp_path / "o.parquet", progress=False)
    assert report.out_of_order == 2
    got = [(r.request_id, r.arrival_s) for r in read_trace(tmp_path / "o.parquet").iter_requests()]
    assert got == [("in-3", 0.0), ("in-1", 4.0), ("in-5", 5.0), ("in-2", 6.0), ("in-4", 8.0)]
    assert report.duration_s == pytest.approx(8.0)


def test_hash_block_size_override(tmp_path: Path) -> None:
    src = _write(tmp_path, {**GOOD, "hash_ids": list(range(38))})  # 600 tokens at 16
    with pytest.raises(TraceFormatError, match="38 block ids"):
        ingest([src], tmp_path / "o.parquet", progress=False)
    report = ingest([src], tmp_path / "o.parquet", hash_block_size=16, progress=False)
    assert read_trace(tmp_path / "o.parquet").metadata.hash_block_size == 16
    assert report.requests == 1


def test_fast_parser_agrees_with_json(data: Path) -> None:
    from tuner.trace.formats._mooncake_fast import parse_chunk

    raw = (data / "mooncake_synthetic.jsonl").read_bytes()
    ts, inp, outp, offsets, ids = parse_chunk(raw)
    for i, line in enumerate(raw.splitlines()):
        rec = json.loads(line)
        assert (ts[i], inp[i], outp[i]) == (rec["timestamp"], rec["input_length"],
                                           rec["output_length"])
        assert ids[offsets[i]:offsets[i + 1]].tolist() == rec["hash_ids"]
    head = b'{"timestamp": 1, "input_length": 2, "output_length": 3, "hash_ids": '
    ok = parse_chunk(head + b"[]}\n" + head + b"[5]}\n" + head + b"[6, 7]}\n")
    assert ok is not None and ok[3].tolist() == [0, 0, 1, 3] and ok[4].tolist() == [5, 6, 7]
    for bad in (b"[1,2]}\n", b"[1, , 2]}\n", b"[18446744073709551615]}\n", b"[1]}\r\n",
                b"[1]} \n", b"[1]}, 3\n", b"[1.5]}\n"):
        assert parse_chunk(head + bad) is None, bad
    assert parse_chunk(b'{"timestamp": , "input_length": 2, "output_length": 3, "hash_ids": [1]}\n') is None


def test_non_canonical_layout_takes_polars_path(tmp_path: Path) -> None:
    # Other key order and compact separators: same records, same trace.
    recs = [{"timestamp": 10 * i, "input_length": 600, "output_length": 2, "hash_ids": [0, i]}
            for i in range(5)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "b.jsonl").write_text("".join(
        json.dumps(dict(reversed(list(r.items()))), separators=(",", ":")) + "\n" for r in recs))
    ingest(tmp_path / "a.jsonl", tmp_path / "a.parquet", progress=False)
    ingest(tmp_path / "b.jsonl", tmp_path / "b.parquet", progress=False)
    a = [(r.arrival_s, r.block_hashes) for r in read_trace(tmp_path / "a.parquet").requests()]
    b = [(r.arrival_s, r.block_hashes) for r in read_trace(tmp_path / "b.parquet").requests()]
    assert a == b


def test_failure_while_sorting_leaves_no_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tuner.trace._ingest as ingest_mod

    src = _write(tmp_path, {**GOOD, "timestamp": 5000}, {**GOOD, "timestamp": 1000})

    def boom(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ingest_mod, "_write_sorted", boom)
    with pytest.raises(OSError, match="disk full"):
        ingest([src], tmp_path / "o.parquet", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_failure_while_sorting_keeps_the_previous_output(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The sort used to run after the rename, so a failure there deleted the old trace."""
    import tuner.trace._ingest as ingest_mod

    src = _write(tmp_path, {**GOOD, "timestamp": 5000}, {**GOOD, "timestamp": 1000})
    (tmp_path / "o.parquet").write_bytes(b"previous")

    def boom(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ingest_mod, "_write_sorted", boom)
    with pytest.raises(OSError, match="disk full"):
        ingest([src], tmp_path / "o.parquet", progress=False)
    assert (tmp_path / "o.parquet").read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "o.parquet"]


def test_the_same_log_twice_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Issue 17 item 5: one log given twice (here once through a hard link) doubled its load."""
    from tuner.errors import TraceFormatError
    from tuner.trace import ingest

    src = tmp_path / "a.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n')
    link = tmp_path / "b.jsonl"
    os.link(src, link)
    out = tmp_path / "t.parquet"
    with pytest.raises(TraceFormatError, match="given twice"):
        ingest([src, link], out, salt=b"s", progress=False)
    assert not out.exists()
