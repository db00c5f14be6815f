"""The per-request Parquet table of a replay (``tuner replay --requests-out``)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterable

from tuner.outputs import AtomicOutput
from tuner.records import ReplayResult, RequestResult


def write_requests_parquet(result: ReplayResult, path: str | os.PathLike[str], *,
                           inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Write one row per request (``RequestResult`` fields + engine, ttft_s, mean_itl_s).

    ``engine`` is the engine the request ran on (``replica * dp + dp_rank``, -1 if a
    fleet's front end refused it). Written to a temporary file beside ``path`` and
    renamed, so a crash never leaves a half-written table. File metadata records the
    backend, GPU count, simulated and wall seconds, the counters and the per-engine
    summaries (``engines``, JSON).
    """
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    reqs = result.requests
    cols: dict[str, list[Any]] = {f.name: [getattr(r, f.name) for r in reqs]
                                  for f in dataclasses.fields(RequestResult)}
    engine = getattr(reqs, "engine", None)
    cols["engine"] = list(engine) if engine is not None else [0] * len(reqs)
    cols["ttft_s"] = [r.ttft_s for r in reqs]
    cols["mean_itl_s"] = [r.mean_itl_s for r in reqs]
    schema = pa.schema([
        ("request_id", pa.string()), ("arrival_s", pa.float64()), ("input_len", pa.int32()),
        ("output_len", pa.int32()), ("first_scheduled_s", pa.float64()),
        ("first_token_s", pa.float64()), ("finish_s", pa.float64()),
        ("num_cached_tokens", pa.int32()), ("num_preemptions", pa.int32()),
        ("status", pa.string()), ("session_id", pa.string()), ("engine", pa.int32()),
        ("ttft_s", pa.float64()), ("mean_itl_s", pa.float64()),
    ])
    meta = {"backend": result.backend, "num_gpus": str(result.num_gpus),
            "simulated_s": repr(result.simulated_s), "wall_s": repr(result.wall_s),
            "counters": json.dumps(result.counters), "notes": json.dumps(result.notes),
            "async_scheduling": json.dumps(result.async_scheduling),
            "engines": json.dumps([e.to_dict() for e in result.engines])}
    table = pa.table({name: cols[name] for name in schema.names}, schema=schema)
    table = table.replace_schema_metadata({k.encode(): v.encode() for k, v in meta.items()})
    with AtomicOutput(path, inputs=inputs) as out:
        pq.write_table(table, out.tmp_path, compression="zstd")
    return out.path
