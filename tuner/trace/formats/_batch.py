"""What a format reader gets and gives back: :class:`IngestContext` (hashing, block size,
bad-record handling) in, :func:`make_batch` tables out.

Readers (one module per format in this package) import only this module and the trace
helpers they need; the ingest driver (:mod:`tuner.trace._ingest`) imports the readers.
The two used to import each other (the driver lazily), an import circle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any, Literal

import pyarrow as pa

from tuner.errors import TraceFormatError
from tuner.trace.hashing import Hasher
from tuner.trace.schema import SCHEMA

OnError = Literal["fail", "skip"]

#: Internal batch column: 1-based source line of each row (dropped before writing).
LINE = "_line"


class IngestContext:
    """Per-source state a reader needs: hashing, block size, and bad-record handling."""

    def __init__(self, *, path: str, hasher: Hasher, hash_block_size: int, on_error: OnError,
                 quarantine: "Quarantine", tokenizer: str | None = None,
                 source_index: int = 0) -> None:
        self.path = path
        self.hasher = hasher
        self.hash_block_size = hash_block_size
        self.on_error = on_error
        self.quarantine = quarantine
        self.tokenizer = tokenizer
        self.source_index = source_index
        self.stem = Path(path).name.split(".")[0] or "src"
        self.tokenizer_identity: str | None = None
        self.skipped = 0

    def bad(self, line: int | None, field_name: str, reason: str, raw: bytes | str | None = None) -> None:
        """Report a malformed record: raise under ``fail``, quarantine under ``skip``."""
        if self.on_error == "fail":
            raise TraceFormatError(f"{field_name}: {reason}", path=self.path, line=line,
                                   field=field_name)
        self.skipped += 1
        self.quarantine.add(self.path, line, f"{field_name}: {reason}", raw)


class Quarantine:
    """Bad records under ``--on-error skip``: JSON lines beside the output.

    Each line is ``{"source", "line", "error", "raw"}``; ``raw`` is the offending input
    line, so the file may hold prompt text: it stays beside the output, never inside it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        self._fh: IO[str] | None = None

    def add(self, source: str, line: int | None, error: str, raw: bytes | str | None) -> None:
        if self._fh is None:
            self._fh = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", "replace")
        self._fh.write(json.dumps({"source": source, "line": line, "error": error,
                                   "raw": raw}) + "\n")
        self.count += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def make_batch(columns: dict[str, Any], lines: Any, *, field_names: dict[str, str] | None = None) -> pa.Table:
    """A reader's batch: canonical columns (missing optional ones become nulls) + lines.

    ``arrival_s`` holds seconds on the source's own clock; the driver shifts it.
    """
    n = len(lines)
    arrays = []
    for f in SCHEMA:
        if f.name in columns:
            v = columns[f.name]
            arrays.append(v if isinstance(v, (pa.Array, pa.ChunkedArray)) else pa.array(v, f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    table = pa.Table.from_arrays(arrays, schema=SCHEMA.remove_metadata())
    table = table.append_column(LINE, pa.array(lines, pa.int64()))
    if field_names:
        # Source field names ride in the schema metadata, so validation errors can say
        # ``input_length`` (mooncake) rather than ``input_len``.
        table = table.replace_schema_metadata({b"tuner.fields": json.dumps(field_names).encode()})
    return table
