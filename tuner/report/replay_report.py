"""The report of one replay's records (``tuner replay --out FILE.parquet``).

Why: a fleet or a data-parallel deployment is judged by its balance as much as by its
percentiles; the records a replay writes (one row per request with its ``engine``, and
the per-engine summaries in the file's metadata, ``tuner.metrics.
write_requests_parquet``) are enough to show both without replaying again. The page has
the deployment's figures, the per-engine balance (:mod:`tuner.report.engines`: requests,
share, hit rate, KV usage, preemptions, steps) and TTFT and per-request ITL
distributions per engine.

Per-engine request figures are recounted from the rows (the whole file); KV usage and
steps come from the metadata (whole replay), as ``tuner.metrics.summarize`` does.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any

import numpy as np

from tuner.errors import ConfigError
from tuner.metrics import percentile
from tuner.report.charts import PALETTE, cdf_chart
from tuner.report.engines import engine_rows, imbalance
from tuner.report.html import Figures, Note, Page, Section, Table, fmt

#: Engines drawn as separate CDF lines; more are summarised by the table only.
MAX_CDF_ENGINES = 8
#: Columns a replay's records file has (and a trace file does not).
RECORD_COLUMNS = ("request_id", "engine", "status", "ttft_s", "mean_itl_s", "num_cached_tokens")


def is_replay_records(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a Parquet file written by ``tuner replay --out``."""
    import pyarrow.parquet as pq

    p = pathlib.Path(path)
    if p.suffix != ".parquet" or not p.is_file():
        return False
    try:
        names = set(pq.read_schema(p).names)
    except (OSError, ValueError):
        return False
    return set(RECORD_COLUMNS) <= names


def load_records(path: str | os.PathLike[str]) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """(columns, metadata) of a replay's records file.

    Raises:
        ConfigError: unreadable, or not a replay's records (names the missing columns).
    """
    import pyarrow.parquet as pq

    p = pathlib.Path(path)
    try:
        table = pq.read_table(p)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{p}: not a readable Parquet file ({exc})") from None
    missing = [c for c in RECORD_COLUMNS if c not in table.column_names]
    if missing:
        raise ConfigError(f"{p}: not a replay's records (tuner replay --out): no column "
                          f"{', '.join(missing)}")
    raw = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    meta: dict[str, Any] = {"backend": raw.get("backend", "?"),
                            "num_gpus": int(raw.get("num_gpus", "1") or 1),
                            "engines": json.loads(raw.get("engines", "[]") or "[]")}
    return table.to_pydict(), meta


#: Rows read from the records file at a time (a row group as ``tuner replay --out``
#: writes them).
SCAN_ROWS = 65_536
#: Columns the page reads (of RECORD_COLUMNS and the rest of the file's).
_SCAN_COLUMNS = ("engine", "status", "first_scheduled_s", "input_len", "num_cached_tokens",
                 "num_preemptions", "ttft_s", "mean_itl_s")


class RecordScan:
    """What the page needs from a records file, read a batch of rows at a time.

    Why: the page used to load the whole file as Python lists (~14 objects a row), so a
    day's replay cost its report hundreds of MB. Kept: the counts of every engine and,
    per finished request, its TTFT and mean ITL (16 bytes, numpy) for the percentiles and
    the CDFs, in file order; nothing else a row.
    """

    def __init__(self) -> None:
        self.num_rows = 0
        #: engine -> [requests, finished, queries, hits, preemptions] (as engine_summaries)
        self.counts: dict[int, list[int]] = {}
        self._ttft: dict[int, list[Any]] = {}  # engine -> finished rows' ttft_s chunks
        self._itl: dict[int, list[Any]] = {}  # ... and mean_itl_s

    def add(self, batch: Any) -> None:
        """Fold in one record batch (the file's next rows)."""
        import numpy as np

        def col(name: str, fill: Any, dtype: Any) -> Any:
            arr = batch.column(name)
            if arr.null_count:
                arr = arr.fill_null(fill)
            return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)

        self.num_rows += batch.num_rows
        engine = col("engine", -1, np.int64)
        done = np.asarray(batch.column("status").to_numpy(zero_copy_only=False)) == "finished"
        sched = col("first_scheduled_s", math.nan, np.float64)
        admitted = np.isfinite(sched)
        input_len = col("input_len", 0, np.int64)
        cached = col("num_cached_tokens", 0, np.int64)
        preempted = col("num_preemptions", 0, np.int64)
        ttft = col("ttft_s", math.nan, np.float64)
        itl = col("mean_itl_s", math.nan, np.float64)
        for e in np.unique(engine[engine >= 0]).tolist():  # -1: refused before routing
            on = engine == e
            acc = self.counts.setdefault(e, [0, 0, 0, 0, 0])
            acc[0] += int(on.sum())
            acc[1] += int((on & done).sum())
            acc[2] += int(input_len[on & admitted].sum())
            acc[3] += int(cached[on & admitted].sum())
            acc[4] += int(preempted[on].sum())
            self._ttft.setdefault(e, []).append(ttft[on & done])
            self._itl.setdefault(e, []).append(itl[on & done])
        # finished rows of no engine (a file without engines): still in the summary's TTFT
        orphan = done & (engine < 0)
        if orphan.any():
            self._ttft.setdefault(-1, []).append(ttft[orphan])

    @property
    def num_finished(self) -> int:
        return sum(c[1] for c in self.counts.values()) + sum(
            len(a) for a in self._ttft.get(-1, ()))

    def finished_values(self, column: str, engine: int) -> Any:
        """``ttft_s`` or ``mean_itl_s`` of one engine's finished rows, file order."""
        import numpy as np

        parts = (self._ttft if column == "ttft_s" else self._itl).get(engine, [])
        return np.concatenate(parts) if parts else np.zeros(0)

    def finished_ttft(self) -> Any:
        """Every finished row's TTFT in file order (what the summary's percentiles read)."""
        import numpy as np

        return np.concatenate([a for parts in self._ttft.values() for a in parts]
                              or [np.zeros(0)])


def scan_records(path: str | os.PathLike[str]) -> tuple[RecordScan, dict[str, Any]]:
    """(scan, metadata) of a replay's records file, read :data:`SCAN_ROWS` rows at a time.

    Raises:
        ConfigError: unreadable, or not a replay's records (names the missing columns).
    """
    import pyarrow.parquet as pq

    p = pathlib.Path(path)
    try:
        handle = pq.ParquetFile(p)
        names = handle.schema_arrow.names
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{p}: not a readable Parquet file ({exc})") from None
    missing = [c for c in RECORD_COLUMNS if c not in names]
    if missing:
        raise ConfigError(f"{p}: not a replay's records (tuner replay --out): no column "
                          f"{', '.join(missing)}")
    raw = {k.decode(): v.decode() for k, v in (handle.schema_arrow.metadata or {}).items()}
    meta: dict[str, Any] = {"backend": raw.get("backend", "?"),
                            "num_gpus": int(raw.get("num_gpus", "1") or 1),
                            "engines": json.loads(raw.get("engines", "[]") or "[]")}
    scan = RecordScan()
    try:
        for batch in handle.iter_batches(batch_size=SCAN_ROWS, columns=list(_SCAN_COLUMNS)):
            scan.add(batch)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{p}: not a readable Parquet file ({exc})") from None
    return scan, meta


def _merged_engines(counts: dict[int, list[int]], stored: list[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """One summary per engine: request figures from ``counts`` (the rows), KV usage and
    steps from the stored (whole-replay) summaries."""
    by_engine: dict[int, dict[str, Any]] = {
        int(e["engine"]): dict(e) for e in stored if "engine" in e}
    out = []
    for engine in sorted(set(counts) | set(by_engine)):
        c = counts.get(engine, [0, 0, 0, 0, 0])
        e = by_engine.get(engine, {"engine": engine})
        e.update(num_requests=int(c[0]), num_finished=int(c[1]),
                 prefix_cache_queries=int(c[2]), prefix_cache_hits=int(c[3]),
                 preemptions=int(c[4]),
                 prefix_cache_hit_rate=c[3] / c[2] if c[2] else math.nan)
        out.append(e)
    return out


def engine_summaries(cols: dict[str, list[Any]], stored: list[dict[str, Any]]
                     ) -> list[dict[str, Any]]:
    """One summary per engine of :func:`load_records`' columns: request figures from the
    rows, KV usage and steps from the stored (whole-replay) summaries; a single-engine
    file gets one entry. (The page itself reads the file streamed, :func:`scan_records`.)"""
    counts: dict[int, list[int]] = {}
    for i, engine in enumerate(cols["engine"]):
        if engine is None or int(engine) < 0:  # refused at the fleet's front end
            continue
        acc = counts.setdefault(int(engine), [0, 0, 0, 0, 0])
        acc[0] += 1
        acc[1] += cols["status"][i] == "finished"
        if math.isfinite(cols["first_scheduled_s"][i]):
            acc[2] += cols["input_len"][i]
            acc[3] += cols["num_cached_tokens"][i]
        acc[4] += cols["num_preemptions"][i]
    return _merged_engines(counts, stored)


def replay_report(path: str | os.PathLike[str]) -> Page:
    """The report page of a replay's records file (see the module docstring), read a
    batch of rows at a time (:func:`scan_records`)."""
    scan, meta = scan_records(path)
    engines = _merged_engines(scan.counts, meta["engines"])
    page = Page(f"Replay report: {pathlib.Path(path).name}",
                subtitle="One replay's requests, the deployment's figures and each "
                         "engine's share of the work.")
    summary = Section("Summary")
    ttft = scan.finished_ttft()
    ttft = ttft[np.isfinite(ttft)]
    queried = sum(e["prefix_cache_queries"] for e in engines)
    rows = [["backend", meta["backend"]], ["GPUs", fmt(meta["num_gpus"])],
            ["engines", fmt(len(engines))], ["requests", fmt(scan.num_rows)],
            ["finished", fmt(scan.num_finished)],
            ["TTFT p50 / p90 (s)", f"{fmt(percentile(ttft, 50))} / {fmt(percentile(ttft, 90))}"],
            ["prefix-cache hit rate",
             fmt(sum(e["prefix_cache_hits"] for e in engines) / queried) if queried
             else "\u2013"]]
    summary.blocks.append(Table(["", ""], rows))
    page.sections.append(summary)
    sec = Section("Per-engine balance")
    if len(engines) <= 1:
        sec.blocks.append(Note("One engine: nothing to balance (replay with --dp or "
                               "--replicas for a multi-engine deployment)."))
    else:
        sec.blocks.append(Note("Engines are replica x DP rank (engine = replica x dp + rank). "
                               "Requests, hit rate and preemptions are recounted from the "
                               "rows; KV usage and steps are the replay's own, per engine."))
        sec.blocks.append(Table(
            ["engine", "replica", "DP rank", "requests", "share", "finished",
             "prefix-cache hit rate", "KV usage mean", "KV usage peak", "preemptions",
             "steps"], engine_rows(engines), caption=imbalance(engines)))
        shown = [e["engine"] for e in engines[:MAX_CDF_ENGINES]]
        sec.blocks.append(Figures([
            cdf_chart([(f"engine {k}", scan.finished_values(col, k)) for k in shown],
                      log_x=True, colors=PALETTE, title=title, caption=caption,
                      x_label=x_label)
            for col, title, caption, x_label in (
                ("ttft_s", "TTFT by engine",
                 "Fraction of each engine's requests whose time to first token is at most x: "
                 "a curve far right of the others is an engine with a queue.",
                 "time to first token (s, log scale)"),
                ("mean_itl_s", "Per-request ITL by engine",
                 "Fraction of each engine's requests whose mean inter-token latency is at "
                 "most x: p90 interactivity is 1 / where a curve reaches 0.9.",
                 "per-request mean inter-token latency (s, log scale)"))]))
        if len(engines) > MAX_CDF_ENGINES:
            sec.blocks.append(Note(f"CDFs show the first {MAX_CDF_ENGINES} of {len(engines)} "
                                   "engines; the table has all."))
    page.sections.append(sec)
    return page


__all__ = ["RecordScan", "engine_summaries", "is_replay_records", "load_records", "replay_report",
           "scan_records"]
