"""``CPUOffloadingManager``: the host-memory chunk pool of vLLM 0.33.0's native offloading.

Mirrors ``vllm/v1/kv_offload/cpu/manager.py`` @ 0.33.0 with ``store_threshold=1`` (the
default: no admission counter) and no KV events: a fixed number of chunks, a free list,
ref counts (-1 while a store is in flight, n while n loads read the chunk), and the
policy (``tuner.sim.kv_connector.policies``) that orders them for eviction.

``lookup`` -> HIT / HIT_PENDING (stored, not yet readable) / MISS; ``prepare_load`` pins
hits, ``complete_load`` unpins; ``prepare_store`` evicts idle chunks (never the offered
keys) and allocates chunks for the missing keys, or returns None when not enough chunks
are idle; ``complete_store`` makes them readable. The per-request access record
(``_Access``) feeds ``on_request_finished`` (LRU's recency commit, ARC's T1 -> T2 moves).

Speed (docs/kv-offloading.md "Speed", ``bench/kv_tier.py``): vLLM's manager walks an offered
run key by key; this one takes the run whole (the policy's ``classify`` / ``insert_many``
/ ``complete_stores``, set operations for the access record, LRU's store-miss touch
skipped because a missed key is not in the pool and so has no rank to refresh). Contract:
every answer and every policy state equals the key-at-a-time port's, held by
``tests/sim/test_kv_pool_batched.py`` against ``tests/sim/_kv_pool_plain.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Iterable

from tuner.sim.kv_connector.policies import Chunk, ReqContext, make_policy

__all__ = ["CPUOffloadingManager", "HIT", "HIT_PENDING", "MISS"]

MISS, HIT, HIT_PENDING = 0, 1, 2


@dataclass(slots=True)
class _Access:
    """Cache keys one request observed, in first-seen order (manager.py _RequestCacheAccess)."""

    keys: list[int] = field(default_factory=list)  # the one group's keys, first seen first
    seen: set[int] = field(default_factory=set)
    inserted: set[int] = field(default_factory=set)
    reused: set[int] = field(default_factory=set)
    store_misses: set[int] = field(default_factory=set)
    finished: bool = False


class CPUOffloadingManager:
    """The CPU chunk pool; see the module doc. ``num_chunks`` from ``cpu_bytes_to_use``."""

    def __init__(self, num_chunks: int, policy: str = "lru") -> None:
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
        # The access record's inserted/reused sets feed only ARC's on_request_finished
        # (T1 -> T2 moves); LRU's ignores them, so an LRU pool does not keep them.
        self._track_reuse = self.policy.name != "lru"

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
        if reused and self._track_reuse:
            state.reused |= set(reused).difference(state.inserted)

    # ----------------------------------------------------------------- interface
    def on_new_request(self, ctx: ReqContext) -> None:
        self._access(ctx)

    def lookup(self, key: int) -> int:
        chunk = self.policy.get(key)
        if chunk is None:
            return MISS
        return HIT if chunk.ref_cnt >= 0 else HIT_PENDING

    def prepare_load(self, keys: Collection[int], ctx: ReqContext) -> None:
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
        policy = self.policy
        for key in keys:
            chunk = policy.get(key)
            assert chunk is not None and chunk.ref_cnt > 0, f"chunk {key} not loading (tuner bug)"
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self.num_evictable += 1
                policy.mark_evictable(key)

    def prepare_store(self, keys: list[int], ctx: ReqContext) -> tuple[list[int], int] | None:
        """(keys to store, chunks evicted for them), or None: not enough idle chunks."""
        policy = self.policy
        to_store, ready_existing, present = policy.classify(keys, self.num_write_pending > 0)
        state = self._access(ctx)
        if to_store and policy.name != "lru":  # LRU: a miss is not in the pool, so its
            store_misses = state.store_misses  # touch (on_store_miss) changes nothing
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
        if self._track_reuse:
            state.inserted.update(to_store)
        return to_store, num_evicted

    def complete_store(self, keys: Iterable[int]) -> None:
        n = self.policy.complete_stores(keys)
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
