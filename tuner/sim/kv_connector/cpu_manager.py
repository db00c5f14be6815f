"""``CPUOffloadingManager``: the host-memory chunk pool of vLLM 0.33.0's native offloading,
with the ARC policy; :func:`make_pool` picks it or the LRU pool (``lru_pool``).

Mirrors ``vllm/v1/kv_offload/cpu/manager.py`` @ 0.33.0 with ``store_threshold=1`` (the
default: no admission counter) and no KV events: a fixed number of chunks, a free list,
ref counts (-1 while a store is in flight, n while n loads read the chunk), and the
policy (``tuner.sim.kv_connector.policies``) that orders them for eviction.

``lookup`` -> HIT / HIT_PENDING (stored, not yet readable) / MISS; ``prepare_load`` pins
hits, ``complete_load`` unpins; ``prepare_store`` evicts idle chunks (never the offered
keys) and allocates chunks for the missing keys, or returns None when not enough chunks
are idle; ``complete_store`` makes them readable. The per-request access record
(``_Access``) feeds ``on_request_finished`` (ARC's T1 -> T2 moves).

Speed (docs/kv-offloading.md "Speed", ``bench/kv_tier.py``): vLLM's manager walks an offered
run key by key; this one takes the run whole (the policy's ``classify`` / ``insert_many``
/ ``complete_stores``, set operations for the access record). Contract:
every answer and every policy state equals the key-at-a-time port's, held by
``tests/sim/test_kv_pool_batched.py`` against ``tests/sim/_kv_pool_plain.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Iterable

import numpy as np

from tuner.sim.kv_connector.lru_pool import HIT, HIT_PENDING, MISS, LRUPool
from tuner.sim.kv_connector.policies import Chunk, ReqContext, make_policy

__all__ = ["CPUOffloadingManager", "HIT", "HIT_PENDING", "MISS", "make_pool"]


@dataclass(slots=True)
class _Access:
    """Cache keys one request observed, in first-seen order (manager.py _RequestCacheAccess)."""

    keys: list[int] = field(default_factory=list)  # the one group's keys, first seen first
    seen: set[int] = field(default_factory=set)
    inserted: set[int] = field(default_factory=set)
    reused: set[int] = field(default_factory=set)
    store_misses: set[int] = field(default_factory=set)
    finished: bool = False

    def renumber(self, live: np.ndarray) -> None:
        """Hash ids renumbered (monotone): the new id of ``k`` is its index in ``live``."""
        def new_ids(keys: "list[int] | set[int]") -> list[int]:
            return np.searchsorted(live, np.fromiter(keys, np.int64, len(keys))).tolist()

        self.keys = new_ids(self.keys)
        for name in ("seen", "inserted", "reused", "store_misses"):
            setattr(self, name, set(new_ids(getattr(self, name))))


def make_pool(num_chunks: int, policy: str) -> "LRUPool | CPUOffloadingManager":
    """The CPU pool for vLLM's ``eviction_policy`` name: LRU over arrays by dense key
    (``lru_pool``: a full pool evicts whole runs), ARC as the batched port here."""
    if policy == "lru":
        return LRUPool(num_chunks)
    return CPUOffloadingManager(num_chunks, policy)


def _listed(keys: Iterable[int]) -> Iterable[int]:
    """The ARC pool keeps keys as Python ints; a caller may hand it an array run."""
    return keys.tolist() if isinstance(keys, np.ndarray) else keys


class CPUOffloadingManager:
    """The CPU chunk pool (ARC); see the module doc. ``num_chunks`` from
    ``cpu_bytes_to_use``. ``positions`` arguments are accepted for the LRU pool's
    interface and not read: ARC orders a finish by ``ReqContext.positions``."""

    #: the pool's finish reads ``ReqContext.positions``: callers must keep it
    needs_position_map = True

    def __init__(self, num_chunks: int, policy: str = "arc") -> None:
        self.num_chunks = num_chunks
        self._num_allocated = 0
        self._free: list[int] = []
        # One Chunk object per chunk id, reused after an eviction (reset to in flight):
        # a full pool evicts and stores ~2.5 M chunks in the agentic hour's first 10
        # minutes, and a fresh object per store (a GC-tracked allocation) cost ~10 % of
        # the tier's time. Safe because an evicted chunk is referenced nowhere after
        # ``prepare_store`` reads its id.
        self._chunk_of_id: list[Chunk] = []
        self.policy = make_policy(policy, num_chunks)
        self.num_evictable = 0  # ready chunks with ref_cnt 0
        self.num_write_pending = 0
        self.num_evicted = 0  # chunks evicted so far (counter)

    def _num_free(self) -> int:
        return len(self._free) + self.num_chunks - self._num_allocated

    def _allocate(self, n: int) -> list[Chunk]:
        fresh = min(n, self.num_chunks - self._num_allocated)
        start = self._num_allocated
        chunks = list(map(Chunk, range(start, start + fresh)))
        self._chunk_of_id.extend(chunks)
        self._num_allocated += fresh
        if n > fresh:  # reused ids pop from the free list's end, as one by one
            free = self._free
            reuse = free[len(free) - (n - fresh):]
            del free[len(free) - (n - fresh):]
            reused = list(map(self._chunk_of_id.__getitem__, reversed(reuse)))
            for chunk in reused:
                chunk.ref_cnt = -1  # was 0 (evictable) when evicted
            chunks.extend(reused)
        return chunks

    def _access(self, ctx: ReqContext) -> _Access:
        if ctx.access is None:
            ctx.access = _Access()
        return ctx.access  # type: ignore[return-value]

    def _record(self, keys: list[int], ctx: ReqContext, reused: list[int] = (),
                present: set[int] | None = None) -> None:
        """Record ``keys`` as seen by the request; ``present``: the keys of ``keys``
        in the pool, when the caller has them (the policy's access update reuses them)."""
        state = self._access(ctx)
        seen = state.seen
        fresh = set(keys)
        fresh -= seen
        if fresh:
            assert not state.finished, "new cache keys after request finalization (tuner bug)"
            if len(fresh) == len(keys):  # the usual run: all new, none repeated
                new = keys
            else:  # seen keys, or a hash repeated in the offer: first one counts
                new = [k for k in dict.fromkeys(keys) if k in fresh]
                present = None
            state.keys.extend(new)
            seen |= fresh
            self.policy.on_request_access(new, ctx, present)
        if reused:
            state.reused |= set(reused).difference(state.inserted)

    # ----------------------------------------------------------------- interface
    def on_new_request(self, ctx: ReqContext) -> None:
        self._access(ctx)

    def lookup(self, key: int) -> int:
        chunk = self.policy.get(key)
        if chunk is None:
            return MISS
        return HIT if chunk.ref_cnt >= 0 else HIT_PENDING

    def lookup_run(self, keys: Iterable[int]) -> tuple[int, bool]:
        """(how many of ``keys`` from the first are stored, whether any of those is
        still being stored)."""
        hits, pending = 0, False
        for key in _listed(keys):
            result = self.lookup(key)
            if result == MISS:
                break
            hits += 1
            pending |= result == HIT_PENDING
        return hits, pending

    def prepare_load(self, keys: Collection[int], ctx: ReqContext,
                     positions: object = None) -> None:
        keys = _listed(keys)
        policy = self.policy
        for key in keys:
            chunk = policy.get(key)
            assert chunk is not None and chunk.is_ready, f"chunk {key} not loadable (tuner bug)"
            if chunk.ref_cnt == 0:
                policy.mark_non_evictable(key)
                self.num_evictable -= 1
            chunk.ref_cnt += 1
        self._record(keys, ctx, reused=keys)

    def complete_load(self, keys: Iterable[int]) -> None:
        keys = _listed(keys)
        policy = self.policy
        for key in keys:
            chunk = policy.get(key)
            assert chunk is not None and chunk.ref_cnt > 0, f"chunk {key} not loading (tuner bug)"
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self.num_evictable += 1
                policy.mark_evictable(key)

    def prepare_store(self, keys: list[int], ctx: ReqContext, positions: object = None
                      ) -> tuple[list[int], int] | None:
        """(keys to store, chunks evicted for them), or None: not enough idle chunks."""
        keys = _listed(keys)
        policy = self.policy
        to_store, ready_existing, present = policy.classify(keys, self.num_write_pending > 0)
        state = self._access(ctx)
        if to_store:
            store_misses = state.store_misses
            misses = [k for k in to_store if k not in store_misses]
            if misses:
                policy.on_store_miss(misses, ctx)
                store_misses.update(misses)
        if len(to_store) + len(ready_existing) == len(keys):
            recorded_keys = keys  # no key is still being stored: all are recorded
        else:
            recorded = set(to_store)
            recorded.update(ready_existing)
            recorded_keys = [k for k in keys if k in recorded]
            present = None
        self._record(recorded_keys, ctx, reused=ready_existing, present=present)
        if not to_store:
            return [], 0
        num_evict = len(to_store) - self._num_free()
        num_evicted = 0
        if num_evict > 0:
            if num_evict > self.num_evictable:
                return None
            evicted = policy.evict(num_evict, set(keys))
            if evicted is None:
                return None
            self.num_evictable -= len(evicted)
            self._free.extend([chunk.chunk_id for _, chunk in evicted])
            num_evicted = len(evicted)
            self.num_evicted += num_evicted
        policy.insert_many(to_store, self._allocate(len(to_store)), ctx)
        self.num_write_pending += len(to_store)
        state.inserted.update(to_store)
        return to_store, num_evicted

    def complete_store(self, keys: Iterable[int]) -> None:
        n = self.policy.complete_stores(_listed(keys))
        self.num_write_pending -= n
        self.num_evictable += n

    def on_request_finished(self, ctx: ReqContext) -> None:
        state = ctx.access
        if not isinstance(state, _Access) or state.finished:
            return
        state.finished = True
        keys = list(state.keys)
        try:  # head to tail (order_request_keys), when every key has a position
            keys.sort(key=ctx.positions.__getitem__)
        except KeyError:  # the keys are computed before the list is touched: unchanged
            keys = list(state.keys)
        # One group, already in order: the policy's own order_request_keys sorts the same
        # list again to the same order, so it gets the sorted keys and skips it.
        self.policy.on_request_finished((keys,), state.inserted - state.reused,
                                        state.reused, ctx, ordered=True)

    @property
    def num_used_chunks(self) -> int:
        return self._num_allocated - len(self._free)

    # ----------------------------------------------------------------- hash ids
    def pool_keys(self) -> list[int]:
        """Every key the policy holds (T1, T2 and the ghost lists)."""
        return list(self.policy.keys())

    def renumber(self, live: np.ndarray) -> None:
        """Hash id ``live[i]`` becomes ``i`` (monotone, ``tuner.sim.hash_space``)."""
        old = np.unique(np.asarray(self.pool_keys(), dtype=np.int64))
        self.policy.renumber(dict(zip(old.tolist(), np.searchsorted(live, old).tolist())))
