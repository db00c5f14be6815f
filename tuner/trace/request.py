"""One request of a canonical trace, as plain Python.

``TraceRequest`` is the row type of the Parquet trace (docs/trace-format.md) and the unit
the replay backends consume. It lives in its own module that imports nothing heavy
(no pyarrow, no polars) because ``tuner.sim`` imports it and must stay plain Python.
The Parquet schema in :mod:`tuner.trace.schema` is checked against these fields in the
tests, so this dataclass is the single source of truth for the row layout.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

#: Schema version written into every trace file's metadata.
TRACE_FORMAT_VERSION = "1"


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request: when it arrived, how long it is, and which KV blocks its prompt shares.

    ``block_hashes`` are chained, salted 64-bit hashes of the prompt's blocks at the trace's
    ``hash_block_size`` (a metadata key): equal values at equal positions mean an equal
    prefix. The list has ``ceil(input_len / hash_block_size)`` entries when the source
    knows the partial last block (mooncake, vllm-log, openai-jsonl, synth) or
    ``floor(...)`` when it only knows full blocks; :func:`tuner.trace.reblock.reblock`
    turns either into exactly ``floor(input_len / B)`` full KV blocks of size ``B``.
    """

    request_id: str  # unique within the trace
    arrival_s: float  # seconds since the trace origin (>= 0)
    input_len: int  # prompt tokens (>= 1)
    output_len: int  # generated tokens (>= 0; the replay stops there, as with ignore_eos)
    block_hashes: tuple[int, ...]  # uint64 chained prompt-block hashes, see class doc
    # Full blocks completed by the generated tokens (prompt + output token stream), from block
    # index floor(input_len / hash_block_size) on; () when the source does not know them.
    output_block_hashes: tuple[int, ...] = ()
    session_id: str | None = None  # conversation / agent session, when known
    parent_id: str | None = None  # request_id of the previous turn, when known
    turn: int | None = None  # 1-based turn number within the session
    priority: int = 0  # vLLM priority (lower is served first under policy="priority")
    cache_salt: str | None = None  # vLLM per-request cache_salt (isolates prefix sharing)
    model: str | None = None  # served model name, when the source has one
    status: str | None = None  # e.g. "aborted", "failed"; None for a normal request

    @property
    def num_prompt_blocks(self) -> int:
        """Number of prompt block hashes (at the trace's hash block size)."""
        return len(self.block_hashes)


#: Column names in row order; equal to the Parquet schema's field names.
TRACE_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(TraceRequest))

__all__ = ["TraceRequest", "TRACE_COLUMNS", "TRACE_FORMAT_VERSION"]
