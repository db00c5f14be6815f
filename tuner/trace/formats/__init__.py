"""One reader per input format. Each reader has ``read(fh, ctx) -> Iterator[pa.Table]``,
``HAS_IDS`` (the source carries request ids, so duplicates are checked) and
``EPOCH_CLOCK`` (arrivals are Unix seconds, so the trace gets a UTC origin).

What ingest needs of the readers' shared batch plumbing (``_batch``: the context a reader
reports through, the quarantine, the line column and the token cap) is public here."""

from __future__ import annotations

from tuner.trace.formats._batch import (LINE, MAX_SPAN_S, MAX_TOKENS, IngestContext, OnError,
                                       Quarantine)
from tuner.trace.formats.csv_logs import AzureCsvReader, BurstGptCsvReader
from tuner.trace.formats.hashed_jsonl import BailianReader, MooncakeReader
from tuner.trace.formats.openai_jsonl import OpenAIJsonlReader
from tuner.trace.formats.vllm_log import VllmLogReader

__all__ = ["LINE", "MAX_SPAN_S", "MAX_TOKENS", "READERS", "IngestContext", "OnError", "Quarantine"]

READERS = {
    "mooncake": MooncakeReader(),
    "bailian": BailianReader(),
    "vllm-log": VllmLogReader(),
    "openai-jsonl": OpenAIJsonlReader(),
    "azure-csv": AzureCsvReader(),
    "burstgpt-csv": BurstGptCsvReader(),
}
