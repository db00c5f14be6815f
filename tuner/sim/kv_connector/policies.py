"""The CPU pool's ARC eviction policy: vLLM 0.33.0's ``ARCCachePolicy``.

Mirrors ``vllm/v1/kv_offload/cpu/policies/{base,arc}.py`` @ 0.33.0 for one KV-cache
group (the twin models full attention only). Keys are the twin's hash ids of a chunk's
last block (vLLM: ``make_offload_key(block_hash, group_idx)``); a ``ChunkStatus`` is a
``[ref_cnt, chunk_id]`` pair (``ref_cnt == -1``: a store is in flight, not readable).
LRU is a pool of its own over arrays (``tuner.sim.kv_connector.lru_pool``).

Why a port and not a model: which prefix survives in host memory decides which request
loads and which recomputes, so the twin must evict exactly the chunk vLLM evicts.

Batched calls (the manager's hot path; the agentic hour offers ~2,800 chunks per prompt):
``classify`` / ``insert_many`` / ``complete_stores`` do over a request's run of keys what
``get`` / ``insert`` / ``mark_evictable`` do one key at a time, with one dict operation per
run where the order cannot matter. Contract: the same keys in the same order give the same
chunks, T1/T2/B1/B2 orders and target as the one-key calls (every key's list position is
independent of the others except through the order the run gives, which the batched calls
keep). ``tests/sim/test_kv_pool_batched.py`` holds them to the plain port
(``tests/sim/_kv_pool_plain.py``) over generated operation sequences.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice
from typing import Iterable, Iterator, Sequence

__all__ = ["ARCPolicy", "Chunk", "ReqContext", "make_policy"]

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


class ARCPolicy:
    """``ARCCachePolicy`` (arc.py): T1/T2 with ghost lists B1/B2 and an adaptive target.

    ``_inflight``: the keys whose store is in flight (``ref_cnt == -1``), as in
    :class:`LRUPolicy`, so ``classify`` tests readiness with one set difference instead of
    reading each offered chunk (the agentic hour offers ~1.2 M stored keys in two
    minutes) and ``complete_stores`` visits only in-flight keys (held to the ref counts by
    ``tests/sim/test_kv_pool_batched.py``)."""

    name = "arc"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.target_t1_size = 0.0
        self.t1: OrderedDict[int, Chunk] = OrderedDict()
        self.t2: OrderedDict[int, Chunk] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self._inflight: set[int] = set()  # keys whose store is in flight (ref_cnt -1)

    def get(self, key: int) -> Chunk | None:
        return self.t1.get(key) or self.t2.get(key)

    def insert(self, key: int, chunk: Chunk, ctx: ReqContext) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)
        if chunk.ref_cnt < 0:
            self._inflight.add(key)
        else:
            self._inflight.discard(key)

    def classify(self, keys: Sequence[int], any_pending: bool = True
                 ) -> tuple[list[int], list[int], set[int]]:
        """(keys not in T1/T2, keys stored and readable, in offer order; the set of
        keys in T1/T2)."""
        present = self.t1.keys() & keys
        present |= self.t2.keys() & keys
        ready = present - self._inflight if any_pending and self._inflight else present
        return (*_classify(present, ready, keys), present)

    def insert_many(self, keys: Sequence[int], new: Sequence[Chunk], ctx: ReqContext) -> None:
        """``insert`` for each key in order (T1's order is the run's); the chunks are
        new, so in flight."""
        self.t1.update(zip(keys, new))
        self._inflight.update(keys)
        for ghost in (self.b1, self.b2):
            if ghost:
                for key in keys:
                    ghost.pop(key, None)

    def complete_stores(self, keys: Iterable[int]) -> int:
        """Stores finished: in-flight chunks become readable; how many."""
        t1, t2, inflight = self.t1, self.t2, self._inflight
        # The in-flight keys, first occurrence each (a job may name a key twice).
        done = list(dict.fromkeys(filter(inflight.__contains__, keys)))
        inflight.difference_update(done)
        for key in done:
            chunk = t1.get(key)
            (chunk if chunk is not None else t2[key]).ref_cnt = 0
        return len(done)

    def remove(self, key: int) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)
        self._inflight.discard(key)

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

    def on_request_access(self, keys: Iterable[int], ctx: ReqContext,
                          present: set[int] | None = None) -> None:
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
        """arc.py's ``evict``, taken in three runs instead of one candidate at a time.

        arc.py picks each of the ``n`` victims in turn: from T1 while T1's virtual size
        (its length less the T1 victims so far) is at least ``int(target_t1_size)``, else
        from T2, else from T1; a list with no idle, unprotected entry left is skipped.
        The target does not move during an eviction and each T1 pick lowers the virtual
        size by one, so the picks are: T1 up to ``len(T1) - target + 1`` times, then T2,
        then (T2 exhausted) T1 again, each list read front to back. Taking those three
        runs gives the same victims in the same order (a full pool evicts ~800 chunks a
        call in the agentic hour; one Python call per victim cost a quarter of the tier)."""
        if n == 0:
            return []
        t1, t2 = self.t1, self.t2

        def idle(entries: Iterator[tuple[int, Chunk]], count: int) -> list[tuple[int, Chunk]]:
            if count <= 0:
                return []
            return list(islice(((k, c) for k, c in entries
                                if c.ref_cnt == 0 and k not in protected), count))

        t1_iter = iter(t1.items())
        from_t1 = idle(t1_iter, min(n, len(t1) - int(self.target_t1_size) + 1))
        from_t2 = idle(iter(t2.items()), n - len(from_t1))
        rest = n - len(from_t1) - len(from_t2)
        from_t1_after = idle(t1_iter, rest)  # empty if T1 ran out in the first run
        if len(from_t1_after) < rest:
            return None
        b1, b2 = self.b1, self.b2
        for key, _ in from_t1:
            del t1[key]
            b1[key] = None
        for key, _ in from_t2:
            del t2[key]
            b2[key] = None
        for key, _ in from_t1_after:
            del t1[key]
            b1[key] = None
        for ghost in (b1, b2):
            for _ in range(len(ghost) - self.capacity):
                ghost.popitem(last=False)
        return from_t1 + from_t2 + from_t1_after

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
        self._inflight = {new_of[k] for k in self._inflight}


def _classify(present: set[int], ready: set[int], keys: Sequence[int]
              ) -> tuple[list[int], list[int]]:
    """Split an offered run into (keys not ``present`` in the pool, keys ``ready`` to
    read), keeping offer order.

    Set membership instead of a ``get`` and an attribute read per key: the agentic hour
    offers ~1.4 M keys in two minutes, most already stored, and then often all of a run
    is stored and readable (``len(present) == len(keys)`` means distinct keys, all in)."""
    if not present:
        return list(keys), []
    if len(present) == len(keys):
        return [], list(keys) if len(ready) == len(present) else [k for k in keys if k in ready]
    missing = [k for k in keys if k not in present]
    return missing, [k for k in keys if k in ready]


def make_policy(name: str, capacity: int) -> ARCPolicy:
    """vLLM's ``CachePolicyFactory`` for ARC (LRU is a whole pool of its own:
    ``tuner.sim.kv_connector.lru_pool``)."""
    if name == "arc":
        return ARCPolicy(capacity)
    raise ValueError(f"eviction policy {name!r}: vLLM 0.33.0 has 'lru' and 'arc'")
