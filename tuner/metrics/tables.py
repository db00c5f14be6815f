"""The rich tables ``tuner replay`` prints: the headline summary and the per-engine balance."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tuner.metrics.percentiles import PERCENTS
from tuner.metrics.summary import Summary
from tuner.units import duration

if TYPE_CHECKING:
    from rich.table import Table


def _fmt(value: float, unit: str = "", scale: float = 1.0, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value * scale:,.{digits}f}{unit}"


def summary_table(summary: Summary) -> "Table":
    """A rich table of the headline metrics (what ``tuner replay`` prints)."""
    from rich.table import Table

    s = summary
    window = ("all requests" if s.measure_from_s is None and s.measure_to_s is None
              else f"arrivals in [{s.measure_from_s or 0:g}, "
                   f"{'end' if s.measure_to_s is None else f'{s.measure_to_s:g}'}) s")
    mode = {True: "async scheduling", False: "no async scheduling"}.get(
        s.async_scheduling, "scheduling mode unknown")
    latency = Table(title=f"Replay summary ({s.backend}, {s.num_gpus} GPU, {mode}, {window})",
                    header_style="bold")
    latency.add_column("latency")
    for p in PERCENTS:
        latency.add_column(f"p{p}", justify="right")
    # Each latency with its own unit (ms below a second, s above): "17.4 s", not
    # "17,357.53 ms".
    latency.add_row("TTFT", *(duration(getattr(s, f"ttft_p{p}_s")) for p in PERCENTS))
    latency.add_row("TPOT", *(duration(getattr(s, f"tpot_p{p}_s")) for p in PERCENTS))
    itl_label = "ITL" if s.itl_scope == "window" else "ITL (whole replay)"
    latency.add_row(itl_label, *(duration(getattr(s, f"itl_p{p}_s")) for p in PERCENTS))
    latency.add_row("E2E latency", *(duration(getattr(s, f"e2e_p{p}_s")) for p in PERCENTS))
    latency.add_row("interactivity (tok/s/user)",
                    *(_fmt(getattr(s, f"p{p}_interactivity"), digits=1) for p in PERCENTS))
    totals = Table(header_style="bold")
    totals.add_column("throughput, cache and state")
    totals.add_column("value", justify="right")
    rows = [
        ("async_scheduling", "-" if s.async_scheduling is None
         else str(s.async_scheduling).lower()),
        ("output throughput (tok/s/GPU)", _fmt(s.output_throughput_per_gpu, digits=1)),
        ("total throughput, input+output (tok/s/GPU)", _fmt(s.total_throughput_per_gpu, digits=1)),
        ("request throughput (req/s)", _fmt(s.request_throughput, digits=3)),
        ("prefix-cache hit rate", _fmt(s.prefix_cache_hit_rate, digits=4)),
        ("preemptions", f"{s.preemptions:,}"),
        ("KV usage mean / peak", f"{_fmt(s.kv_usage_mean, digits=3)} / {_fmt(s.kv_usage_peak, digits=3)}"),
        ("queue depth mean / peak", f"{_fmt(s.queue_depth_mean, digits=1)} / {s.queue_depth_peak}"),
        ("requests counted / finished / rejected / unfinished",
         f"{s.num_requests:,} / {s.num_finished:,} / {s.num_rejected:,} / {s.num_unfinished:,}"),
        ("simulated / wall (s)", f"{_fmt(s.simulated_s, digits=1)} / {_fmt(s.wall_s, digits=2)}"),
        ("speed (simulated s per wall s)", _fmt(s.speed_ratio, "x", digits=0)),
    ]
    for name, value in rows:
        totals.add_row(name, value)
    table = Table.grid(padding=(1, 0))
    table.add_row(latency)
    table.add_row(totals)
    return table


def engine_table(summary: Summary) -> "Table":
    """A rich table of the per-engine balance (what ``tuner replay`` prints for a
    data-parallel deployment or a fleet)."""
    from rich.table import Table

    table = Table(title="Per engine (replica x DP rank)", header_style="bold")
    for name in ("engine", "replica", "rank", "requests", "finished", "hit rate",
                 "KV mean / max", "preemptions", "steps", "dummy steps"):
        table.add_column(name, justify="right")
    for e in summary.engines:
        table.add_row(str(e.engine), str(e.replica), str(e.dp_rank), f"{e.num_requests:,}",
                      f"{e.num_finished:,}", _fmt(e.prefix_cache_hit_rate, digits=4),
                      f"{_fmt(e.kv_usage_mean, digits=3)} / {_fmt(e.kv_usage_max, digits=3)}",
                      f"{e.preemptions:,}", f"{e.num_steps:,}", f"{e.num_dummy_steps:,}")
    return table
