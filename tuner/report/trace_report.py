"""The trace's character as report sections: arrivals, lengths, prefix reuse.

Used on its own (``tuner trace report``) and as the last part of a study report, so the
operator sees what traffic a profile was tuned on next to what it did with it.

Per-request ideal prefix reuse is computed here (vectorised, like
:func:`tuner.trace.trace_stats`): a prompt block counts as seen when some *earlier*
request presented its hash, in its prompt or its output continuation; a request's ideal
hit is its leading run of seen blocks (hashes are chained, so that run is the reusable
prefix), capped at its prompt length. Summed over the trace this equals
``trace_stats(...).ideal_prefix_hit_rate`` (a test checks it); here it is binned in time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from tuner.report.charts import (Series, histogram_chart, line_chart)
from tuner.report.html import Figures, Note, Page, Section, Table, fmt

if TYPE_CHECKING:
    from tuner.trace import Trace

#: Time bins for arrival-rate and reuse-over-time charts.
TIME_BINS = 120


@dataclass(frozen=True, slots=True)
class TraceColumns:
    """The per-request arrays the trace charts need (arrival order)."""

    arrival_s: np.ndarray  # seconds on the trace clock
    input_len: np.ndarray  # prompt tokens
    output_len: np.ndarray  # output tokens
    ideal_hit_tokens: np.ndarray  # leading prompt tokens an unbounded cache would hold
    hash_block_size: int


def _flat(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of a list<uint64> column; nulls as empty lists."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    arr = arr.cast(pa.large_list(pa.uint64())).fill_null(
        pa.scalar([], pa.large_list(pa.uint64())))
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = np.asarray(arr.values, dtype=np.uint64)[offsets[0]:offsets[-1]]
    return values, offsets - offsets[0]


def trace_columns(trace: "Trace") -> TraceColumns:
    """Arrays in arrival order plus each request's ideal (unbounded-cache) prefix hit.

    A hash occurrence is "seen" when the first request that presented the hash comes
    before this one; one ``np.unique`` over every occurrence finds first presenters.
    Memory is about 24 bytes per block hash (the agentic hour: 38 M hashes, ~1 GB).
    """
    df = trace.lazy().select(["arrival_s", "input_len", "output_len", "block_hashes",
                              "output_block_hashes"]).collect()
    hbs = int(trace.metadata.hash_block_size)
    arrival = df.get_column("arrival_s").to_numpy().astype(np.float64)
    inp = df.get_column("input_len").to_numpy().astype(np.int64)
    outp = df.get_column("output_len").to_numpy().astype(np.int64)
    n = df.height
    hits = np.zeros(n, dtype=np.int64)
    if n:
        table = df.select(["block_hashes", "output_block_hashes"]).to_arrow()
        pv, po = _flat(table.column("block_hashes"))
        ov, oo = _flat(table.column("output_block_hashes"))
        hits = ideal_hits(pv, po, ov, oo, inp, hbs)
    return TraceColumns(arrival, inp, outp, hits, hbs)


def ideal_hits(pv: np.ndarray, po: np.ndarray, ov: np.ndarray, oo: np.ndarray,
               input_len: np.ndarray, hash_block_size: int, *,
               num_ids: int | None = None) -> np.ndarray:
    """Each request's ideal prefix hit (tokens), from flat prompt/output hashes + offsets.

    ``num_ids``: the values are already dense ids below it (equal hash, equal id), so the
    first presenter of each is found without sorting every occurrence.
    """
    n = len(po) - 1
    plen, olen = np.diff(po), np.diff(oo)
    rows = np.arange(n, dtype=np.int64)
    p_owner, o_owner = np.repeat(rows, plen), np.repeat(rows, olen)
    owners = np.concatenate([p_owner, o_owner])
    if num_ids is None:
        _, inverse = np.unique(np.concatenate([pv, ov]), return_inverse=True)
        inverse = inverse.reshape(-1)
        num_ids = int(inverse.max()) + 1 if len(inverse) else 0
    else:
        inverse = np.concatenate([pv, ov]).astype(np.int64, copy=False)
    first = np.full(num_ids, n, dtype=np.int64)
    np.minimum.at(first, inverse, owners)
    seen = first[inverse[:len(pv)]] < p_owner
    local = np.arange(len(pv), dtype=np.int64) - np.repeat(po[:-1], plen)
    run = plen.copy()
    np.minimum.at(run, p_owner[~seen], local[~seen])
    return np.minimum(run * hash_block_size, input_len)


def _time_bins(arrival: np.ndarray) -> tuple[np.ndarray, float]:
    """Bin index per request and the bin width (s); TIME_BINS bins over the span."""
    t0 = float(arrival[0]) if len(arrival) else 0.0
    span = float(arrival[-1] - t0) if len(arrival) else 0.0
    width = max(span / TIME_BINS, 1e-9) if span > 0 else 1.0
    idx = np.minimum(((arrival - t0) / width).astype(np.int64), TIME_BINS - 1)
    return idx, width


def trace_sections(trace: "Trace", *, name: str = "trace",
                   columns: TraceColumns | None = None, stats: "Any" = None) -> list[Section]:
    """The trace part of a report: a stats table and four charts (arrivals, lengths,
    prefix reuse over time and per request). ``columns``: already computed (a study
    report has them from its one read of the trace)."""
    from tuner.trace import trace_stats

    stats = stats if stats is not None else trace_stats(trace)
    cols = columns if columns is not None else trace_columns(trace)
    sec = Section(f"Trace: {name}")
    if not len(cols.arrival_s):
        sec.blocks.append(Note("The trace has no requests; nothing to chart."))
        return [sec]
    s = stats.to_dict()
    sec.blocks.append(Table(
        ["statistic", "value"],
        [["requests", fmt(s["requests"])], ["duration (s)", fmt(s["duration_s"])],
         ["mean arrival rate (req/s)", fmt(s["arrival_rate_mean_per_s"])],
         ["peak arrivals in one minute", fmt(s["arrival_rate_peak_per_min"])],
         ["input tokens p50 / p90 / p99 / max",
          " / ".join(fmt(s[f"input_len_{k}"]) for k in ("p50", "p90", "p99", "max"))],
         ["output tokens p50 / p90 / p99 / max",
          " / ".join(fmt(s[f"output_len_{k}"]) for k in ("p50", "p90", "p99", "max"))],
         ["sessions (mean / max turns)",
          f"{fmt(s['sessions'])} ({fmt(s['turns_per_session_mean'])} / "
          f"{fmt(s['turns_per_session_max'])})"],
         ["ideal prefix-cache hit rate (unbounded cache)", fmt(s["ideal_prefix_hit_rate"])],
         ["prefix reuse distance p50 / p90 / p99 (s)",
          " / ".join(fmt(s[f"reuse_distance_{k}_s"]) for k in ("p50", "p90", "p99"))],
         ["distinct KV footprint (tokens)", fmt(s["distinct_block_tokens"])],
         ["hash block size (tokens)", fmt(s["hash_block_size"])]],
        caption="trace_stats: what the traffic looks like"))
    idx, width = _time_bins(cols.arrival_s)
    t_mid = (np.arange(TIME_BINS) + 0.5) * width
    arrivals = np.bincount(idx, minlength=TIME_BINS)
    prompt = np.bincount(idx, weights=cols.input_len, minlength=TIME_BINS)
    hit = np.bincount(idx, weights=cols.ideal_hit_tokens, minlength=TIME_BINS)
    with np.errstate(invalid="ignore", divide="ignore"):
        hit_rate = np.where(prompt > 0, hit / prompt, np.nan)
    frac = np.where(cols.input_len > 0, cols.ideal_hit_tokens / np.maximum(cols.input_len, 1),
                    np.nan)
    charts = [
        line_chart([Series("arrivals", t_mid.tolist(), (arrivals / width).tolist())],
                   title="Arrival rate over time",
                   caption=f"Requests per second in {fmt(width, 3)} s bins. Peaks are where "
                           "queues build and the admission window matters most.",
                   x_label="time since first arrival (s)", y_label="arrivals (requests/s)",
                   y_min=0.0),
        histogram_chart(cols.input_len.astype(float).tolist(), log_x=True,
                        title="Prompt length distribution",
                        caption="Requests per prompt-length bin (log-spaced bins). Long prompts "
                                "fill the KV cache; their share drives preemption risk.",
                        x_label="prompt length (tokens, log scale)"),
        histogram_chart(cols.output_len.astype(float).tolist(), log_x=True, color="#D55E00",
                        title="Output length distribution",
                        caption="Requests per output-length bin (log-spaced bins). Long outputs "
                                "hold KV blocks longer and set how many requests decode at once.",
                        x_label="output length (tokens, log scale)"),
        line_chart([Series("ideal hit rate", t_mid.tolist(), hit_rate.tolist(),
                           color="#009E73")],
                   title="Prefix reuse over time",
                   caption="Share of prompt tokens an unbounded prefix cache would serve, per "
                           "time bin. The gap between this and the replay's hit rate is what "
                           "KV pressure costs; cache-aware admission tries to close it.",
                   x_label="time since first arrival (s)",
                   y_label="ideal prefix hit rate (fraction)", y_min=0.0, y_max=1.0),
        histogram_chart(frac[np.isfinite(frac)].tolist(), n_bins=20, color="#009E73",
                        title="Per-request prefix reuse",
                        caption="Requests by the fraction of their prompt already presented by "
                                "an earlier request. A tall bar near 1 means agentic/multi-turn "
                                "traffic whose prefixes are worth keeping cached.",
                        x_label="ideal prefix hit (fraction of the prompt)"),
    ]
    sec.blocks.append(Figures(charts))
    return [sec]


def trace_report(trace: "Trace | str | os.PathLike[str]", *, name: str | None = None) -> Page:
    """A whole page about one trace (``tuner trace report``)."""
    from tuner.trace import read_trace

    if not hasattr(trace, "lazy"):
        path = str(trace)
        trace = read_trace(path)
        name = name or os.path.basename(path)
    label = name or getattr(trace, "source", None) or "trace"
    page = Page(f"Trace report: {label}",
                subtitle="What the traffic looks like: arrivals, lengths and prefix reuse.")
    page.sections.extend(trace_sections(trace, name=label))  # type: ignore[arg-type]
    return page
