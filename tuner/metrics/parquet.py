"""The per-request Parquet table of a replay (``tuner replay --requests-out``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from tuner.outputs import AtomicOutput
from tuner.metrics.record_columns import CHUNK_ROWS, STATUS_NAMES, RecordChunk, record_chunks
from tuner.records import ReplayResult, RequestTable, StringColumn


def _schema() -> Any:
    """The records file's columns and types (``tuner.report.replay_report`` reads them)."""
    import pyarrow as pa

    return pa.schema([
        ("request_id", pa.string()), ("arrival_s", pa.float64()), ("input_len", pa.int32()),
        ("output_len", pa.int32()), ("first_scheduled_s", pa.float64()),
        ("first_token_s", pa.float64()), ("finish_s", pa.float64()),
        ("num_cached_tokens", pa.int32()), ("num_preemptions", pa.int32()),
        ("status", pa.string()), ("session_id", pa.string()), ("engine", pa.int32()),
        ("ttft_s", pa.float64()), ("mean_itl_s", pa.float64()),
    ])


def _strings(values: Any, start: int, stop: int) -> Any:
    """Ids ``start .. stop - 1`` as an Arrow string array: straight from a
    ``StringColumn``'s UTF-8 buffer and offsets where the table has one (no Python string
    a row), else from the sequence's strings (or None)."""
    import numpy as np
    import pyarrow as pa

    if isinstance(values, StringColumn):
        data, offsets, null = values.buffers(start, stop)
        valid = None
        if null is not None:
            valid = pa.py_buffer(np.packbits(np.frombuffer(null, dtype=np.uint8) == 0,
                                             bitorder="little").tobytes())
        return pa.LargeStringArray.from_buffers(
            stop - start, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data), valid
        ).cast(pa.string())
    return pa.array(list(values[start:stop]), type=pa.string())


def _batch(chunk: RecordChunk, requests: Any, schema: Any) -> Any:
    """One row group: the chunk's columns (ids from ``requests``), in the schema's types."""
    import pyarrow as pa

    names = pa.array(STATUS_NAMES, type=pa.string())
    start, stop = chunk.start, chunk.start + len(chunk)
    if isinstance(requests, RequestTable):
        ids, session = requests.request_id, requests.session_id
    else:
        rows = requests[start:stop]
        ids = [r.request_id for r in rows]
        session = [r.session_id for r in rows]
        start, stop = 0, len(rows)
    columns = {
        "request_id": _strings(ids, start, stop), "arrival_s": chunk.arrival_s,
        "input_len": chunk.input_len, "output_len": chunk.output_len,
        "first_scheduled_s": chunk.first_scheduled_s, "first_token_s": chunk.first_token_s,
        "finish_s": chunk.finish_s, "num_cached_tokens": chunk.num_cached_tokens,
        "num_preemptions": chunk.num_preemptions,
        "status": names.take(pa.array(chunk.status)),
        "session_id": (_strings(session, start, stop) if session is not None
                       else pa.nulls(len(chunk), type=pa.string())),
        "engine": chunk.engine, "ttft_s": chunk.ttft_s, "mean_itl_s": chunk.mean_itl_s}
    arrays = [pa.array(columns[f.name], type=f.type) if not isinstance(columns[f.name], pa.Array)
              else columns[f.name].cast(f.type) for f in schema]
    return pa.record_batch(arrays, schema=schema)


def write_requests_parquet(result: ReplayResult, path: str | os.PathLike[str], *,
                           inputs: Iterable[str | os.PathLike[str]] = (),
                           rows: int = CHUNK_ROWS) -> Path:
    """Write one row per request (``RequestResult`` fields + engine, ttft_s, mean_itl_s).

    ``engine`` is the engine the request ran on (``replica * dp + dp_rank``, -1 if a
    fleet's front end refused it). Written a row group of ``rows`` requests at a time
    from the result's columns (``tuner.metrics.record_columns``: no Python object a row,
    so a day's replay is written in the memory of one row group), to a temporary file
    beside ``path`` that is renamed at the end, so a crash never leaves a half-written
    table. File metadata records the backend, GPU count, simulated and wall seconds, the
    counters and the per-engine summaries (``engines``, JSON).
    """
    import json

    import pyarrow.parquet as pq

    meta = {"backend": result.backend, "num_gpus": str(result.num_gpus),
            "simulated_s": repr(result.simulated_s), "wall_s": repr(result.wall_s),
            "counters": json.dumps(result.counters), "notes": json.dumps(result.notes),
            "async_scheduling": json.dumps(result.async_scheduling),
            "engines": json.dumps([e.to_dict() for e in result.engines])}
    schema = _schema().with_metadata({k.encode(): v.encode() for k, v in meta.items()})
    with AtomicOutput(path, inputs=inputs) as out:
        with pq.ParquetWriter(out.tmp_path, schema, compression="zstd") as writer:
            for chunk in record_chunks(result.requests, rows=rows):
                writer.write_batch(_batch(chunk, result.requests, schema), row_group_size=rows)
            if not len(result.requests):
                writer.write_table(schema.empty_table())
    return out.path
