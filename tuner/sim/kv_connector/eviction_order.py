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

Each key's newest entry is named by ``owner`` (per key, the id of the run that holds it;
run ids are never reused). That makes staleness a property a run can have as a whole:
an agentic session's next turn re-ranks its whole prefix at its access and again at its
finish, so the run the previous access or finish pushed is, as a rule, wholly stale by the
time the eviction reaches its ranks, and a window of it is dropped on one gather of
``owner`` (on the hour's first 10 minutes ~70 % of the entries the eviction passes).
Before (branches ``tierrun`` to ``tier5``) a rank raise pushed nothing and the eviction
put each raised key back when it met its old entry: 45 % of the entries read were read
twice, and the put-back runs, spread over many ranks, cut the store runs' reads short.

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
    if len(ranks) > 1:  # one compare pass for the check (an access's run: reversed)
        if ranks[0] > ranks[-1]:
            if (ranks[1:] < ranks[:-1]).all():
                return ranks[::-1], keys[::-1]
        elif (ranks[1:] > ranks[:-1]).all():
            return ranks, keys
        return _sort_entries(ranks, keys)
    return ranks, keys


def _sort_entries(ranks: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ranks, keys)`` in (rank, key) order, equal pairs once. One sort by rank: ranks
    of distinct keys are distinct but in generated tests, and a key met twice in one take
    comes back twice with the same rank; only a tie between two keys takes the two-key
    sort (``lexsort``, several times slower than ``argsort`` on the ~6k-entry batches a
    take puts back on the hour's first 10 minutes). The sort is numpy's stable one
    (timsort for int64), which finds the sorted or reversed stretches these batches
    are made of (a completion batch is a few store jobs' runs, each in reverse rank
    order) and merges them: ~12x faster than the default sort on such a 3k-entry batch.
    Stability changes nothing: ranks are distinct but for equal pairs and the ties
    the ``lexsort`` settles."""
    order = np.argsort(ranks, kind="stable")
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

    def __init__(self, owner: np.ndarray | None = None) -> None:
        self._runs: dict[int, _Run] = {}
        self._heap: list[tuple[int, int, int]] = []  # (head rank, head key, run id)
        self._next_id = 0  # never reused, so an owner left on a dropped run matches none
        self.size = 0  # entries not yet read (live or stale)
        #: per key, the id of the run holding its newest entry (the pool's array, rebound
        #: by the pool whenever it grows or renumbers it); see the module doc
        self.owner = np.full(0, -1, _I64) if owner is None else owner

    def push(self, ranks: np.ndarray, keys: np.ndarray) -> None:
        """Add entries (distinct keys); any order."""
        if not len(keys):
            return
        self.push_sorted(*_sorted_run(np.asarray(ranks, _I64), np.asarray(keys, _I64)))

    def push_sorted(self, ranks: np.ndarray, keys: np.ndarray) -> None:
        """Add a run already in ``(rank, key)`` order (int64, distinct keys): a finish's
        fresh ranks come that way, so it needs no sort check."""
        run_id = self._next_id
        self._next_id += 1
        self._runs[run_id] = _Run(ranks, keys)
        self.owner[keys] = run_id  # the keys' older entries, in other runs, go stale
        heapq.heappush(self._heap, (int(ranks[0]), int(keys[0]), run_id))
        self.size += len(keys)

    def reset(self, ranks: np.ndarray, keys: np.ndarray) -> None:
        """Drop every run and start again from the given (live) entries: what a pool does
        when stale entries dominate, or after its keys are renumbered."""
        self._runs.clear()
        self._heap.clear()
        self.size = 0
        self.push(ranks, keys)

    def take(self, n: int, state: np.ndarray, below: int | None = None) -> list[np.ndarray]:
        """The ``n`` idle, unprotected keys of smallest ``(rank, key)``, in order, as key
        arrays; with ``below``, only entries whose word is below it, so possibly fewer
        (see ``below`` at the end). ``state``: per key, the value its live entry holds
        while it is idle (stored, store complete, ref count 0), minus that value while it is also
        protected, and a value equal to neither otherwise (0, a busy key's even word); the
        pool's ``_state`` words, ``2 * rank + 1`` for an idle key, which order as the
        ranks do and are >= 1, and are even for a stored busy key. The caller guarantees
        that ``n`` such keys exist (below ``below`` too, if given, or it counts what it
        gets) and that every idle key's newest entry (the one in
        the run ``owner`` names) is at its rank. The taken keys' state is set to 0 as
        they are taken; the caller does the rest of the eviction once on all of them.

        A run is read in windows. A window with no entry of the run's own (every key has
        a newer entry elsewhere) is dropped on one gather, past the next run's head:
        nothing in it is live. Else the window stops at the next run's head, and its
        live entries (the key's state equals the entry's rank: see the comment on stale
        entries below) are taken in order. Protected live entries passed over go back in, at the same
        rank, as one run at the end of the call (they stay protected until then).

        ``below``: the caller protects nothing (no state is negative) and the protected
        keys' words are all at or above ``below``, so entries below it need no
        protection test; the read stops at the first entry at or above it, unread. The
        pool's usual store evicts far older keys than the ones it offers (those were
        raised to the storing request's rank by its access just before), and then needs
        neither the protection's two scatters over the offered run nor this pass."""
        heap, runs, owner = self._heap, self._runs, self.owner
        taken: list[np.ndarray] = []
        back_r: list[np.ndarray] = []  # protected live entries passed over
        back_k: list[np.ndarray] = []
        need = n
        window = max(2 * need, 512)
        while need:
            if below is not None and (not heap or heap[0][0] >= below):
                break  # every unread entry is at or above the bound
            _, _, run_id = heapq.heappop(heap)
            run = runs[run_id]
            ranks, keys, cur = run.ranks, run.keys, run.cursor
            end = min(len(ranks), cur + window)
            window = min(2 * window, 1 << 16)  # stale entries: read more at a time
            mine = owner[keys[cur:end]] == run_id
            if not mine.any():  # e.g. a finish run superseded by the session's next turn
                self._advance(run, run_id, end)  # (nothing live: the bound does not matter)
                continue
            # No further than the next run's head (inclusive: a tie is one key); no search
            # when the window's last entry is at or below it (most windows end a run).
            if heap and (int(ranks[end - 1]), int(keys[end - 1])) > heap[0][:2]:
                end = cur + _upto(ranks[cur:end], keys[cur:end], *heap[0][:2])
            if below is not None and ranks[end - 1] >= below:  # and below the bound
                end = cur + int(np.searchsorted(ranks[cur:end], below, "left"))
                if end == cur:
                    self._advance(run, run_id, cur)
                    break
            seg_r, seg_k = ranks[cur:end], keys[cur:end]
            # Live: the key's state equals the entry's rank. A stale entry can read so only
            # where the key was pushed again at an unchanged rank (a load's end, a
            # protected entry put back): the same (rank, key), so taking either is the
            # same decision, and the other then reads 0 (taken) or goes back in twice
            # (equal pairs, merged by the sort). So no owner mask here.
            signed = state[seg_k]
            picks = np.flatnonzero(signed == seg_r)  # live and not protected
            if len(picks) > need:
                picks = picks[:need]
                stop = int(picks[-1]) + 1
            else:
                stop = len(seg_k)
            if len(picks):
                got = seg_k[picks]
                state[got] = 0
                taken.append(got)
                need -= len(got)
            if below is None:  # (under a bound nothing read is protected)
                guarded = np.flatnonzero(signed[:stop] == -seg_r[:stop])  # protected, live
                if len(guarded):
                    back_r.append(seg_r[guarded])
                    back_k.append(seg_k[guarded])
            self._advance(run, run_id, cur + stop)
        self._push_back(back_r, back_k)
        return taken

    def _advance(self, run: _Run, run_id: int, cursor: int) -> None:
        """Mark a popped run read up to ``cursor``; back in the heap by its new head, or
        gone when read to its end."""
        self.size -= cursor - run.cursor
        run.cursor = cursor
        if cursor < len(run.keys):
            heapq.heappush(self._heap, (int(run.ranks[cursor]), int(run.keys[cursor]), run_id))
        else:
            del self._runs[run_id]

    def _push_back(self, ranks: list[np.ndarray], keys: list[np.ndarray]) -> None:
        """Push the protected entries passed over as one run (and empty the lists); they
        come from several runs, so one sort (``_sort_entries``) puts them in order."""
        if not keys:
            return
        k = np.concatenate(keys) if len(keys) > 1 else keys[0]
        r = np.concatenate(ranks) if len(ranks) > 1 else ranks[0]
        ranks.clear()
        keys.clear()
        if len(k) > 1:
            r, k = _sort_entries(r, k)
        self.push_sorted(r, k)

    def entries(self) -> list[tuple[int, int]]:
        """Every unread entry that is its key's newest (its run is the key's owner) as
        ``(rank, key)`` (tests: every idle key must have one, at its rank)."""
        out: list[tuple[int, int]] = []
        for run_id, run in self._runs.items():
            keys = run.keys[run.cursor:]
            mine = self.owner[keys] == run_id
            out.extend(zip(run.ranks[run.cursor:][mine].tolist(), keys[mine].tolist()))
        return out
