"""vLLM 0.33.0's internal data-parallel load balancer: which DP rank gets a request.

With ``--data-parallel-size N`` one API server fronts N engine cores. Its client
(``DPLBAsyncMPClient.get_core_engine_for_request``, v1/engine/core_client.py:1751-1812 @
0.33.0) scores every rank and sends the request to the lowest score:

    score = max(client_count * inflight, waiting + running)
    if waiting: score += waiting * 6.0 * max(0.0, kv_cache_usage - 0.5)

scanning from a start index that rotates by one per request (ties go to the first rank
scanned), then adds ``client_count`` to the chosen rank's *local copy* of its waiting
count. ``inflight`` is exact: the client's own count of its unfinished requests per rank
(+1 on routing, core_client.py:1811; -1 when the rank reports it finished, :1825).
``waiting``, ``running`` and ``kv_cache_usage`` are stale: each engine publishes its counts to the DP coordinator
when they change (``_maybe_publish_request_counts``, core.py:1634-1645), and the
coordinator forwards a snapshot of all ranks at most every
``min_stats_update_interval_ms = 100`` ms (v1/engine/coordinator.py:152, 264-290); the
client replaces its whole list with each snapshot (core_client.py:1588-1598), which also
drops its local increments.

The replay models that staleness exactly as a clock: snapshots at multiples of
``stats_interval_s`` on the replay clock, each holding every rank's counts as they were
at that instant. One API server: ``client_count = 1``, ``client_index = 0``.

Plain Python (``tuner.sim``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["DPLoadBalancer", "STATS_INTERVAL_S"]

#: The coordinator's ``min_stats_update_interval_ms`` default (coordinator.py:152).
STATS_INTERVAL_S = 0.1

#: ``(waiting, running, kv_cache_usage)`` of one rank now (vLLM's ``SchedulerStats``).
Counts = tuple[int, int, float]


class DPLoadBalancer:
    """The rank choice of one API server over ``dp`` engine cores (see the module doc).

    Args:
        dp: ranks.
        counts: ``counts(rank)`` -> the rank's live ``(waiting, running, kv_usage)``;
            read only at snapshot instants (what the coordinator would publish).
        stats_interval_s: the coordinator's publishing period.
        client_count: API servers sharing the ranks (vLLM ``--api-server-count``).
    """

    def __init__(self, dp: int, counts: Callable[[int], Counts], *,
                 stats_interval_s: float = STATS_INTERVAL_S, client_count: int = 1) -> None:
        if dp < 1:
            raise ValueError(f"dp={dp} must be >= 1")
        self.dp = dp
        self.counts = counts
        self.interval = stats_interval_s
        self.client_count = client_count
        self.lb_engines: list[list[float]] = [[0, 0, 0.0] for _ in range(dp)]
        self.inflight = [0] * dp
        self.start_index = 0  # eng_start_index = dp * client_index // client_count = 0
        self._next_snapshot_s = 0.0  # the coordinator's first publish
        self._rank_of: dict[int, int] = {}

    def observe(self, now_s: float) -> None:
        """Take the latest coordinator snapshot due at or before ``now_s``.

        Call before anything changes the ranks at ``now_s`` or later: the live counts
        then still are those of the snapshot instant (nothing happens between events).
        """
        if now_s < self._next_snapshot_s:
            return
        self.lb_engines = [list(self.counts(rank)) for rank in range(self.dp)]
        ticks = math.floor(now_s / self.interval) + 1
        self._next_snapshot_s = ticks * self.interval

    def scores(self) -> list[float]:
        """Each rank's score now (lower is better), core_client.py:1786-1794."""
        out = []
        for rank in range(self.dp):
            waiting, running, kv_usage = self.lb_engines[rank]
            score = max(self.client_count * self.inflight[rank], waiting + running)
            if waiting:
                score += waiting * 6.0 * max(0.0, kv_usage - 0.5)
            out.append(float(score))
        return out

    def choose(self, index: int, now_s: float) -> int:
        """The rank for request ``index`` arriving at ``now_s``, with vLLM's bookkeeping."""
        self.observe(now_s)
        scores = self.scores()
        best, best_score = 0, math.inf
        for i in range(self.dp):
            rank = (self.start_index + i) % self.dp
            if scores[rank] < best_score:
                best, best_score = rank, scores[rank]
        self.lb_engines[best][0] += self.client_count
        self.start_index = (self.start_index + 1) % self.dp
        self.assign(index, best)
        return best

    def assign(self, index: int, rank: int) -> None:
        """Request ``index`` goes to ``rank`` (chosen here, or pinned by the request's
        ``data_parallel_rank`` as a DP-aware router sets it: vLLM then skips the scan,
        core_client.py:1763, but still counts it in flight)."""
        self.inflight[rank] += 1
        self._rank_of[index] = rank

    def finished(self, index: int) -> None:
        """The rank reported request ``index`` finished (``process_engine_outputs``)."""
        rank = self._rank_of.pop(index, None)
        if rank is not None:
            self.inflight[rank] -= 1
