"""``ingest``: production logs in, one canonical Parquet trace out.

Call order: detect each source's format -> the format's reader yields Arrow batches
(salted hashes already computed, arrivals on the source's clock) -> shared validation
(lengths, hash counts, duplicate ids; each bad record becomes ``file:line: field:
reason``) -> arrivals shifted to the trace origin -> :class:`TraceWriter` (temp file,
atomic rename). Memory stays bounded by the reader's chunk size; only out-of-order input
needs a final in-memory sort (counted in the report).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tuner.errors import TraceFormatError
from tuner.progress import Progress, check_progress
from tuner.trace.formats import (LINE, MAX_SPAN_S, MAX_TOKENS, READERS, IngestContext, OnError,
                                  Quarantine)
from tuner.trace.hashing import Hasher, load_salt, salt_warnings
from tuner.trace.schema import TraceMetadata
from tuner.trace.sources import FORMATS, check_source, detect_format, open_binary
from tuner.trace.store import TraceWriter

#: The block size each format's ids (or our token hashing) use when not overridden.
DEFAULT_HASH_BLOCK_SIZE = {
    "mooncake": 512, "bailian": 16, "vllm-log": 16, "openai-jsonl": 16,
    "azure-csv": 16, "burstgpt-csv": 16,
}

@dataclass
class IngestReport:
    """What one ingest did (``--json`` prints :meth:`to_dict`)."""

    output: str
    format: str
    sources: list[str]
    requests: int = 0
    skipped: int = 0  # malformed records quarantined under --on-error skip
    out_of_order: int = 0  # records older than one before them (the trace is sorted)
    duplicates: int = 0  # duplicate request ids (quarantined under skip)
    quarantine: str | None = None  # path of the quarantine file, when records were skipped
    #: Requests whose output length the log does not hold (vLLM 0.32 logs no output lines
    #: for /v1/completions), filled by ``output_len_rule``; 0 when every length was logged.
    output_len_filled: int = 0
    output_len_rule: str | None = None
    hash_block_size: int = 0
    salt_fingerprint: str = ""
    origin_utc: str | None = None
    duration_s: float = 0.0  # last - first arrival
    bytes_read: int = 0
    wall_s: float = 0.0
    records_per_s: float = 0.0
    #: Problems that did not stop the ingest (a short or world-readable salt); the CLI
    #: prints each as a warning.
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ingest(sources: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
           output: str | os.PathLike[str], *, format: str = "auto",
           hash_block_size: int | None = None, salt: bytes | str | os.PathLike[str] | None = None,
           tokenizer: str | None = None, on_error: OnError = "fail",
           progress: Progress | None = None, output_len: int | None = None,
           spec_metrics: Sequence[str | os.PathLike[str]] | None = None) -> IngestReport:
    """Ingest log files into one canonical trace at ``output``.

    Args:
        sources: input files (gzip/zstd transparently); all must share one format.
        output: the Parquet trace to write (written atomically).
        format: ``auto`` (detect by content) or one of :data:`FORMATS`.
        hash_block_size: tokens per block hash; for mooncake/bailian the block size of
            their ``hash_ids`` (default 512/16), for token formats the hashing granularity
            (default 16, which re-blocks exactly to 16/32/64-token KV blocks).
        salt: the secret salt as bytes, or a path to a salt file (created 0600 when
            missing); ``None`` uses ``$TUNER_SALT`` or the default salt file.
        tokenizer: a Hugging Face tokenizer directory or tokenizer.json (openai-jsonl).
        on_error: ``fail`` stops at the first bad record; ``skip`` quarantines it.
        progress: a :class:`tuner.progress.Progress` sink for the bytes read; None = silent.
        output_len: the output length of every request whose log holds no output
            (vllm-log); default: its logged ``max_tokens``. Filled requests are counted
            in the report (``output_len_filled``), never silently 0.
        spec_metrics: a vLLM server log or one or two ``/metrics`` scrapes whose
            speculative-decoding counters go into the metadata
            (:mod:`tuner.trace.spec_acceptance`), read before anything is written.

    Raises:
        TraceFormatError: a bad record (``fail``), empty input, unknown or mixed formats.
    """
    t0 = time.perf_counter()
    paths = [str(sources)] if isinstance(sources, (str, os.PathLike)) else [str(s) for s in sources]
    if not paths:
        raise TraceFormatError("empty input: no source files given")
    for path in paths:
        check_source(Path(path))
    _refuse_repeated(paths)
    if on_error not in ("fail", "skip"):
        raise TraceFormatError(f"on_error: must be fail or skip, got {on_error!r}")
    fmt = _resolve_format(paths, format)
    hbs = hash_block_size or DEFAULT_HASH_BLOCK_SIZE[fmt]
    if not 1 <= hbs <= MAX_TOKENS:
        raise TraceFormatError(f"hash_block_size: must be 1 to {MAX_TOKENS:,}, got {hbs}")
    if output_len is not None and not 1 <= output_len <= MAX_TOKENS:
        raise TraceFormatError(f"output_len: must be 1 to {MAX_TOKENS:,} tokens, got "
                               f"{output_len}")
    salt_bytes = salt if isinstance(salt, bytes) else load_salt(salt)
    salt_notes = salt_warnings(salt_bytes, None if isinstance(salt, bytes) else salt)
    hasher = Hasher(salt_bytes)
    out = Path(output)
    quarantine = Quarantine(out.with_name(out.name + ".quarantine.jsonl"), paths)
    reader = _reader(fmt)
    report = IngestReport(output=str(out), format=fmt, sources=paths, hash_block_size=hbs,
                          salt_fingerprint=hasher.fingerprint, warnings=salt_notes)
    meta = TraceMetadata(hash_block_size=hbs, source_format=fmt,
                         salt_fingerprint=hasher.fingerprint)
    if spec_metrics:  # measured acceptance for the replays (tuner.trace.spec_acceptance)
        from tuner.trace.spec_acceptance import read_spec_acceptance
        meta.spec_acceptance = read_spec_acceptance(list(spec_metrics)).to_dict()
    state = _TimelineState()
    span = _SpanGuard()
    bar = _Progress(paths, check_progress(progress))
    # zstd level 1: salted hashes are random bytes that no level compresses; it is speed.
    writer = TraceWriter(out, meta, compression_level=1, inputs=paths)
    try:
        seen_ids: set[str] | None = set() if reader.HAS_IDS else None
        for index, path in enumerate(paths):
            ctx = IngestContext(path=path, hasher=hasher, hash_block_size=hbs,
                                on_error=on_error, quarantine=quarantine,
                                tokenizer=tokenizer, source_index=index, output_len=output_len)
            with open_binary(path) as fh:
                for batch in reader.read(fh, ctx):
                    batch = _validate(batch, ctx, seen_ids, report, span,
                                      epoch_clock=reader.EPOCH_CLOCK)
                    if batch.num_rows:
                        writer.write(state.place(batch))
                    bar.update(index, fh)
            report.skipped += ctx.skipped
            for rule, count in ctx.filled.items():
                report.output_len_filled += count
                report.output_len_rule = rule
            meta = meta.replace(tokenizer=ctx.tokenizer_identity or meta.tokenizer)
        bar.close()
        if writer.num_rows == 0:
            where = paths[0] if len(paths) == 1 else f"{len(paths)} sources"
            extra = (f" ({report.skipped} skipped; see {quarantine.path})"
                     if report.skipped else "")
            quarantine.close()  # the message points at it
            raise TraceFormatError(f"empty input: no valid records{extra}", path=where)
        report.out_of_order = state.out_of_order
        writer.metadata = meta.replace(
            origin_utc=state.origin_utc(reader.EPOCH_CLOCK, shifted=state.needs_sort))
        if state.needs_sort:
            # Sorted from the finished temporary file into a second one, so the output is
            # placed once, complete, and an error on the way leaves the old file alone.
            _write_sorted(writer.finish(), out, state.min_offset, writer.metadata, paths)
            writer.abort()
        else:
            writer.close()
    except BaseException:
        bar.close()
        writer.abort()
        quarantine.abort()
        raise
    quarantine.close()
    report.requests = writer.num_rows
    report.quarantine = str(quarantine.path) if quarantine.count else None
    report.origin_utc = writer.metadata.origin_utc
    report.duration_s = state.span()
    report.bytes_read = sum(Path(p).stat().st_size for p in paths)
    report.wall_s = time.perf_counter() - t0
    report.records_per_s = report.requests / report.wall_s if report.wall_s > 0 else 0.0
    return report


def _refuse_repeated(paths: list[str]) -> None:
    """The same log twice (by name, link or hard link) would double its load in silence."""
    seen: dict[tuple[int, int], str] = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue  # opening it reports the error with the file's name
        key = (st.st_dev, st.st_ino)
        if key in seen:
            raise TraceFormatError(f"{path}: given twice (also as {seen[key]}); each log may "
                                   "be read once, or its requests would count twice")
        seen[key] = path


def _resolve_format(paths: list[str], fmt: str) -> str:
    if fmt != "auto":
        if fmt not in FORMATS:
            raise TraceFormatError(f"format: unknown format {fmt!r}; choose auto or "
                                   f"{', '.join(FORMATS)}")
        for p in paths:
            if not Path(p).exists():
                raise TraceFormatError("cannot open: no such file", path=p)
        return fmt
    found = {p: detect_format(p) for p in paths}
    kinds = sorted(set(found.values()))
    if len(kinds) > 1:
        desc = ", ".join(f"{Path(p).name} is {f}" for p, f in found.items())
        raise TraceFormatError(f"format: mixed formats ({desc}); ingest each format separately",
                               path=paths[0], field="format")
    return kinds[0]


def _reader(fmt: str) -> Any:
    return READERS[fmt]


class _SpanGuard:
    """Keeps the accepted arrivals within :data:`MAX_SPAN_S` of each other.

    The first batch's median arrival anchors the trace (so one absurd first record does
    not condemn every good one after it); a row that would stretch the span past the
    limit is a bad record naming its line (``timestamp: 1e29`` used to ingest as a span
    of 54,000 years that ``trace stats`` then tried to bin per minute: 211 GiB).
    """

    def __init__(self) -> None:
        self.lo: float | None = None  # earliest accepted arrival (source clock, s)
        self.hi: float | None = None  # latest accepted arrival

    def outside(self, t: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """Rows of ``t`` (finite ones, where ``ok``) that would break the span."""
        bad = np.zeros(len(t), dtype=bool)
        good = ok & np.isfinite(t)
        if not good.any():
            return bad
        if self.lo is None:
            vals = t[good]
            k = (len(vals) - 1) // 2  # the lower median: a real record's time
            self.lo = self.hi = float(np.partition(vals, k)[k])
        assert self.hi is not None
        lo, hi = min(self.lo, float(t[good].min())), max(self.hi, float(t[good].max()))
        if hi - lo <= MAX_SPAN_S:
            self.lo, self.hi = lo, hi
            return bad
        for i in np.flatnonzero(good):  # rare: decide row by row, in line order
            v = float(t[i])
            if max(self.hi, v) - min(self.lo, v) > MAX_SPAN_S:
                bad[i] = True
            else:
                self.lo, self.hi = min(self.lo, v), max(self.hi, v)
        return bad

    def reason(self, t: float) -> str:
        assert self.lo is not None and self.hi is not None
        days = max(abs(t - self.lo), abs(t - self.hi)) / 86400.0
        far = f"{days:,.0f}" if days < 1e9 else f"{days:.3g}"
        return (f"{t:.6g} s on the source clock is {far} days from the other records; "
                f"a trace spans at most {MAX_SPAN_S / 86400:.0f} days (a corrupt time, or a "
                "unit other than the format's: see docs/trace-format.md)")


#: Unix times an epoch-clock source may hold: 1970 to 2200 (``datetime`` cannot even
#: represent 1e29 s, which ended in an OverflowError traceback when naming the origin).
EPOCH_RANGE_S = (0.0, 7.3e9)


def _validate(batch: pa.Table, ctx: IngestContext, seen_ids: set[str] | None,
              report: IngestReport, span: _SpanGuard | None = None, *,
              epoch_clock: bool = False) -> pa.Table:
    """Drop (skip) or raise on rows with bad lengths, hash counts, times or duplicate ids."""
    raw_names = (batch.schema.metadata or {}).get(b"tuner.fields")
    names: dict[str, str] = json.loads(raw_names) if raw_names else {}
    inp = batch.column("input_len").to_numpy()
    outp = batch.column("output_len").to_numpy()
    t = batch.column("arrival_s").to_numpy()
    nh = pc.list_value_length(batch.column("block_hashes")).to_numpy(zero_copy_only=False)
    hbs = ctx.hash_block_size
    ok = ((inp >= 1) & (inp <= MAX_TOKENS) & (outp >= 0) & (outp <= MAX_TOKENS)
          & np.isfinite(t) & (nh >= inp // hbs) & (nh <= -(-inp // hbs)))
    if epoch_clock:
        ok &= (t >= EPOCH_RANGE_S[0]) & (t < EPOCH_RANGE_S[1])
    far = span.outside(t, ok) if span is not None else np.zeros(len(t), dtype=bool)
    ok &= ~far
    drop = ~ok
    lines = batch.column(LINE).to_numpy()
    if seen_ids is None and ok.all():
        return batch
    ids = batch.column("request_id").to_pylist() if seen_ids is not None else None
    for i in range(batch.num_rows):  # line order, so --on-error fail names the first bad line
        if far[i] and span is not None:
            ctx.bad(int(lines[i]), names.get("arrival_s", "timestamp"), span.reason(float(t[i])))
        elif not ok[i]:
            _report_row(ctx, int(lines[i]), int(inp[i]), int(outp[i]), float(t[i]), int(nh[i]),
                        names, epoch_clock)
        elif ids is not None and seen_ids is not None:
            rid = ids[i]
            if rid in seen_ids:
                report.duplicates += 1
                drop[i] = True
                ctx.bad(int(lines[i]), names.get("request_id", "request_id"),
                        f"duplicate request id {rid!r}")
            else:
                seen_ids.add(rid)
    if drop.any():
        batch = batch.filter(pa.array(~drop))
    return batch


def _report_row(ctx: IngestContext, line: int, inp: int, outp: int, t: float, nh: int,
                names: dict[str, str], epoch_clock: bool = False) -> None:
    hbs = ctx.hash_block_size
    f_in = names.get("input_len", "input_len")
    f_out = names.get("output_len", "output_len")
    if inp < 1:
        ctx.bad(line, f_in, f"{inp} tokens; a prompt has at least 1")
    elif inp > MAX_TOKENS:
        ctx.bad(line, f_in, f"{inp:,} tokens is absurd (limit {MAX_TOKENS:,})")
    elif outp < 0:
        ctx.bad(line, f_out, f"{outp} tokens is negative")
    elif outp > MAX_TOKENS:
        ctx.bad(line, f_out, f"{outp:,} tokens is absurd (limit {MAX_TOKENS:,})")
    elif not np.isfinite(t):
        ctx.bad(line, names.get("arrival_s", "timestamp"), "not a finite time")
    elif epoch_clock and not EPOCH_RANGE_S[0] <= t < EPOCH_RANGE_S[1]:
        ctx.bad(line, names.get("arrival_s", "timestamp"),
                f"{t:.6g} is not a Unix time between 1970 and 2200 (seconds, or ms/us/ns "
                "told apart by magnitude)")
    else:
        ctx.bad(line, names.get("block_hashes", "hash_ids"),
                f"{nh} block ids for {inp} tokens at {hbs}-token blocks "
                f"(expected {-(-inp // hbs)}; wrong --hash-block-size?)")


class _TimelineState:
    """Shifts arrivals onto the trace origin (the first record) and counts disorder."""

    def __init__(self) -> None:
        self.origin: float | None = None
        self.running_max = -np.inf
        self.out_of_order = 0
        self.min_offset = 0.0
        self.max_offset = 0.0

    def place(self, batch: pa.Table) -> pa.Table:
        t = batch.column("arrival_s").to_numpy()
        if self.origin is None:
            self.origin = float(t[0])
        prev_max = np.maximum.accumulate(np.concatenate([[self.running_max], t]))[:-1]
        self.out_of_order += int(np.count_nonzero(t < prev_max))
        self.running_max = max(self.running_max, float(t.max()))
        rel = t - self.origin
        self.min_offset = min(self.min_offset, float(rel.min()))
        self.max_offset = max(self.max_offset, float(rel.max()))
        idx = batch.schema.get_field_index("arrival_s")
        batch = batch.set_column(idx, "arrival_s", pa.array(rel, pa.float64()))
        return batch.drop_columns([LINE])

    @property
    def needs_sort(self) -> bool:
        return self.out_of_order > 0 or self.min_offset < 0

    def span(self) -> float:
        return self.max_offset - self.min_offset

    def origin_utc(self, epoch_clock: bool, *, shifted: bool = False) -> str | None:
        if not epoch_clock or self.origin is None:
            return None
        origin = self.origin + (self.min_offset if shifted else 0.0)
        return datetime.fromtimestamp(origin, tz=timezone.utc).isoformat()


def _write_sorted(unsorted: Path, out: Path, min_offset: float, meta: TraceMetadata,
                  inputs: list[str]) -> None:
    """Write ``unsorted`` to ``out`` sorted by arrival (stable), origin at the earliest row.

    Needs the trace in memory (compressed columns; about 10 bytes per block hash), the one
    step of ingest that is not bounded by the chunk size; in-order logs never take it.
    """
    df = pl.read_parquet(unsorted).sort("arrival_s", maintain_order=True)
    df = df.with_columns(pl.col("arrival_s") - min_offset)
    with TraceWriter(out, meta, inputs=inputs) as w:
        w.write(df.to_arrow())


class _Progress:
    """Source bytes read so far, reported to a :class:`tuner.progress.Progress` sink."""

    def __init__(self, paths: list[str], sink: Progress | None) -> None:
        self._sink = sink
        if sink is None:
            return
        self._sizes = [Path(p).stat().st_size for p in paths]
        sink.stage("ingest", sum(self._sizes), unit="bytes")

    def update(self, index: int, fh: Any) -> None:
        if self._sink is None:
            return
        raw = getattr(fh, "fileobj", None) or getattr(fh, "_fp", None) or fh
        try:
            pos = raw.tell()
        except (OSError, AttributeError, ValueError):
            return
        self._sink.update(sum(self._sizes[:index]) + pos)

    def close(self) -> None:
        """Nothing to release: the sink is its caller's."""
