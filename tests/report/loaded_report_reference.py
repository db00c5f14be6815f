"""The replay report as it was built from the whole file in memory (``load_records``'
lists): the oracle the streamed page is compared with. A verbatim copy (with the old
list-based ECDF) of tuner/report/replay_report.py before it streamed."""

from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any

from tuner.errors import ConfigError
from tuner.metrics import percentile
from tuner.report.charts import PALETTE, Series, line_chart
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


def engine_summaries(cols: dict[str, list[Any]], stored: list[dict[str, Any]]
                     ) -> list[dict[str, Any]]:
    """One summary per engine: request figures from the rows, KV usage and steps from the
    stored (whole-replay) summaries; a single-engine file gets one entry."""
    by_engine: dict[int, dict[str, Any]] = {
        int(e["engine"]): dict(e) for e in stored if "engine" in e}
    counts: dict[int, list[float]] = {}
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


def loaded_replay_report(path: str | os.PathLike[str]) -> Page:
    """The report page of a replay's records file (see the module docstring)."""
    cols, meta = load_records(path)
    engines = engine_summaries(cols, meta["engines"])
    n = len(cols["request_id"])
    finished = [i for i in range(n) if cols["status"][i] == "finished"]
    page = Page(f"Replay report: {pathlib.Path(path).name}",
                subtitle="One replay's requests, the deployment's figures and each "
                         "engine's share of the work.")
    summary = Section("Summary")
    ttft = [cols["ttft_s"][i] for i in finished if math.isfinite(cols["ttft_s"][i])]
    queried = sum(e["prefix_cache_queries"] for e in engines)
    rows = [["backend", meta["backend"]], ["GPUs", fmt(meta["num_gpus"])],
            ["engines", fmt(len(engines))], ["requests", fmt(n)],
            ["finished", fmt(len(finished))],
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
        shown = engines[:MAX_CDF_ENGINES]
        by: dict[int, list[int]] = {e["engine"]: [] for e in shown}
        for i in finished:
            if cols["engine"][i] in by:
                by[cols["engine"][i]].append(i)
        sec.blocks.append(Figures([
            cdf_chart([(f"engine {k}", [cols[col][i] for i in idx
                                        if math.isfinite(cols[col][i])])
                       for k, idx in by.items()], log_x=True, colors=PALETTE, title=title,
                      caption=caption, x_label=x_label)
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




def _list_ecdf(values, weights=None):
    pairs = sorted((v, 1.0) for v in values if math.isfinite(v))
    total = sum(w for _, w in pairs)
    xs, ys, acc = [], [], 0.0
    for v, w in pairs:
        acc += w
        if xs and xs[-1] == v:
            ys[-1] = acc / total
        else:
            xs.append(v)
            ys.append(acc / total)
    return xs, ys


def cdf_chart(samples, *, title, caption, x_label, log_x=False, dashed=(), colors=()):
    series = []
    for i, (label, values) in enumerate(samples):
        xs, ys = _list_ecdf(values)
        series.append(Series(label, xs, ys, color=colors[i] if i < len(colors) else None,
                             dashed=bool(dashed[i]) if i < len(dashed) else False))
    return line_chart(series, title=title, caption=caption, x_label=x_label,
                      y_label="fraction of requests (CDF)", y_min=0.0, y_max=1.0, log_x=log_x,
                      ref_y=(0.9, "p90"))
