"""The canonical trace's Parquet schema and file metadata (docs/trace-format.md).

The schema is derived field by field from :class:`~tuner.trace.request.TraceRequest`; a
test checks the two stay equal, so the dataclass is the one source of truth.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from tuner import __version__
from tuner.errors import TraceSchemaError
from tuner.trace.request import TRACE_COLUMNS, TRACE_FORMAT_VERSION, TraceRequest

#: Parquet key-value metadata key holding :class:`TraceMetadata` as JSON.
METADATA_KEY = b"tuner.trace"

SCHEMA = pa.schema([
    pa.field("request_id", pa.string(), nullable=False),
    pa.field("arrival_s", pa.float64(), nullable=False),
    pa.field("input_len", pa.int32(), nullable=False),
    pa.field("output_len", pa.int32(), nullable=False),
    pa.field("block_hashes", pa.list_(pa.uint64()), nullable=False),
    pa.field("output_block_hashes", pa.list_(pa.uint64())),
    pa.field("session_id", pa.string()),
    pa.field("parent_id", pa.string()),
    pa.field("turn", pa.int32()),
    pa.field("priority", pa.int32()),
    pa.field("cache_salt", pa.string()),
    pa.field("model", pa.string()),
    pa.field("status", pa.string()),
])
assert tuple(SCHEMA.names) == TRACE_COLUMNS, "schema and TraceRequest fields disagree"

REQUIRED_COLUMNS = ("request_id", "arrival_s", "input_len", "output_len", "block_hashes")

#: Longest prompt or output a trace may hold (tokens); anything longer is a corrupt record.
MAX_TOKENS = 16 * 1024 * 1024

#: Longest time a trace may span (seconds): a year and a day. A longer span is a unit
#: mistake (microseconds read as seconds) or a corrupt timestamp, and per-minute
#: statistics over 54,000 years tried to allocate 211 GiB.
MAX_SPAN_S = 366 * 86400.0

#: Rows per Parquet row group (and per record batch a checker reads); keeps readers'
#: memory bounded.
ROW_GROUP_SIZE = 65_536


@dataclass
class TraceMetadata:
    """What a trace file says about itself (stored as JSON under ``tuner.trace``)."""

    hash_block_size: int  # tokens per block_hashes entry (e.g. 16, 64, 512)
    source_format: str  # mooncake, bailian, vllm-log, openai-jsonl, azure-csv, burstgpt-csv, synth:*
    format_version: str = TRACE_FORMAT_VERSION
    origin_utc: str | None = None  # ISO-8601 UTC instant of arrival_s = 0; None if the source is relative
    salt_fingerprint: str | None = None  # blake2b fingerprint of the salt (never the salt)
    tokenizer: str | None = None  # tokenizer identity (name + content hash) or the fallback's name
    num_rows: int | None = None  # rows in the file (set when the writer closes)
    tool_version: str = __version__  # tuner version that wrote it
    #: measured speculative-decoding counters (``tuner.trace.spec_acceptance``, ingest
    #: --spec-metrics): the replay's acceptance unless one is given; None: not measured
    spec_acceptance: dict[str, Any] | None = None

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        if data["spec_acceptance"] is None:  # not measured: written as before
            del data["spec_acceptance"]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, *, where: str = "trace") -> "TraceMetadata":
        try:
            data: dict[str, Any] = json.loads(text)
            known = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in data.items() if k in known})
        except (ValueError, TypeError) as exc:
            raise TraceSchemaError(f"{where}: unreadable tuner.trace metadata ({exc})") from None

    def replace(self, **changes: Any) -> "TraceMetadata":
        return dataclasses.replace(self, **changes)


def requests_to_table(requests: list[TraceRequest]) -> pa.Table:
    """Rows to an Arrow table in :data:`SCHEMA` (small, in-memory traces)."""
    cols: dict[str, list[Any]] = {name: [] for name in TRACE_COLUMNS}
    for r in requests:
        for name in TRACE_COLUMNS:
            cols[name].append(getattr(r, name))
    cols["block_hashes"] = [list(v) for v in cols["block_hashes"]]
    cols["output_block_hashes"] = [list(v) for v in cols["output_block_hashes"]]
    return pa.table(cols, schema=SCHEMA)
