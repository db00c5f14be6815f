"""The LRU pool's eviction order as sorted runs of ``(rank, key)`` entries.

Why runs and not a heap of keys: the agentic hour's 512 GiB pool fills in its second
minute and from then on evicts about one chunk per chunk it stores (~2.5 M in the first
10 minutes). A key-at-a-time heap paid one Python-level pop or sift per evicted key and per
stale entry (~9 us a chunk in all). Ranks change by whole runs (a request's access, its
finish, a store job's completion), so each change is pushed as one numpy-sorted run, and
an eviction reads the oldest run a slice at a time: per eviction call a few numpy
operations per run touched, not per key.

Entries are eager and never removed in place: a key whose rank changes gets a new entry in
a new run, and its old entry goes stale. An entry ``(r, k)`` is *live* while ``k`` is in
the pool, idle (ref count 0, store complete) and ``rank[k] == r``; the pool guarantees
that every idle key has a live entry (it pushes one whenever a key becomes idle or an
idle key's rank changes). The smallest live entries, in ``(rank, key)`` order, are the
plain heap's pops (``tests/sim/_kv_pool_plain.py``: ties on the rank, which only the
generated tests make, go to the smaller key there too).

Taking entries in order across runs: the runs sit in a heap by their first unread entry;
the smallest run is read up to the second-smallest run's head (every entry there is
smaller than anything in the other runs), then they swap. A run is read in windows of a
few times what is still needed, so a long run is not scanned to take a few keys.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
import numpy as np

__all__ = ["EvictionOrder"]

_I64 = np.int64


@dataclass(slots=True)
class _Run:
    """One pushed run, sorted by (rank, key); ``cursor``: the first entry not yet read."""

    ranks: np.ndarray
    keys: np.ndarray
    cursor: int = 0


def _sorted_run(ranks: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ranks, keys)`` in (rank, key) order; most runs arrive in rank order or reversed
    (a request's keys rank tail first), so the sort is usually a check or a reversal."""
    if len(ranks) > 1:
        steps = np.diff(ranks)
        if (steps > 0).all():
            return ranks, keys
        if (steps < 0).all():
            return ranks[::-1], keys[::-1]
        return _sort_entries(ranks, keys)
    return ranks, keys


def _sort_entries(ranks: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ranks, keys)`` in (rank, key) order, equal pairs once. One sort by rank: ranks
    of distinct keys are distinct but in generated tests, and a key met twice in one take
    comes back twice with the same rank; only a tie between two keys takes the two-key
    sort (``lexsort``, several times slower than ``argsort`` on the ~6k-entry batches a
    take puts back on the hour's first 10 minutes)."""
    order = np.argsort(ranks)
    r, k = ranks[order], keys[order]
    tie = r[1:] == r[:-1]
    if not tie.any():
        return r, k
    if not (k[1:][tie] == k[:-1][tie]).all():  # two keys on one rank: by key within it
        order = np.lexsort((keys, ranks))
        r, k = ranks[order], keys[order]
        tie = (r[1:] == r[:-1]) & (k[1:] == k[:-1])
    keep = np.concatenate([[True], ~tie])
    return r[keep], k[keep]


def _upto(ranks: np.ndarray, keys: np.ndarray, rank: int, key: int) -> int:
    """How many entries of a sorted run are at or below ``(rank, key)`` (one search:
    equal ranks, which only generated tests make, take two more)."""
    lo = int(np.searchsorted(ranks, rank, "left"))
    if lo == len(ranks) or ranks[lo] != rank:
        return lo
    hi = int(np.searchsorted(ranks, rank, "right"))
    return lo + int(np.searchsorted(keys[lo:hi], key, "right"))


class EvictionOrder:
    """Sorted runs of ``(rank, key)`` entries; see the module doc."""

    def __init__(self) -> None:
        self._runs: dict[int, _Run] = {}
        self._heap: list[tuple[int, int, int]] = []  # (head rank, head key, run id)
        self._next_id = 0
        self.size = 0  # entries not yet read (live or stale)

    def push(self, ranks: np.ndarray, keys: np.ndarray) -> None:
        """Add entries (distinct keys); any order."""
        if not len(keys):
            return
        self._push_sorted(*_sorted_run(np.asarray(ranks, _I64), np.asarray(keys, _I64)))

    def _push_sorted(self, ranks: np.ndarray, keys: np.ndarray) -> None:
        """Add a run already in ``(rank, key)`` order (int64, distinct keys)."""
        run_id = self._next_id
        self._next_id += 1
        self._runs[run_id] = _Run(ranks, keys)
        heapq.heappush(self._heap, (int(ranks[0]), int(keys[0]), run_id))
        self.size += len(keys)

    def reset(self, ranks: np.ndarray, keys: np.ndarray) -> None:
        """Drop every run and start again from the given (live) entries: what a pool does
        when stale entries dominate, or after its keys are renumbered."""
        self._runs.clear()
        self._heap.clear()
        self.size = 0
        self.push(ranks, keys)

    def take(self, n: int, state: np.ndarray) -> list[np.ndarray]:
        """The ``n`` idle, unprotected keys of smallest ``(rank, key)``, in order, as key
        arrays. ``state``: each key's signed idle rank (the pool's ``_idle_rank``): its
        true rank while it is idle (stored, store complete, ref count 0), minus that rank
        while it is also protected, 0 otherwise; ranks are >= 1. One int64 per key, so a
        window reads one array at its keys instead of three (idle, rank and protected
        flags: the gathers were the per-entry part of a window's cost). The caller
        guarantees that ``n`` such keys exist and that every idle key has an entry at or
        below its true rank. The taken keys' state is set to 0 as they are taken (so
        another entry of a taken key reads stale); the caller does the rest of the
        eviction once on all of them (one call per window did it before: a Python call
        and three array operations per window).

        An entry below its key's true rank (the rank rose since it was pushed) goes back
        in at the true rank (``LRUPolicy``'s lazy heap, ``tests/sim/_kv_pool_plain.py``,
        does the same one entry at a time). Those entries wait in one pending batch, and
        the reading stops at the batch's smallest entry until the batch is pushed as a
        run (when the reading gets there, else at the end): one run per call instead of
        one per window (the 10-minute slice read ~13k small runs to their end otherwise).
        Protected idle entries passed over are kept the same way."""
        heap, runs = self._heap, self._runs
        taken: list[np.ndarray] = []
        back_r: list[np.ndarray] = []  # entries going back in (lazy, or protected)
        back_k: list[np.ndarray] = []
        low: tuple[int, int] | None = None  # below every lazy entry going back in
        need = n
        window = max(2 * need, 512)
        while need:
            if low is not None and (not heap or low <= heap[0][:2]):
                self._push_back(back_r, back_k)  # the reading reached the pending batch
                low = None
            _, _, run_id = heapq.heappop(heap)
            run = runs[run_id]
            ranks, keys, cur = run.ranks, run.keys, run.cursor
            end = min(len(ranks), cur + window)
            window = min(2 * window, 1 << 16)  # stale entries: read more at a time
            bound = heap[0][:2] if heap else None
            if low is not None and (bound is None or low < bound):
                bound = low
            # No further than the next run's head (inclusive: a tie is one key); no search
            # when the window's last entry is at or below it (most windows end a run).
            if bound is not None and (int(ranks[end - 1]), int(keys[end - 1])) > bound:
                end = cur + _upto(ranks[cur:end], keys[cur:end], *bound)
            seg_r, seg_k = ranks[cur:end], keys[cur:end]
            signed = state[seg_k]
            true = np.abs(signed)  # an idle key's true rank; 0: not idle
            lazy = true > seg_r
            any_lazy = bool(lazy.any())
            # Read only below the smallest true rank among them; no search when it lies
            # above the whole window (the usual case: a raised rank is a recent one).
            # (Below the rank, not up to its entry: stopping short is always safe, the
            # rest is read after the batch goes in; the window's first entry lies below
            # every lazy entry's true rank, so the window never comes out empty.)
            if any_lazy and (low_rank := int(true[lazy].min())) <= int(seg_r[-1]):
                cut = int(np.searchsorted(seg_r, low_rank, "left"))
                seg_r, seg_k, signed, true, lazy = (
                    seg_r[:cut], seg_k[:cut], signed[:cut], true[:cut], lazy[:cut])
            picks = np.flatnonzero(signed == seg_r)  # live and not protected
            if len(picks) > need:
                picks = picks[:need]
                stop = int(picks[-1]) + 1
            else:
                stop = len(seg_k)
            behind = np.flatnonzero(lazy[:stop]) if any_lazy else ()
            if len(behind):
                r = true[behind]
                back_r.append(r)
                back_k.append(seg_k[behind])
                # The batch's bound: below its smallest rank (key -1 sorts before every
                # key), so no tie-break search; stopping short is safe, as above.
                smallest = (int(r.min()), -1)
                low = smallest if low is None or smallest < low else low
            if len(picks):
                got = seg_k[picks]
                state[got] = 0
                taken.append(got)
                need -= len(got)
            if np.count_nonzero(true[:stop] == seg_r[:stop]) > len(picks):
                guarded = np.flatnonzero(signed[:stop] < 0)  # protected and live: back in
                guarded = guarded[true[guarded] == seg_r[guarded]]  # at the same rank
                back_r.append(seg_r[guarded])
                back_k.append(seg_k[guarded])
            run.cursor = cur = cur + stop
            self.size -= stop
            if cur < len(ranks):
                heapq.heappush(heap, (int(ranks[cur]), int(keys[cur]), run_id))
            else:
                del runs[run_id]
        self._push_back(back_r, back_k)
        return taken

    def _push_back(self, ranks: list[np.ndarray], keys: list[np.ndarray]) -> None:
        """Push the entries going back in as one run (and empty the lists): a key met
        twice (its entries in two runs) goes in once, at its true rank. Both of its
        entries carry that rank (the state does not change within a take but for the
        taken keys, which are not put back), so they are equal ``(rank, key)`` pairs and
        one sort (``_sort_entries``) brings them side by side: one sort by rank, where a
        unique by key and a two-key sort of the run (``push``) were two sorts."""
        if not keys:
            return
        k = np.concatenate(keys) if len(keys) > 1 else keys[0]
        r = np.concatenate(ranks) if len(ranks) > 1 else ranks[0]
        ranks.clear()
        keys.clear()
        if len(k) > 1:
            r, k = _sort_entries(r, k)
        self._push_sorted(r, k)

    def entries(self) -> list[tuple[int, int]]:
        """Every unread entry as ``(rank, key)`` (tests: every idle key must have its live
        entry here)."""
        out: list[tuple[int, int]] = []
        for run in self._runs.values():
            out.extend(zip(run.ranks[run.cursor:].tolist(), run.keys[run.cursor:].tolist()))
        return out
