"""Azure LLM inference traces and BurstGPT: CSV logs with lengths but no prefix identity.

* azure-csv (Azure/AzurePublicDataset, 2023 and 2024):
  ``TIMESTAMP,ContextTokens,GeneratedTokens`` with timestamps such as
  ``2023-11-16 18:15:46.6805900`` (UTC, up to 7 fractional digits).
* burstgpt-csv (HPMLL/BurstGPT): ``Timestamp,Model,Request tokens,Response tokens,Total
  tokens,Log Type`` with ``Timestamp`` in seconds from the start of the log. A row with
  ``Response tokens`` 0 is a failed request (the ``*_with_fails`` files) and is kept with
  ``status = "failed"`` and ``output_len = 0``.

Without prefix identity every request gets *unique* block hashes: ``2**63 | uid << 20 |
block`` with ``uid`` the row's running number. They cannot collide with salted hashes of
another source in practice and, being near-sequential, compress to almost nothing.
"""

from __future__ import annotations

import abc
import csv
import io
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import IO, Any

import numpy as np
import pyarrow as pa

from tuner.trace.formats._batch import (MAX_TOKENS, IngestContext, make_batch,
                                         relative_clock_seconds)
from tuner.trace.sources import iter_line_chunks

_BATCH_ROWS = 65_536


def unique_block_hashes(uids: np.ndarray, input_lens: np.ndarray, block_size: int) -> pa.ListArray:
    """``ceil(input_len / block_size)`` request-unique hashes per row (see module doc)."""
    counts = -(-input_lens.astype(np.int64) // block_size)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    total = int(offsets[-1])
    pos = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], counts)
    vals = (np.uint64(1 << 63) | (np.repeat(uids.astype(np.uint64), counts) << np.uint64(20))
            | pos.astype(np.uint64))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(vals, pa.uint64()))


class _CsvReader(abc.ABC):
    HAS_IDS = False
    EPOCH_CLOCK = False
    HEADER: tuple[str, ...] = ()
    FIELDS: dict[str, str] = {}

    def __init__(self) -> None:
        self._uid = 0

    def read(self, fh: IO[bytes], ctx: IngestContext) -> Iterator[pa.Table]:
        rows: list[tuple[int, list[str]]] = []
        header_seen = False
        for first, chunk in iter_line_chunks(fh):
            text = chunk.decode("utf-8-sig" if first == 1 else "utf-8", "replace")
            for i, rec in enumerate(csv.reader(io.StringIO(text))):
                line_no = first + i
                if not rec or not any(c.strip() for c in rec):
                    continue
                if not header_seen:
                    header_seen = True
                    cols = tuple(c.strip().lower() for c in rec)
                    if cols[:len(self.HEADER)] != self.HEADER:
                        ctx.bad(line_no, "header", f"expected {','.join(self.HEADER)}; got "
                                f"{','.join(rec)[:80]}", ",".join(rec))
                        return
                    continue
                rows.append((line_no, rec))
                if len(rows) >= _BATCH_ROWS:
                    yield from self._emit(rows, ctx)
                    rows = []
        if rows:
            yield from self._emit(rows, ctx)

    def _emit(self, rows: list[tuple[int, list[str]]], ctx: IngestContext) -> Iterator[pa.Table]:
        parsed: list[tuple[int, dict[str, Any]]] = []
        for line_no, rec in rows:
            out = self._parse(rec, line_no, ctx)
            if out is not None:
                parsed.append((line_no, out))
        if not parsed:
            return
        lines = np.array([p[0] for p in parsed], dtype=np.int64)
        keys = parsed[0][1].keys()
        cols = {k: [p[1][k] for p in parsed] for k in keys}
        uids = np.arange(self._uid, self._uid + len(parsed), dtype=np.int64)
        self._uid += len(parsed)
        inp = np.asarray(cols["input_len"], dtype=np.int64)
        # Lengths were bounded per row (ctx.token_count); a 0-token prompt gets no hashes
        # and validation names it.
        hashed_len = np.clip(inp, 0, MAX_TOKENS)
        cols["block_hashes"] = unique_block_hashes(uids, hashed_len, ctx.hash_block_size)
        prefix = ctx.stem if ctx.source_index == 0 else f"{ctx.stem}#{ctx.source_index}"
        cols["request_id"] = [f"{prefix}-{n}" for n in lines.tolist()]
        cols["input_len"] = inp
        cols["output_len"] = np.asarray(cols["output_len"], dtype=np.int64)
        if not self.EPOCH_CLOCK:  # BurstGPT: seconds from the start, or an epoch in ms/µs/ns
            cols["arrival_s"] = relative_clock_seconds(
                np.asarray(cols["arrival_s"], dtype=np.float64), 1.0)
        yield make_batch(cols, lines, field_names=self.FIELDS)

    def _int(self, rec: list[str], idx: int, name: str, line_no: int, ctx: IngestContext) -> int | None:
        """A token count, bounded before anything is sized by it (``1e400`` and ``1e29``
        used to end in an OverflowError traceback)."""
        if idx >= len(rec):
            ctx.bad(line_no, name, "not an integer ('missing')", ",".join(rec))
            return None
        return ctx.token_count(line_no, name, rec[idx], ",".join(rec))

    @abc.abstractmethod
    def _parse(self, rec: list[str], line_no: int, ctx: IngestContext) -> dict[str, Any] | None:
        """One data row to canonical values, or ``None`` after reporting it as bad."""


class AzureCsvReader(_CsvReader):
    EPOCH_CLOCK = True
    HEADER = ("timestamp", "contexttokens", "generatedtokens")
    FIELDS = {"arrival_s": "TIMESTAMP", "input_len": "ContextTokens",
              "output_len": "GeneratedTokens"}

    def _parse(self, rec: list[str], line_no: int, ctx: IngestContext) -> dict[str, Any] | None:
        t = _parse_azure_time(rec[0] if rec else "")
        if t is None:
            ctx.bad(line_no, "TIMESTAMP", f"not a timestamp ({rec[0] if rec else ''!r})",
                    ",".join(rec))
            return None
        inp = self._int(rec, 1, "ContextTokens", line_no, ctx)
        if inp is None:
            return None
        out = self._int(rec, 2, "GeneratedTokens", line_no, ctx)
        if out is None:
            return None
        return {"arrival_s": t, "input_len": inp, "output_len": out}


def _parse_azure_time(text: str) -> float | None:
    """``2023-11-16 18:15:46.6805900`` (UTC) -> Unix seconds; Python takes <= 6 digits."""
    text = text.strip()
    frac = 0.0
    if "." in text:
        text, f = text.split(".", 1)
        if not f.isdigit():
            return None
        frac = float("0." + f)
    try:
        dt = datetime.strptime(text.replace("T", " "), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    return dt.replace(tzinfo=timezone.utc).timestamp() + frac


class BurstGptCsvReader(_CsvReader):
    HEADER = ("timestamp", "model", "request tokens", "response tokens")
    FIELDS = {"arrival_s": "Timestamp", "input_len": "Request tokens",
              "output_len": "Response tokens"}

    def _parse(self, rec: list[str], line_no: int, ctx: IngestContext) -> dict[str, Any] | None:
        try:
            t = float(rec[0])
        except (IndexError, ValueError):
            ctx.bad(line_no, "Timestamp", f"not a number ({rec[0] if rec else ''!r})", ",".join(rec))
            return None
        inp = self._int(rec, 2, "Request tokens", line_no, ctx)
        if inp is None:
            return None
        out = self._int(rec, 3, "Response tokens", line_no, ctx)
        if out is None:
            return None
        return {"arrival_s": t, "input_len": inp, "output_len": out,
                "model": rec[1].strip() if len(rec) > 1 else None,
                "status": "failed" if out == 0 else None}
