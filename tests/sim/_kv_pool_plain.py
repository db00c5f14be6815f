"""The plain, key-at-a-time CPU pool (the port as it was before the batched one): the
reference that tests/sim/test_kv_pool_batched.py holds tuner.sim.kv_connector to."""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Collection


import heapq
from collections import OrderedDict
from typing import Iterable, Iterator, Sequence

__all__ = ["ARCPolicy", "Chunk", "LRUPolicy", "ReqContext", "make_policy"]


class Chunk:
    """One CPU chunk (vLLM ``ChunkStatus``): ``ref_cnt`` -1 while its store is in flight,
    else the number of loads reading it."""

    __slots__ = ("ref_cnt", "chunk_id")

    def __init__(self, chunk_id: int) -> None:
        self.ref_cnt = -1
        self.chunk_id = chunk_id

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0


class ReqContext:
    """vLLM's per-request ``ReqContext``: offload-key positions (tokens up to the end of
    the key's chunk) and the policy/manager state kept per request."""

    __slots__ = ("positions", "lru_rank", "lru_owner", "access")

    def __init__(self) -> None:
        self.positions: dict[int, int] = {}
        self.lru_rank = 0  # 0: not ranked yet (LRUPolicy._request_rank)
        self.lru_owner: object | None = None
        self.access: object | None = None  # the manager's _RequestCacheAccess

    def position(self, key: int) -> int | None:
        return self.positions.get(key)


def order_request_keys(groups: Sequence[Sequence[int]], ctx: ReqContext) -> list[int]:
    """Head-to-tail order over the request's groups (base.py ``order_request_keys``)."""
    keys = [k for g in groups for k in g]
    pos = {k: p for k in keys if (p := ctx.position(k)) is not None}
    if len(pos) == len(keys):
        keys.sort(key=pos.__getitem__)
    return keys


class LRUPolicy:
    """``LRUCachePolicy`` (lru.py): ranks with a lazily invalidated min-heap."""

    name = "lru"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.chunks: dict[int, Chunk] = {}
        self._ranks: dict[int, tuple[int, int]] = {}
        self._evictable: set[int] = set()
        self._heap: list[tuple[tuple[int, int], int]] = []
        self._next_rank = 0

    def _request_rank(self, ctx: ReqContext) -> int:
        if ctx.lru_owner is not self:
            self._next_rank += 1
            ctx.lru_rank = self._next_rank
            ctx.lru_owner = self
        return ctx.lru_rank

    def get(self, key: int) -> Chunk | None:
        return self.chunks.get(key)

    def insert(self, key: int, chunk: Chunk, ctx: ReqContext) -> None:
        self.chunks[key] = chunk
        position = ctx.positions.get(key)
        if position is None:
            self._next_rank += 1
            self._ranks[key] = (self._next_rank, 0)
        else:
            self._ranks[key] = (self._request_rank(ctx), -position)
        if chunk.ref_cnt == 0:
            self._evictable.add(key)
            heapq.heappush(self._heap, (self._ranks[key], key))

    def remove(self, key: int) -> None:
        del self.chunks[key]
        self._ranks.pop(key, None)
        self._evictable.discard(key)

    def on_store_miss(self, keys: Iterable[int], ctx: ReqContext) -> None:
        self.touch(keys, ctx)  # CachePolicy.on_store_miss default

    def touch(self, keys: Iterable[int], ctx: ReqContext) -> None:
        self._update_recency(reversed(list(keys)))

    def _update_recency(self, keys: Iterable[int]) -> None:
        """Fresh ranks, tail first. Ranks only grow, so the heap keeps the old (smaller)
        entry and ``evict`` re-pushes it at its true rank when it surfaces (exact: every
        heap rank is <= its key's true rank, so the first entry that is current holds the
        smallest true rank; lru.py pushes eagerly, with the same result)."""
        chunks, ranks = self.chunks, self._ranks
        rank = self._next_rank
        for key in keys:
            if key in chunks:
                rank += 1
                ranks[key] = (rank, 0)
        self._next_rank = rank

    def on_request_access(self, keys: Iterable[int], ctx: ReqContext) -> None:
        rank_r = self._request_rank(ctx)
        positions, chunks, ranks = ctx.positions, self.chunks, self._ranks
        for key in keys:
            position = positions.get(key)
            if position is None or key not in chunks:
                continue
            rank = (rank_r, -position)
            if ranks[key] < rank:  # ranks only grow (lru.py: ``>= rank: continue``)
                ranks[key] = rank

    def on_request_finished(self, groups: Sequence[Sequence[int]], inserted_only: set[int],
                            reused: set[int], ctx: ReqContext, ordered: bool = False) -> None:
        keys = groups[0] if ordered else order_request_keys(groups, ctx)
        self._update_recency(reversed(keys))

    def _compact(self) -> None:
        if len(self._heap) >= max(64, 2 * len(self._evictable)):
            self._heap = [(self._ranks[k], k) for k in self._evictable]
            heapq.heapify(self._heap)

    def evict(self, n: int, protected: set[int]) -> list[tuple[int, Chunk]] | None:
        """The ``n`` evictable, unprotected keys of smallest rank, or None (no change)."""
        if n == 0:
            return []
        heap, ranks, evictable = self._heap, self._ranks, self._evictable
        selected: list[tuple[tuple[int, int], int]] = []
        seen: set[int] = set()
        deferred: list[tuple[tuple[int, int], int]] = []
        while heap and len(selected) < n:
            entry = heapq.heappop(heap)
            rank, key = entry
            if key not in evictable or key in seen:
                continue
            current = ranks[key]
            if current != rank:  # a lazy entry: back in at the key's true rank
                heapq.heappush(heap, (current, key))
                continue
            if key in protected:
                deferred.append(entry)
                continue
            selected.append(entry)
            seen.add(key)
        if len(selected) < n:
            for entry in selected + deferred:
                heapq.heappush(heap, entry)
            return None
        for entry in deferred:
            heapq.heappush(heap, entry)
        out = []
        for _, key in selected:
            evictable.remove(key)
            out.append((key, self.chunks.pop(key)))
            del ranks[key]
        self._compact()
        return out

    def mark_evictable(self, key: int) -> None:
        self._evictable.add(key)
        heapq.heappush(self._heap, (self._ranks[key], key))
        self._compact()

    def mark_non_evictable(self, key: int) -> None:
        self._evictable.remove(key)

    def keys(self) -> Iterator[int]:
        return iter(self.chunks)

    def renumber(self, new_of: dict[int, int]) -> None:
        """Hash ids renumbered (monotone, ``tuner.sim.hash_space``): same order, new keys."""
        self.chunks = {new_of[k]: c for k, c in self.chunks.items()}
        self._ranks = {new_of[k]: r for k, r in self._ranks.items()}
        self._evictable = {new_of[k] for k in self._evictable}
        self._heap = [(self._ranks[k], k) for k in self._evictable]
        heapq.heapify(self._heap)


class ARCPolicy:
    """``ARCCachePolicy`` (arc.py): T1/T2 with ghost lists B1/B2 and an adaptive target."""

    name = "arc"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.target_t1_size = 0.0
        self.t1: OrderedDict[int, Chunk] = OrderedDict()
        self.t2: OrderedDict[int, Chunk] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def get(self, key: int) -> Chunk | None:
        return self.t1.get(key) or self.t2.get(key)

    def insert(self, key: int, chunk: Chunk, ctx: ReqContext) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: int) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def _adapt_to_ghost_hit(self, key: int) -> None:
        if key in self.b1:
            delta = max(1, len(self.b2) / len(self.b1))
            self.target_t1_size = min(self.target_t1_size + delta, self.capacity)
            self.b1.move_to_end(key)
        elif key in self.b2:
            delta = max(1, len(self.b1) / len(self.b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0)
            self.b2.move_to_end(key)

    def on_store_miss(self, keys: Iterable[int], ctx: ReqContext) -> None:
        for key in reversed(list(keys)):
            self._adapt_to_ghost_hit(key)

    def touch(self, keys: Iterable[int], ctx: ReqContext) -> None:
        for key in reversed(list(keys)):
            if key in self.t1:
                chunk = self.t1.pop(key)
                if not chunk.is_ready:
                    self.t1[key] = chunk
                else:
                    self.t2[key] = chunk
            elif key in self.t2:
                self.t2.move_to_end(key)
            else:
                self._adapt_to_ghost_hit(key)

    def on_request_access(self, keys: Iterable[int], ctx: ReqContext) -> None:
        return

    def on_request_finished(self, groups: Sequence[Sequence[int]], inserted_only: set[int],
                            reused: set[int], ctx: ReqContext, ordered: bool = False) -> None:
        keys = groups[0] if ordered else order_request_keys(groups, ctx)
        for key in reversed(keys):
            if key in inserted_only:
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
                continue
            if key in reused and key in self.t1:
                self.t2[key] = self.t1.pop(key)
            elif key in reused and key in self.t2:
                self.t2.move_to_end(key)

    def evict(self, n: int, protected: set[int]) -> list[tuple[int, Chunk]] | None:
        if n == 0:
            return []
        candidates: list[tuple[int, Chunk, bool]] = []
        virtual_t1 = len(self.t1)
        t1_iter, t2_iter = iter(self.t1.items()), iter(self.t2.items())

        def nxt(entries: Iterator[tuple[int, Chunk]]) -> tuple[int, Chunk] | None:
            for key, chunk in entries:
                if chunk.ref_cnt == 0 and key not in protected:
                    return key, chunk
            return None

        for _ in range(n):
            cand: tuple[int, Chunk, bool] | None = None
            if virtual_t1 >= int(self.target_t1_size):
                entry = nxt(t1_iter)
                if entry is not None:
                    cand = (*entry, True)
                    virtual_t1 -= 1
            if cand is None:
                entry = nxt(t2_iter)
                if entry is not None:
                    cand = (*entry, False)
            if cand is None:
                entry = nxt(t1_iter)
                if entry is None:
                    return None
                cand = (*entry, True)
                virtual_t1 -= 1
            candidates.append(cand)
        out = []
        for key, chunk, from_t1 in candidates:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            out.append((key, chunk))
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.capacity):
                ghost.popitem(last=False)
        return out

    def mark_evictable(self, key: int) -> None:
        return

    def mark_non_evictable(self, key: int) -> None:
        return

    def keys(self) -> Iterator[int]:
        yield from self.t1
        yield from self.t2
        yield from self.b1
        yield from self.b2

    def renumber(self, new_of: dict[int, int]) -> None:
        for name in ("t1", "t2", "b1", "b2"):
            old = getattr(self, name)
            setattr(self, name, OrderedDict((new_of[k], v) for k, v in old.items()))


def make_policy(name: str, capacity: int) -> LRUPolicy | ARCPolicy:
    """vLLM's ``CachePolicyFactory`` for the two built-in names."""
    if name == "lru":
        return LRUPolicy(capacity)
    if name == "arc":
        return ARCPolicy(capacity)
    raise ValueError(f"eviction policy {name!r}: vLLM 0.33.0 has 'lru' and 'arc'")
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
        self.policy = make_policy(policy, num_chunks)
        self.num_evictable = 0  # ready chunks with ref_cnt 0
        self.num_write_pending = 0
        self.num_evicted = 0  # chunks evicted so far (counter)

    def _num_free(self) -> int:
        return len(self._free) + self.num_chunks - self._num_allocated

    def _allocate(self, n: int) -> list[Chunk]:
        fresh = min(n, self.num_chunks - self._num_allocated)
        chunks = [Chunk(self._num_allocated + i) for i in range(fresh)]
        self._num_allocated += fresh
        for _ in range(n - fresh):
            chunks.append(Chunk(self._free.pop()))
        return chunks

    def _access(self, ctx: ReqContext) -> _Access:
        if ctx.access is None:
            ctx.access = _Access()
        return ctx.access  # type: ignore[return-value]

    def _record(self, keys: Iterable[int], ctx: ReqContext,
                reused: Iterable[int] = ()) -> None:
        state = self._access(ctx)
        seen = state.seen
        new = [key for key in keys if key not in seen]
        if new:
            assert not state.finished, "new cache keys after request finalization (tuner bug)"
            if len(set(new)) != len(new):  # a hash repeated in the offer: first one counts
                new = list(dict.fromkeys(new))
            state.keys.extend(new)
            seen.update(new)
            self.policy.on_request_access(new, ctx)
        state.reused.update(k for k in reused if k not in state.inserted)

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
        to_store: list[int] = []
        ready_existing: list[int] = []
        for key in keys:
            chunk = policy.get(key)
            if chunk is None:
                to_store.append(key)
            elif chunk.is_ready:
                ready_existing.append(key)
        state = self._access(ctx)
        misses = [k for k in to_store if k not in state.store_misses]
        if misses:
            policy.on_store_miss(misses, ctx)
            state.store_misses.update(misses)
        recorded = set(to_store)
        recorded.update(ready_existing)
        self._record((k for k in keys if k in recorded), ctx, reused=ready_existing)
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
            for _, chunk in evicted:
                self._free.append(chunk.chunk_id)
            num_evicted = len(evicted)
            self.num_evicted += num_evicted
        for key, chunk in zip(to_store, self._allocate(len(to_store))):
            policy.insert(key, chunk, ctx)
        self.num_write_pending += len(to_store)
        state.inserted.update(to_store)
        return to_store, num_evicted

    def complete_store(self, keys: Iterable[int]) -> None:
        policy = self.policy
        for key in keys:
            chunk = policy.get(key)
            if chunk is not None and not chunk.is_ready:
                chunk.ref_cnt = 0
                self.num_write_pending -= 1
                self.num_evictable += 1
                policy.mark_evictable(key)

    def on_request_finished(self, ctx: ReqContext) -> None:
        state = ctx.access
        if not isinstance(state, _Access) or state.finished:
            return
        state.finished = True
        keys = list(state.keys)
        positions = ctx.positions
        if all(k in positions for k in keys):  # head to tail (order_request_keys)
            keys.sort(key=positions.__getitem__)
        # One group, already in order: the policy's own order_request_keys sorts the same
        # list again to the same order, so it gets the sorted keys and skips it.
        self.policy.on_request_finished((keys,), state.inserted - state.reused,
                                        state.reused, ctx, ordered=True)

    @property
    def num_used_chunks(self) -> int:
        return self._num_allocated - len(self._free)
