"""The rich tables ``tuner replay`` prints: the headline summary and the per-engine balance."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.metrics.bands import band_lines
from tuner.metrics.percentiles import PERCENTS
from tuner.metrics.summary import Summary
from tuner.units import FIXED, cell, duration

if TYPE_CHECKING:
    from rich.table import Table


def _fixed(value: float, decimals: int, unit: str = "") -> str:
    """The summary's cells: fixed decimals, ``-`` when missing (:data:`tuner.units.FIXED`)."""
    return cell(value, FIXED.with_(digits=decimals, unit=unit))


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
                    *(_fixed(getattr(s, f"p{p}_interactivity"), 1) for p in PERCENTS))
    totals = Table(header_style="bold")
    totals.add_column("throughput, cache and state")
    totals.add_column("value", justify="right")
    rows = [
        ("async_scheduling", "-" if s.async_scheduling is None
         else str(s.async_scheduling).lower()),
        ("output throughput (tok/s/GPU)", _fixed(s.output_throughput_per_gpu, 1)),
        ("total throughput, input+output (tok/s/GPU)", _fixed(s.total_throughput_per_gpu, 1)),
        ("request throughput (req/s)", _fixed(s.request_throughput, 3)),
        ("prefix-cache hit rate", _fixed(s.prefix_cache_hit_rate, 4)),
        ("preemptions", f"{s.preemptions:,}"),
        ("KV usage mean / peak", f"{_fixed(s.kv_usage_mean, 3)} / {_fixed(s.kv_usage_peak, 3)}"),
        ("queue depth mean / peak", f"{_fixed(s.queue_depth_mean, 1)} / {s.queue_depth_peak}"),
        ("requests counted / finished / rejected / unfinished",
         f"{s.num_requests:,} / {s.num_finished:,} / {s.num_rejected:,} / {s.num_unfinished:,}"),
        ("simulated / wall (s)", f"{_fixed(s.simulated_s, 1)} / {_fixed(s.wall_s, 2)}"),
        ("speed (simulated s per wall s)", _fixed(s.speed_ratio, 0, "x")),
    ]
    rows.extend(kv_offload_rows(s.kv_offload))
    for name, value in rows:
        totals.add_row(name, value)
    table = Table.grid(padding=(1, 0))
    table.add_row(latency)
    table.add_row(totals)
    bands = band_lines(s)
    if bands:
        table.add_row("\n".join(bands))
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
                      f"{e.num_finished:,}", _fixed(e.prefix_cache_hit_rate, 4),
                      f"{_fixed(e.kv_usage_mean, 3)} / {_fixed(e.kv_usage_max, 3)}",
                      f"{e.preemptions:,}", f"{e.num_steps:,}", f"{e.num_dummy_steps:,}")
    return table


def kv_offload_rows(kv: dict[str, float] | None) -> list[tuple[str, str]]:
    """The CPU KV tier's lines of the summary (none without a tier)."""
    if kv is None:
        return []
    return [
        ("CPU tier hit rate / GPU + CPU", f"{_fixed(kv['cpu_hit_rate'], 4)} / "
                                          f"{_fixed(kv['combined_hit_rate'], 4)}"),
        ("CPU tier loaded / stored tokens", f"{int(kv['loaded_tokens']):,} / "
                                            f"{int(kv['stored_tokens']):,}"),
        ("CPU tier load / store link time (s)", f"{_fixed(kv['load_s'], 2)} / "
                                                f"{_fixed(kv['store_s'], 2)}"),
        ("CPU tier waiting-for-KV time (s)", _fixed(kv['wait_s'], 2)),
        ("CPU tier deferred lookups / store failures / evicted chunks",
         f"{int(kv['deferred_lookups']):,} / {int(kv['store_failures']):,} / "
         f"{int(kv['evicted_chunks']):,}"),
        ("CPU tier chunks used / total", f"{int(kv['cpu_chunks_used']):,} / "
                                         f"{int(kv['cpu_chunks']):,}"),
    ]
