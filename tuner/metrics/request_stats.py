"""What a summary needs from the per-request records, gathered a chunk at a time.

Why: :func:`tuner.metrics.summarize` used to list every counted ``RequestResult`` (a
Python object a request, several lists of them) before computing a figure; a 24-hour
replay then held its whole table twice over as objects. :class:`RequestStats` reads
``RecordChunk``\\ s (``tuner.metrics.record_columns``) in trace order and keeps, per
counted request, only the floats a percentile or a late-known bound needs:

* TTFT of every counted request that produced a token (8 bytes);
* TPOT, E2E (and, for goodput, TTFT) of every finished one (24 bytes);
* the first admission of every counted request not rejected (8 bytes: the backlog is
  counted against the last arrival, known only at the end);
* running sums and extremes for the rest (tokens, hits, preemptions, spans), and
  per-engine counters for the windowed engine table.

So the state is at most 40 bytes a counted request, in numpy arrays, and none per
uncounted one. The values are the same IEEE operations on the same numbers in the same
order as the per-object code computed (concatenated in trace order), so every figure is
bit-identical (tests/metrics/test_streamed_summary.py compares with that code).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.metrics.record_columns import FINISHED, REJECTED, RecordChunk

if TYPE_CHECKING:
    from tuner.perf.api_server import ClientClock

__all__ = ["RequestStats"]

_NAN = math.nan


class RequestStats:
    """Accumulate the request-derived figures of a summary over ``[lo, hi)`` arrivals.

    Call order: :meth:`add` each chunk (trace order), then read the properties.

    Args:
        lo, hi: the measurement window on arrival times (None: unbounded).
        engines: engine indices to count per engine (windowed engine table), or ().
        slo_ms: the goodput SLOs (``tuner.metrics.slo``); None: no goodput.
        client: the API server's :class:`~tuner.perf.api_server.ClientClock`; None: the
            engine's times as recorded.
    """

    def __init__(self, lo: float | None, hi: float | None, *, engines: Iterable[int] = (),
                 slo_ms: dict[str, float] | None = None,
                 client: "ClientClock | None" = None) -> None:
        self.lo, self.hi = lo, hi
        #: the API server between engine and client (``tuner.perf.api_server``): token
        #: times are read as the client sees them; None: the engine's own times
        self.client = client
        self.slo_ms = slo_ms
        self.num_counted = 0
        self.num_finished = 0
        self.num_rejected = 0
        self.num_good = 0
        self.in_tokens = 0  # finished counted requests' prompt tokens
        self.out_tokens = 0  # ... and output tokens
        self.queries = 0  # prompt tokens of counted requests ever admitted
        self.hits = 0  # their prefix-cache hits (tokens)
        self.preemptions = 0  # over counted requests
        self.t0 = math.inf  # earliest first admission of a finished counted request
        self.t1 = -math.inf  # latest finish of one
        self.first_live = math.inf  # earliest / latest arrival of a counted, not rejected
        self.last_live = -math.inf
        self.num_live = 0
        self.arrival_min = math.inf  # over every record (the empty-window error names it)
        self.arrival_max = -math.inf
        self.num_records = 0
        self._ttft: list[np.ndarray] = []
        self._tpot: list[np.ndarray] = []
        self._e2e: list[np.ndarray] = []
        self._live_sched: list[np.ndarray] = []
        #: engine -> [requests, finished, queries, hits, preemptions] in the window
        self.per_engine: dict[int, list[int]] = {int(e): [0, 0, 0, 0, 0] for e in engines}

    # ----------------------------------------------------------------- reading
    def _window(self, arrival: np.ndarray) -> np.ndarray | None:
        """Mask of the counted rows (None: all of them)."""
        lo, hi = self.lo, self.hi
        if lo is None and hi is None:
            return None
        mask = np.ones(len(arrival), dtype=bool)
        if lo is not None:
            mask &= arrival >= lo
        if hi is not None:
            mask &= arrival < hi
        return mask

    def add(self, chunk: RecordChunk) -> None:
        """Fold one chunk of records (the next rows in trace order) in."""
        n = len(chunk)
        if not n:
            return
        self.num_records += n
        self.arrival_min = min(self.arrival_min, float(np.nanmin(chunk.arrival_s))
                               if not np.isnan(chunk.arrival_s).all() else math.inf)
        self.arrival_max = max(self.arrival_max, float(np.nanmax(chunk.arrival_s))
                               if not np.isnan(chunk.arrival_s).all() else -math.inf)
        mask = self._window(chunk.arrival_s)

        def rows(column: np.ndarray) -> np.ndarray:
            return column if mask is None else column[mask]

        status = rows(chunk.status)
        arrival = rows(chunk.arrival_s)
        first_token = rows(chunk.first_token_s)
        first_sched = rows(chunk.first_scheduled_s)
        finish = rows(chunk.finish_s)
        input_len, output_len = rows(chunk.input_len), rows(chunk.output_len)
        if self.client is not None:  # first and last token as they reach the client
            delay = self.client.delays(arrival, first_sched, input_len)
            first_token = self.client.shift(first_token, delay)
            finish = self.client.shift(finish, delay)
        cached, preempted = rows(chunk.num_cached_tokens), rows(chunk.num_preemptions)
        self.num_counted += len(status)
        done = status == FINISHED
        rejected = status == REJECTED
        self.num_finished += int(done.sum())
        self.num_rejected += int(rejected.sum())
        self._ttft.append((first_token - arrival)[np.isfinite(first_token)])
        f_first, f_arrival, f_finish = first_token[done], arrival[done], finish[done]
        f_out = output_len[done]
        many = f_out >= 2
        self._tpot.append((f_finish[many] - f_first[many]) / (f_out[many] - 1))
        self._e2e.append(f_finish - f_arrival)
        if done.any():
            self.t0 = min(self.t0, float(first_sched[done].min()))
            self.t1 = max(self.t1, float(f_finish.max()))
            self.out_tokens += int(f_out.sum())
            self.in_tokens += int(input_len[done].sum())
            if self.slo_ms:
                self.num_good += _good(f_first - f_arrival, f_finish - f_arrival, f_out,
                                       self.slo_ms)
        admitted = np.isfinite(first_sched)
        self.queries += int(input_len[admitted].sum())
        self.hits += int(cached[admitted].sum())
        self.preemptions += int(preempted.sum())
        live = ~rejected
        if live.any():
            live_arrival = arrival[live]
            self.first_live = min(self.first_live, float(live_arrival.min()))
            self.last_live = max(self.last_live, float(live_arrival.max()))
            self.num_live += int(live.sum())
            self._live_sched.append(first_sched[live])
        if self.per_engine:
            self._add_engines(rows(chunk.engine), done, admitted, input_len, cached,
                              preempted)

    def _add_engines(self, engine: np.ndarray, done: np.ndarray, admitted: np.ndarray,
                     input_len: np.ndarray, cached: np.ndarray, preempted: np.ndarray) -> None:
        for e, acc in self.per_engine.items():
            on = engine == e
            if not on.any():
                continue
            acc[0] += int(on.sum())
            acc[1] += int((on & done).sum())
            seen = on & admitted
            acc[2] += int(input_len[seen].sum())
            acc[3] += int(cached[seen].sum())
            acc[4] += int(preempted[on].sum())

    # ----------------------------------------------------------------- results
    @staticmethod
    def _joined(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0)

    @property
    def ttft(self) -> np.ndarray:
        """TTFT (s) of the counted requests with a first token, trace order."""
        return self._joined(self._ttft)

    @property
    def tpot(self) -> np.ndarray:
        """Per-request mean ITL (s) of the finished counted ones with >= 2 tokens."""
        return self._joined(self._tpot)

    @property
    def e2e(self) -> np.ndarray:
        """Arrival -> last token (s) of the finished counted requests."""
        return self._joined(self._e2e)

    @property
    def backlog(self) -> int:
        """Counted live requests not admitted by the last live arrival."""
        if not self.num_live:
            return 0
        sched = self._joined(self._live_sched)
        admitted = np.isfinite(sched) & (sched <= self.last_live)
        return int(len(sched) - admitted.sum())


def _good(ttft: np.ndarray, e2el: np.ndarray, output_len: np.ndarray,
          slo_ms: dict[str, float]) -> int:
    """Finished requests meeting every SLO: ``tuner.metrics.slo.good_requests`` on
    columns (the same operations: TPOT = (E2E - TTFT) / (tokens - 1), 0 for one token)."""
    tpot = np.zeros(len(ttft))
    many = output_len > 1
    tpot[many] = (e2el[many] - ttft[many]) / (output_len[many] - 1)
    values: dict[str, Any] = {"ttft": ttft, "tpot": tpot, "e2el": e2el}
    ok = np.ones(len(ttft), dtype=bool)
    for key, bound in slo_ms.items():
        ok &= values[key] * 1e3 <= bound
    return int(ok.sum())
