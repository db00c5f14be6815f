"""The CPU pool with vLLM 0.33.0's LRU policy, as arrays over the dense hash-id space.

Mirrors ``vllm/v1/kv_offload/cpu/manager.py`` (``CPUOffloadingManager`` with
``store_threshold=1`` and no KV events) with ``cpu/policies/lru.py`` (``LRUCachePolicy``)
for one KV-cache group; the ARC pool stays in ``cpu_manager`` / ``policies``.

Why arrays: keys are dense hash ids (``tuner.sim.hash_space``), so a key's pool state is a
slot in a few numpy arrays (chunk id, ref count, state word), and what vLLM does key by key over
an offered run (~2,450 chunks a prompt in the agentic hour, most of them already stored)
is a handful of fancy-indexing operations here. Eviction reads an
:class:`~tuner.sim.kv_connector.eviction_order.EvictionOrder` of sorted runs instead of a
heap of keys (a full pool evicts about one chunk per chunk stored).

LRU ranks (lru.py): a request's keys share one request rank ``R`` taken at its first
access and order by ``-position`` (tails before heads); an access raises a stored key's
rank to the request's (``max``: ranks only grow); when a request finishes, its stored keys
take fresh ranks tail first, so its head is the most recent; the smallest idle (ref count
0), unprotected rank goes first. vLLM's rank is the pair ``(R, -position)``; here it is the
int ``R * RANK_SPAN - position`` (same order while positions stay below ``RANK_SPAN``;
int64 while ranks stay below 2**36, asserted).

Per-key state in one word (``_state``): ``2 * rank + idle`` for a key in the pool (idle:
stored, store complete, no load reading it), 0 for a key not in it, negated while
``_evict`` protects an idle key. The access record, a finish and a completion read and
write a key's rank, its idleness and its pool membership in one gather and one scatter
(three arrays before: rank, signed idle rank, chunk id), and the eviction order's entries
are the words of idle keys (``2 * rank + 1``, the same order as the ranks).

Contract: every answer and every state equals the key-at-a-time port's
(``tests/sim/_kv_pool_plain.py``), held by ``tests/sim/test_kv_pool_batched.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tuner.sim.kv_connector.eviction_order import EvictionOrder
from tuner.sim.kv_connector.policies import ReqContext

__all__ = ["LRUPool", "RANK_SPAN"]

MISS, HIT, HIT_PENDING = 0, 1, 2

#: LRU ranks are ``rank * RANK_SPAN - position``: vLLM's ``(rank, -position)`` as one int64
RANK_SPAN = 1 << 26
#: ranks stay below 2**62, so a state word ``2 * rank + 1`` stays below 2**63
_MAX_RANK = (1 << 62) // RANK_SPAN
_I64 = np.int64
_EMPTY = np.empty(0, _I64)
#: above every state word (``_evict``'s floor over no words)
_NO_FLOOR = np.iinfo(_I64).max


@dataclass(slots=True)
class _Access:
    """The keys one request observed, first seen first, with their positions (-1: none)
    (manager.py ``_RequestCacheAccess``; an LRU pool needs no inserted/reused sets).

    Which keys it has seen is read from ``keys`` itself, sorted once per record that
    follows another (``seen``): most requests record one run (their prompt's chunks),
    and a Python set of ~2,500 keys per request cost more than the rest of the record."""

    keys: list[np.ndarray] = field(default_factory=list)
    positions: list[np.ndarray] = field(default_factory=list)
    finished: bool = False
    _seen: np.ndarray | None = None  # ``keys`` sorted, while no run was added since

    def seen(self) -> np.ndarray:
        """Every key recorded so far, sorted."""
        if self._seen is None:
            self._seen = np.sort(np.concatenate(self.keys)) if len(self.keys) > 1 \
                else np.sort(self.keys[0])
        return self._seen

    def add(self, keys: np.ndarray, positions: np.ndarray) -> None:
        self.keys.append(keys)
        self.positions.append(positions)
        self._seen = None

    def renumber(self, live: np.ndarray) -> None:
        """Hash ids renumbered (monotone): the new id of ``k`` is its index in ``live``."""
        self.keys = [np.searchsorted(live, k) for k in self.keys]
        self._seen = None


class LRUPool:
    """The CPU chunk pool under LRU; see the module doc. ``num_chunks`` from
    ``cpu_bytes_to_use``. Keys may be passed as lists or int64 arrays; ``positions`` (the
    tokens up to each key's chunk end, as in ``ReqContext.positions``) may be passed beside
    them by a caller that has them as an array, else they are read from ``ctx.positions``."""

    name = "lru"
    #: the pool reads positions from the ``positions`` arguments when given, so a caller
    #: that always gives them need not keep ``ReqContext.positions`` (ARC's pool does read it)
    needs_position_map = False

    def __init__(self, num_chunks: int) -> None:
        self.num_chunks = num_chunks
        self._num_allocated = 0
        # evicted chunk ids, a stack; it never holds more than the chunks allocated so
        # far, so it grows with them rather than being sized by the (possibly huge) pool
        self._free = np.empty(min(max(num_chunks, 1), 1024), _I64)
        self._num_free_ids = 0
        self.num_evictable = 0  # ready chunks with ref_cnt 0
        self.num_write_pending = 0
        self.num_evicted = 0  # chunks evicted so far (counter)
        self._next_rank = 0
        size = 1024
        self._chunk = np.full(size, -1, _I64)  # key -> chunk id, -1: not in the pool
        # -1: store in flight, n: n loads reading (the in-pool invariant: -1 only in the pool)
        self._ref = np.zeros(size, np.int32)
        # The state word (module doc): 2 * rank + idle in the pool, 0 outside, negated
        # while ``_evict`` protects it (an idle key of the store that evicts). Ranks are
        # >= 1, so zero and the sign are free; the eviction order reads it as its live
        # test (a window's one gather), the pool's calls as rank, idleness and membership.
        self._state = np.zeros(size, _I64)
        self._slot = np.zeros(size, _I64)  # scratch: repeated keys in a run
        # the run of the eviction order that holds each key's newest entry (-1: none)
        self._owner = np.full(size, -1, _I64)
        self._order = EvictionOrder(self._owner)
        self._index = np.arange(4096, dtype=_I64)

    # ----------------------------------------------------------------- arrays
    def _fit(self, keys: np.ndarray) -> None:
        """Grow the per-key arrays (geometrically) to hold ``keys``; ids appear as the
        replay interns new hashes."""
        if not len(keys):
            return
        top = int(keys.max())
        size = len(self._chunk)
        if top < size:
            return
        assert int(keys.min()) >= 0, "negative offload key (tuner bug)"
        new = max(2 * size, top + 1)
        self._chunk = np.concatenate([self._chunk, np.full(new - size, -1, _I64)])
        self._ref = np.concatenate([self._ref, np.zeros(new - size, np.int32)])
        self._state = np.concatenate([self._state, np.zeros(new - size, _I64)])
        self._slot = np.concatenate([self._slot, np.zeros(new - size, _I64)])
        self._owner = np.concatenate([self._owner, np.full(new - size, -1, _I64)])
        self._order.owner = self._owner

    def _repeats(self, keys: np.ndarray) -> bool:
        """Whether a key occurs twice in ``keys`` (a write per key to a scratch slot: any
        repeated key then reads back another index than its own at one occurrence)."""
        n = len(keys)
        if n < 2:
            return False
        if n > len(self._index):
            self._index = np.arange(2 * n, dtype=_I64)
        index = self._index[:n]
        self._slot[keys] = index
        return not (self._slot[keys] == index).all()

    def _make_idle(self, keys: np.ndarray) -> None:
        """Keys (distinct, stored, not idle) that just became idle: their idle bit set and
        an order entry at their word (a rank that changes later while they stay idle
        pushes again: ``_rerank_idle``); one gather and one scatter of the state."""
        words = self._state[keys] + 1
        self._state[keys] = words
        self._order.push(words, keys)
        self._check_stale()

    def _check_stale(self) -> None:
        """Stale entries dominate the order: rebuild it from the idle keys."""
        if self._order.size > 8 * self.num_evictable + 65536:
            self._compact()

    def _compact(self) -> None:
        """Stale entries dominate: rebuild the order from the idle keys' ranks."""
        keys = np.flatnonzero(self._state & 1)  # idle (never called while protecting)
        self._order.reset(self._state[keys], keys)

    @staticmethod
    def _positions(keys: np.ndarray, ctx: ReqContext) -> np.ndarray:
        get = ctx.positions.get
        return np.fromiter((get(k, -1) for k in keys.tolist()), _I64, len(keys))

    # ----------------------------------------------------------------- ranks
    def _request_rank(self, ctx: ReqContext) -> int:
        if ctx.lru_owner is not self:
            self._next_rank += 1
            ctx.lru_rank = self._next_rank
            ctx.lru_owner = self
        return ctx.lru_rank

    def _on_access(self, keys: np.ndarray, positions: np.ndarray, ctx: ReqContext,
                   words: np.ndarray | None = None) -> None:
        """lru.py ``on_request_access``: stored, positioned keys rise to the request's rank.
        One gather of the state gives membership (non-zero), the old rank and idleness
        (``words``: the keys' state words, if the caller has them)."""
        if words is None:
            words = self._state[keys]
        new = (self._request_rank(ctx) * RANK_SPAN - positions) * 2
        # a stored key's word 2 * old + idle is below 2 * new iff old < new; an absent
        # key (word 0) is below too, so membership and position are tested apart
        up = (words < new) & (words != 0) & (positions >= 0)
        if not up.all():
            keys, words, new = keys[up], words[up], new[up]
        if len(keys):
            self._rerank(keys, words, new)

    def _rerank(self, keys: np.ndarray, words: np.ndarray, new: np.ndarray,
                in_order: bool = False) -> None:
        """New ranks for stored keys (distinct; ``words``: their state words, ``new``:
        twice their new ranks): one scatter of the state; the idle ones' new entries go
        into the order now, as one run (``in_order``: already in ``(rank, key)`` order, as
        a finish's fresh ranks are). Their older entries go stale: a request's access, and
        then its finish, re-rank its whole prefix, so the run an access or finish pushes
        is superseded as a whole by the next one of the session and dropped by the
        eviction on one gather, where a lazy raise left each key's old entry to be read,
        put back and read again."""
        idle = words & 1
        new |= idle
        self._state[keys] = new
        idle = idle.astype(bool)
        if not idle.all():
            keys, new = keys[idle], new[idle]
        if len(keys):
            if in_order:
                self._order.push_sorted(new, keys)
            else:
                self._order.push(new, keys)
            self._check_stale()

    @staticmethod
    def _access(ctx: ReqContext) -> _Access:
        state = ctx.access
        if state is None:
            state = ctx.access = _Access()
        return state  # type: ignore[return-value]

    def _record(self, keys: np.ndarray, positions: np.ndarray, ctx: ReqContext,
                repeats: bool | None = None, words: np.ndarray | None = None) -> None:
        """The access record: keys the request sees for the first time (first occurrence
        of a repeated one) are kept for its finish and raise their ranks. ``repeats``
        (whether a key occurs twice in ``keys``) and ``words`` (the keys' state words) may
        be passed by a caller that has them (``prepare_store`` reads both for its own
        purposes; a subset of a run without repeats has none), saving a scatter and two
        gathers over the run per store."""
        state = self._access(ctx)
        if not len(keys):
            return
        unseen: np.ndarray | None = None  # None: every key unseen (a first record)
        if state.keys:
            seen = state.seen()
            at = np.searchsorted(seen, keys)
            at[at == len(seen)] = 0
            unseen = seen[at] != keys
        if repeats is None:
            repeats = self._repeats(keys)
        if repeats:  # first occurrences only, one by one
            firsts = dict.fromkeys((keys if unseen is None else keys[unseen]).tolist())
            picks = [i for i, k in enumerate(keys.tolist()) if firsts.pop(k, 0) is None]
            keys, positions = keys[picks], positions[picks]
            words = None if words is None else words[picks]
        elif unseen is not None and not unseen.all():
            keys, positions = keys[unseen], positions[unseen]
            words = None if words is None else words[unseen]
        if not len(keys):
            return
        assert not state.finished, "new cache keys after request finalization (tuner bug)"
        state.add(keys, positions)
        self._on_access(keys, positions, ctx, words)

    # ----------------------------------------------------------------- interface
    def on_new_request(self, ctx: ReqContext) -> None:
        self._access(ctx)

    def lookup(self, key: int) -> int:
        if key >= len(self._chunk) or self._chunk[key] < 0:
            return MISS
        return HIT if self._ref[key] >= 0 else HIT_PENDING

    def lookup_run(self, keys: np.ndarray) -> tuple[int, bool]:
        """(how many of ``keys`` from the first are stored, whether any of those is still
        being stored): the connector's consecutive-hit lookup in one pass."""
        keys = np.asarray(keys, _I64)
        self._fit(keys)
        stored = self._chunk[keys] >= 0
        hits = len(keys) if stored.all() else int(np.argmin(stored))
        return hits, bool(hits and (self._ref[keys[:hits]] < 0).any())

    def prepare_load(self, keys, ctx: ReqContext, positions: np.ndarray | None = None) -> None:
        k = np.asarray(keys, _I64)
        if not len(k):
            self._record(k, _EMPTY, ctx)
            return
        self._fit(k)
        ref = self._ref[k]
        assert (self._state[k] != 0).all() and (ref >= 0).all(), "chunk not loadable (tuner bug)"
        idle = k[ref == 0]
        if len(idle):
            if len(idle) > 1:
                idle = np.unique(idle)
            self.num_evictable -= len(idle)
            self._state[idle] -= 1  # no longer idle (distinct keys: no lost update)
        np.add.at(self._ref, k, 1)
        self._record(k, self._positions(k, ctx) if positions is None else positions, ctx)

    def complete_load(self, keys) -> None:
        k = np.asarray(keys, _I64)
        if not len(k):
            return
        np.subtract.at(self._ref, k, 1)
        ref = self._ref[k]
        assert (ref >= 0).all() and (self._state[k] != 0).all(), "chunk not loading (tuner bug)"
        idle = k[ref == 0]
        if len(idle) > 1:
            idle = np.unique(idle)
        self.num_evictable += len(idle)
        self._make_idle(idle)

    def _num_free(self) -> int:
        return self._num_free_ids + self.num_chunks - self._num_allocated

    def _allocate(self, n: int) -> np.ndarray:
        """Chunk ids: never-used ones first, then evicted ones from the free list's end."""
        fresh = min(n, self.num_chunks - self._num_allocated)
        ids = np.arange(self._num_allocated, self._num_allocated + fresh, dtype=_I64)
        self._num_allocated += fresh
        if n > fresh:
            top = self._num_free_ids
            reuse = self._free[top - (n - fresh):top][::-1]
            self._num_free_ids = top - (n - fresh)
            ids = np.concatenate([ids, reuse])
        return ids

    def _evict(self, n: int, offered: np.ndarray, words: np.ndarray) -> np.ndarray | None:
        """The ``n`` idle keys of smallest rank not among ``offered`` (the run being
        stored), evicted; None (and no change) if there are fewer. ``words``: the
        offered keys' state words as they were before the run's access record, which
        only raises ranks and leaves idleness alone: they say which offered keys are idle (protected) and give a floor under
        those keys' words now, below which the eviction order needs no protection test.
        Only when the eviction reaches that floor (the storing request's own keys are
        among the oldest: 62 of 3,192 evicting stores on the hour's first 10 minutes) are
        the protected keys' words read and negated, a gather and two scatters over them
        that every evicting store paid before."""
        state = self._state
        idle = (words & 1).astype(bool)  # absent keys (0) and busy ones (even) are not
        num_idle = int(np.count_nonzero(idle))
        if self.num_evictable - num_idle < n:  # exact count when keys repeat
            if self.num_evictable - len(np.unique(offered[idle])) < n:
                return None
        if not num_idle:
            victims = self._order.take(n, state)
        else:  # the order zeroes the victims' state as it takes them
            floor = int(np.min(words, initial=_NO_FLOOR, where=idle))
            victims = self._order.take(n, state, below=floor)
            left = n - sum(map(len, victims))
            if left:  # the floor reached: protect the offered idle keys for the rest
                idle_offered = offered[idle]
                now = state[idle_offered]
                state[idle_offered] = -now
                try:
                    victims += self._order.take(left, state)
                finally:
                    state[idle_offered] = now
        victims = np.concatenate(victims) if len(victims) > 1 else victims[0]
        chunk = self._chunk
        ids = chunk[victims]  # freed in eviction order (the free list's order)
        chunk[victims] = -1
        top = self._num_free_ids
        if top + len(ids) > len(self._free):
            grown = np.empty(max(2 * len(self._free), top + len(ids)), _I64)
            grown[:top] = self._free[:top]
            self._free = grown
        self._free[top:top + len(ids)] = ids
        self._num_free_ids = top + len(ids)
        self.num_evictable -= n
        self.num_evicted += n
        return victims

    def prepare_store(self, keys, ctx: ReqContext, positions: np.ndarray | None = None
                      ) -> tuple[np.ndarray, int] | None:
        """(keys to store, chunks evicted for them), or None: not enough idle chunks.
        Whether the run repeats a key and which keys are stored are read once here and
        handed to the access record and the insertion (each read them again before)."""
        k = np.asarray(keys, _I64)
        self._fit(k)
        if positions is None:
            positions = self._positions(k, ctx)
        words = self._state[k]  # read before the record re-ranks: what it and we need
        present = words != 0
        repeats = self._repeats(k)  # a subset of a run without repeats has none
        # In-flight keys (ref count -1) are not recorded. They are busy (an even word in
        # the pool), so the ref counts are read at the busy keys only, if any.
        busy = np.flatnonzero(present & ((words & 1) == 0)) if self.num_write_pending \
            else _EMPTY
        inflight = busy[self._ref[k[busy]] < 0] if len(busy) else _EMPTY
        if len(inflight):
            recorded = np.ones(len(k), bool)
            recorded[inflight] = False
            self._record(k[recorded], positions[recorded], ctx, repeats, words[recorded])
        else:
            self._record(k, positions, ctx, repeats, words)
        if present.all():
            return _EMPTY, 0
        absent = ~present
        to_store = k[absent]
        num_evict = len(to_store) - self._num_free()
        num_evicted = 0
        if num_evict > 0:
            if num_evict > self.num_evictable or self._evict(num_evict, k, words) is None:
                return None
            num_evicted = num_evict
        self._insert(to_store, positions[absent], ctx, repeats)
        self.num_write_pending += len(to_store)
        return to_store, num_evicted

    def _insert(self, keys: np.ndarray, positions: np.ndarray, ctx: ReqContext,
                repeats: bool) -> None:
        """New chunks for ``keys`` (in flight, so not idle: no order entry yet);
        ``repeats``: whether the offered run (of which ``keys`` is a part) repeats a key."""
        ids = self._allocate(len(keys))
        if not (repeats and self._repeats(keys)) and (positions >= 0).all():
            self._chunk[keys] = ids
            self._ref[keys] = -1
            ranks = self._request_rank(ctx) * RANK_SPAN - positions
        else:  # an unpositioned key takes a global rank in between; a repeated key's
            ranks = np.empty(len(keys), _I64)  # last chunk wins: one by one, as vLLM
            for i, (key, position) in enumerate(zip(keys.tolist(), positions.tolist())):
                self._chunk[key] = ids[i]
                self._ref[key] = -1
                if position < 0:
                    self._next_rank += 1
                    ranks[i] = self._next_rank * RANK_SPAN
                else:
                    ranks[i] = self._request_rank(ctx) * RANK_SPAN - position
        assert self._next_rank < _MAX_RANK, "LRU rank past int64 (tuner bug)"
        self._state[keys] = ranks * 2  # in flight: not idle

    def complete_store(self, keys) -> None:
        """Stores finished: in-flight chunks become readable and idle."""
        k = np.asarray(keys, _I64)
        if not len(k):
            return
        done = k[self._ref[k] < 0]  # -1 only in the pool (``_ref``), so no chunk gather
        if self._repeats(done):  # a job may name a key twice
            done = np.unique(done)
        self._ref[done] = 0
        self.num_write_pending -= len(done)
        self.num_evictable += len(done)
        self._make_idle(done)

    def on_request_finished(self, ctx: ReqContext) -> None:
        """lru.py ``on_request_finished``: the request's stored keys take fresh ranks,
        tail first (head to tail by position when every key has one, else first-seen)."""
        state = ctx.access
        if not isinstance(state, _Access) or state.finished:
            return
        state.finished = True
        if not state.keys:
            return
        keys = np.concatenate(state.keys) if len(state.keys) > 1 else state.keys[0]
        positions = np.concatenate(state.positions) if len(state.positions) > 1 \
            else state.positions[0]
        # Head to tail: the connector's runs come in position order already (an arange
        # per run, runs in chunk order), and then the stable sort is the identity.
        if (positions >= 0).all() and not (positions[1:] >= positions[:-1]).all():
            keys = keys[np.argsort(positions, kind="stable")]
        keys = keys[::-1]
        words = self._state[keys]  # membership, rank and idleness in one gather
        stored = words != 0
        if not stored.all():
            keys, words = keys[stored], words[stored]
        if not len(keys):
            return
        rank = self._next_rank
        ranks = np.arange(rank + 1, rank + 1 + len(keys), dtype=_I64) * (2 * RANK_SPAN)
        self._next_rank = rank + len(keys)
        assert self._next_rank < _MAX_RANK, "LRU rank past int64 (tuner bug)"
        self._rerank(keys, words, ranks, in_order=True)

    @property
    def num_used_chunks(self) -> int:
        return self._num_allocated - self._num_free_ids

    # ----------------------------------------------------------------- hash ids
    def pool_keys(self) -> np.ndarray:
        """The keys in the pool (a renumbering of the id space must keep them)."""
        return np.flatnonzero(self._chunk >= 0)

    def renumber(self, live: np.ndarray) -> None:
        """Hash id ``live[i]`` becomes ``i`` (monotone, ``tuner.sim.hash_space``); every
        pool key is in ``live``."""
        live = np.asarray(live, _I64)
        inside = live[live < len(self._chunk)]
        size = max(1024, len(live))

        def keep(values: np.ndarray, fill: object) -> np.ndarray:
            out = np.full(size, fill, dtype=values.dtype)
            out[:len(inside)] = values[inside]
            return out

        stored = int((self._chunk >= 0).sum())
        self._chunk = keep(self._chunk, -1)
        assert int((self._chunk >= 0).sum()) == stored, "renumbering drops a pool key (tuner bug)"
        self._ref = keep(self._ref, 0)
        self._state = keep(self._state, 0)
        self._slot = np.zeros(size, _I64)
        # old run ids are dropped by the compaction below; ids are never reused
        self._owner = keep(self._owner, -1)
        self._order.owner = self._owner
        self._compact()
