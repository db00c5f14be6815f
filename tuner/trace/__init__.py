"""Canonical request traces: schema, ingestion from production logs, synthesis, stats.

Public names are re-exported here. ``TraceRequest`` and ``reblock`` load eagerly and
stay plain Python (``tuner.sim`` imports them inside vLLM environments); everything that
needs pyarrow or polars loads on first use (PEP 562), so ``from tuner.trace import
TraceRequest`` never imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner._lazy import lazy_getattr
from tuner.trace.reblock import reblock, reblock_request_hashes
from tuner.trace.request import TRACE_FORMAT_VERSION, TraceRequest

if TYPE_CHECKING:
    from tuner.trace._ingest import IngestReport, ingest
    from tuner.trace.schema import TraceMetadata
    from tuner.trace.slicing import slice_trace
    from tuner.trace.sources import detect_format
    from tuner.trace.stats import TraceStats, format_trace_stats, stats_rows, trace_stats
    from tuner.trace.store import Trace, TraceWriter, read_trace, write_trace
    from tuner.trace.synth import synthesize

_LAZY = {
    "Trace": "tuner.trace.store",
    "TraceWriter": "tuner.trace.store",
    "read_trace": "tuner.trace.store",
    "write_trace": "tuner.trace.store",
    "TraceMetadata": "tuner.trace.schema",
    "ingest": "tuner.trace._ingest",
    "IngestReport": "tuner.trace._ingest",
    "detect_format": "tuner.trace.sources",
    "trace_stats": "tuner.trace.stats",
    "TraceStats": "tuner.trace.stats",
    "format_trace_stats": "tuner.trace.stats",
    "stats_rows": "tuner.trace.stats",
    "slice_trace": "tuner.trace.slicing",
    "synthesize": "tuner.trace.synth",
}

__all__ = [
    "TRACE_FORMAT_VERSION",
    "IngestReport",
    "Trace",
    "TraceMetadata",
    "TraceRequest",
    "TraceStats",
    "TraceWriter",
    "detect_format",
    "format_trace_stats",
    "ingest",
    "read_trace",
    "reblock",
    "reblock_request_hashes",
    "slice_trace",
    "stats_rows",
    "synthesize",
    "trace_stats",
    "write_trace",
]

__getattr__ = lazy_getattr(__name__, _LAZY, globals())
