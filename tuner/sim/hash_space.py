"""The twin's hash-id space over a long replay: reserve ids as a trace is read, renumber
the live ones when dead ones dominate.

Why: the prefix cache indexes arrays by hash id (``tuner.sim.block_pool``: first holder,
last holder, watch bits: 14 bytes an id). Interned once per trace, the id space
grows with every distinct hash the trace ever has: a production day of fresh prompts at
16-token blocks is ~100 million ids, a gigabyte of arrays for hashes nobody will look up
again. A replay that interns as it reads (``tuner.replay._stream``) takes id ranges from
here, and from time to time renumbers: every id still referenced (by a cached block, a
waiting or running request, or the reader itself) keeps its place in order and gets its
rank; the rest are forgotten (a forgotten hash that shows up again gets fresh ids, and
since no block carries the old ones, no hit is lost).

The renumbering is *monotone* (it keeps the order of ids) and keeps every reserved range
contiguous (a request's synthetic ids, a source block's split ids), so every comparison
and offset the twin makes between ids gives the same answer before and after: decisions
do not change (tests/replay/test_golden_replays.py replays with frequent renumbering).
It runs between steps, with no step in flight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tuner.sim.request import SimRequest
    from tuner.sim.scheduler import Scheduler

__all__ = ["FleetIdSpace", "HashIdSpace"]

_ID = np.int64


class HashIdSpace:
    """Reserve, mark and renumber the hash ids of ``scheduler``'s prefix cache."""

    def __init__(self, scheduler: "Scheduler") -> None:
        self.scheduler = scheduler
        self.manager = scheduler.kv_cache_manager
        self.pool = self.manager.block_pool

    @property
    def size(self) -> int:
        """Ids in use or reserved: ``0 .. size - 1``."""
        return self.pool.num_hash_ids

    def bound_capacity(self, ids: int) -> None:
        """The per-id arrays grow no larger than ``ids`` unless the space itself does
        (``BlockPool.id_capacity_bound``): the reader renumbers before that."""
        self.pool.id_capacity_bound = ids

    def reserve(self, count: int) -> int:
        """``count`` fresh trace ids; the first. Requests' hashes below ``size`` pass
        the manager's check at adoption."""
        base = self.pool.reserve_ids(count)
        self.manager.num_trace_hash_ids = self.pool.num_hash_ids
        return base

    def _live_requests(self) -> list["SimRequest"]:
        scheduler = self.scheduler
        return (list(scheduler.running) + list(scheduler.waiting)
                + list(scheduler.kv_holding))

    def live_mask(self) -> np.ndarray:
        """A mask over ``0 .. size - 1`` of the ids the twin still references: hashes of
        cached blocks, and every id a waiting or running request has or can reach (its
        laid-out ids, its trace output ids and its whole synthetic range)."""
        mask = np.zeros(self.size, dtype=bool)
        hashes = self.pool.block_hash
        mask[hashes[hashes >= 0]] = True
        for request in self._live_requests():
            request.mark_hash_ids(mask)
        if self.scheduler.connector is not None:  # the CPU tier's keys (kv_connector)
            mask[self.scheduler.connector.live_hash_ids()] = True
        return mask

    def renumber(self, live: np.ndarray) -> None:
        """Give the sorted ids ``live`` the new ids ``0 .. len(live) - 1`` everywhere the
        twin holds them. ``live`` must cover :meth:`live_mask` (and whole reserved ranges)."""
        pool = self.pool
        live = np.asarray(live, dtype=_ID)
        hashes = pool.block_hash
        cached = hashes >= 0
        old = hashes[cached]
        new = np.searchsorted(live, old)
        assert len(old) == 0 or (new < len(live)).all() and (live[new] == old).all(), (
            "renumbering drops a cached block's hash (tuner bug)")
        hashes[cached] = new
        pool.first_holder = _kept(pool.first_holder, live, -1, pool.id_capacity_bound)
        pool.last_holder = _kept(pool.last_holder, live, -1,  # holder links are per block
                                 pool.id_capacity_bound)
        pool.watch_bits = _kept(pool.watch_bits, live, 0, pool.id_capacity_bound)
        pool.num_hash_ids = len(live)
        self.manager.num_trace_hash_ids = len(live)
        for request in self._live_requests():
            request.renumber_hash_ids(live)
        if self.scheduler.connector is not None:
            self.scheduler.connector.renumber(live)


def _kept(values: np.ndarray, live: np.ndarray, fill: object, bound: int) -> np.ndarray:
    """``values`` at the sorted ids ``live`` moved to ``0 .. len(live) - 1``, ``fill``
    past them: in ``values``' own buffer unless it is larger than ``bound`` (the arrays'
    capacity after this renumbering; 0: none), then in a new array of the live ids.

    Why in place: a renumbering that gave each per-id array a fresh buffer of the live
    ids (~0.5 M) made the pool grow it back by doubling to the threshold (~2.4 M) over
    the next cycle: three copies and fresh pages an array and a cycle, every engine of a
    fleet's pools once more, and the large buffers freed and taken again fragmented the
    heap of a day-long replay (docs/performance.md and docs/disaggregation.md, round
    "pdmem"). The buffer is the capacity the pool reached, and will reach again before
    the next renumbering. ``live`` is increasing with ``live[i] >= i``, and the gather
    ``values[live]`` is a copy, so writing it over the front is safe."""
    n = len(live)
    if n <= len(values) and (not bound or len(values) <= bound):
        values[:n] = values[live]
        values[n:] = fill
        return values
    out = np.empty(max(n, 16), dtype=values.dtype)
    out[:n] = values[live]
    out[n:] = fill
    return out


class FleetIdSpace:
    """:class:`HashIdSpace` over a fleet's engines: one trace-id space for all of them.

    Why: a streamed trace interns a request's hashes before it is routed, so its ids must
    mean the same on every engine. Each engine's pool also reserves synthetic ids of its
    own (a request's unshared blocks, only that engine ever sees them), so the pools'
    sizes drift apart; a trace range is reserved from the largest size on in every pool
    (the smaller pools skip the gap), and a renumbering keeps the union of what any
    engine references, plus the requests routed but not yet delivered to their engine
    (``in_transit``: the fleet loop's input queues), whose ids it rewrites in place.
    The same ids name the same hashes everywhere, and each engine's renumbering is
    monotone as a single engine's is, so decisions do not change.
    """

    def __init__(self, spaces: list[HashIdSpace]) -> None:
        self.spaces = spaces
        self.in_transit: Any = lambda: ()  # -> the sources routed but not yet delivered

    @property
    def size(self) -> int:
        return max(space.size for space in self.spaces)

    def bound_capacity(self, ids: int) -> None:
        for space in self.spaces:
            space.bound_capacity(ids)

    def reserve(self, count: int) -> int:
        base = self.size
        for space in self.spaces:
            space.reserve(base + count - space.size)
        return base

    def live_mask(self) -> np.ndarray:
        self.reserve(0)  # every pool as large as the largest: one mask fits all
        mask = np.zeros(self.size, dtype=bool)
        for space in self.spaces:
            mask |= space.live_mask()
        for source in self.in_transit():
            for ids in (source.block_hashes, source.output_block_hashes):
                mask[np.asarray(ids, dtype=_ID)] = True
        return mask

    def renumber(self, live: np.ndarray) -> None:
        live = np.asarray(live, dtype=_ID)
        for space in self.spaces:
            space.renumber(live)
        for source in self.in_transit():
            source.block_hashes = np.searchsorted(live, np.asarray(source.block_hashes, _ID))
            source.output_block_hashes = np.searchsorted(
                live, np.asarray(source.output_block_hashes, _ID))
