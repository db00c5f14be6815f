"""``slice_trace``: time windows (train / held-out splits, periodic jobs) and time scaling."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import polars as pl

from tuner.errors import ConfigError
from tuner.trace.schema import MAX_SPAN_S
from tuner.trace.store import Trace


def slice_trace(trace: Trace, start_s: float | None = None, end_s: float | None = None,
                last_s: float | None = None, speedup: float = 1.0) -> Trace:
    """Requests with ``start_s <= arrival_s < end_s``, re-based to start at 0.

    ``last_s`` takes the final ``last_s`` seconds (up to and including the last arrival)
    instead of ``start_s``/``end_s``. ``speedup`` divides the re-based arrival times
    (2.0 replays the window twice as fast). The origin moves to the window start, so
    ``origin_utc`` still names the instant of ``arrival_s = 0``.

    Raises:
        ConfigError: ``last_s`` mixed with ``start_s``/``end_s``, a non-positive
            ``speedup``, an empty window, or a slowed window longer than a trace may
            span (:data:`~tuner.trace.schema.MAX_SPAN_S`: it would not read back).
    """
    if last_s is not None and (start_s is not None or end_s is not None):
        raise ConfigError("use either --last or --start/--end, not both")
    if not 0 < speedup <= 1e6:  # NaN fails this too (it wrote NaN arrivals)
        raise ConfigError(f"--speedup {speedup}: must be a finite number > 0 (at most 1e6)")
    for name, value in (("--start", start_s), ("--end", end_s), ("--last", last_s)):
        if value is not None and not math.isfinite(value):
            raise ConfigError(f"{name} {value}: must be a finite time")
    first, last = trace.time_range()
    if last_s is not None:
        if last_s <= 0:
            raise ConfigError(f"--last must be > 0, got {last_s}")
        lo, hi = last - last_s, float("inf")
    else:
        lo = first if start_s is None else start_s
        hi = float("inf") if end_s is None else end_s
    if hi <= lo:
        raise ConfigError(f"empty window: end {hi} <= start {lo}")
    frame = (trace.lazy()
             .filter((pl.col("arrival_s") >= lo) & (pl.col("arrival_s") < hi))
             .with_columns((pl.col("arrival_s") - lo) / speedup))
    df = frame.collect()
    if df.height == 0:
        raise ConfigError(f"no requests in [{lo}, {hi}) (trace spans {first}..{last} s)")
    span = df["arrival_s"].max() - df["arrival_s"].min()  # type: ignore[operator]
    if span > MAX_SPAN_S:  # a slow-down (speedup < 1) can stretch a window past what reads back
        raise ConfigError(
            f"--speedup {speedup}: the window would span {span / 86400:.3g} days; a trace "
            f"spans at most {MAX_SPAN_S / 86400:.0f} days (use a larger --speedup)")
    origin = trace.metadata.origin_utc
    if origin:
        origin = (datetime.fromisoformat(origin.replace("Z", "+00:00"))
                  + timedelta(seconds=lo)).isoformat()
    meta = trace.metadata.replace(num_rows=df.height, origin_utc=origin)
    return Trace(df.lazy(), meta, source=trace.source)
