"""The free-block queue: block ids in eviction order, with removal from the middle.

Mirrors ``FreeKVCacheBlockQueue`` in ``vllm/v1/core/kv_cache_utils.py`` @ 0.33.0 in what
it *does*: the front is allocated (and its cached hash evicted) first; freed hashed
blocks go to the back, freed unhashed blocks to the front; touching a prefix-cache hit
takes a block out of the middle. ``BlockPool.free_blocks`` decides which end a freed
block goes to; this class only keeps the order.

Why not vLLM's intrusive linked list: the twin moves *thousands* of blocks per
admission and per finish (an agentic prompt is ~3,000 blocks of 16 tokens), and a
Python loop per block was most of a replay's time. Here every operation on a batch of
blocks is a handful of numpy calls:

* entries ``(block id, stamp)`` sit in a *back* buffer (appends at its end, pops from
  its start) and a *front* stack (prepends on top, pops from the top);
* ``stamp_of[id]`` is the stamp of the block's live entry, or -1 when it is not free;
  an entry is live iff its stamp equals ``stamp_of`` of its block. Removing a block
  from the middle is one store (``stamp_of[id] = -1``); its entry goes stale and is
  skipped when a pop reaches it (each stale entry is passed over once);
* the back buffer is compacted when full, so memory stays O(number of blocks);
* stamps are int32 (``stamp_of`` and both buffers' stamp columns): a stamp is only
  compared for equality, so when the counter nears 2**31 (``STAMP_LIMIT``) every live
  entry is renumbered from 0 and the stale ones dropped (``_rebase``), which keeps the
  order and which entries are live. Why int32: a P/D replay alternates two pools of
  ~400,000 blocks step by step on one core and the per-call cost grows with the bytes
  both keep hot (docs/disaggregation.md, cost section); ``stamp_of`` is gathered at
  every pop and scattered at every free, at random block ids. Block ids stay int64:
  they leave the queue as indices, and numpy converts an int32 index array on every
  gather and scatter.

``tests/sim/test_block_pool.py`` checks it against a ``deque`` reference on random
operation sequences, and the whole pool against vLLM's linked-list design.
"""

from __future__ import annotations

import numpy as np

_ID = np.int64
_STAMP = np.int32
#: Stamps run below this; the next batch that would reach it renumbers first (_rebase).
STAMP_LIMIT = (1 << 31) - 1


class FreeBlockQueue:
    """Free block ids in eviction order (front = next to allocate / evict)."""

    __slots__ = ("num_free_blocks", "stamp_of", "_next_stamp", "_ids", "_stamps", "_head",
                 "_tail", "_fids", "_fstamps", "_ftop", "stamp_limit", "num_rebases")

    def __init__(self, block_ids: "np.ndarray | list[int]", num_blocks: int | None = None,
                 stamp_limit: int = STAMP_LIMIT) -> None:
        """Start with ``block_ids`` free, in that order; ids are < ``num_blocks``.

        ``stamp_limit``: stamps stay below it (``STAMP_LIMIT``; tests pass a small one
        to exercise the renumbering).
        """
        ids = np.asarray(block_ids, dtype=_ID)
        n = len(ids)
        size = int(ids.max()) + 1 if num_blocks is None and n else (num_blocks or 0)
        if not size <= stamp_limit <= STAMP_LIMIT:
            # after a rebase the live entries take stamps 0..live-1 and a batch of other,
            # distinct blocks follows them: together at most ``size`` stamps
            raise ValueError(f"stamp_limit={stamp_limit} must be in [{size}, 2**31 - 1]")
        self.stamp_limit = stamp_limit
        self.num_rebases = 0
        self.num_free_blocks = n
        self.stamp_of = np.full(size, -1, dtype=_STAMP)
        cap = max(2 * size, 1024)
        self._ids = np.empty(cap, dtype=_ID)
        self._stamps = np.empty(cap, dtype=_STAMP)
        self._ids[:n] = ids
        self._stamps[:n] = np.arange(n, dtype=_STAMP)
        self.stamp_of[ids] = self._stamps[:n]
        self._next_stamp = n
        self._head, self._tail = 0, n
        self._fids = np.empty(max(size, 256), dtype=_ID)
        self._fstamps = np.empty(max(size, 256), dtype=_STAMP)
        self._ftop = 0

    # ----------------------------------------------------------------- queries
    def is_free(self, block_id: int) -> bool:
        return bool(self.stamp_of[block_id] >= 0)

    def get_all_free_blocks(self) -> list[int]:
        """All free block ids front to back (for tests and invariant checks; O(n))."""
        stamp_of = self.stamp_of
        f = self._ftop
        fids, fst = self._fids[:f][::-1], self._fstamps[:f][::-1]
        front = fids[stamp_of[fids] == fst]
        bids = self._ids[self._head:self._tail]
        back = bids[stamp_of[bids] == self._stamps[self._head:self._tail]]
        return front.tolist() + back.tolist()

    # ----------------------------------------------------------------- removal
    def popleft(self) -> int:
        """Take the front block (scalar path: the decode group takes one at a time)."""
        if self.num_free_blocks <= 0:
            raise ValueError("No free blocks available")
        stamp_of = self.stamp_of
        while self._ftop:
            self._ftop -= 1
            block = int(self._fids[self._ftop])
            if stamp_of[block] == self._fstamps[self._ftop]:
                stamp_of[block] = -1
                self.num_free_blocks -= 1
                return block
        ids, stamps = self._ids, self._stamps
        head = self._head
        while True:
            block = int(ids[head])
            live = stamp_of[block] == stamps[head]
            head += 1
            if live:
                self._head = head
                stamp_of[block] = -1
                self.num_free_blocks -= 1
                return block

    def popleft_n(self, n: int) -> np.ndarray:
        """Take ``n`` blocks from the front, in queue order."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot take {n} blocks, only {self.num_free_blocks} free")
        if n <= 0:
            return np.empty(0, dtype=_ID)
        parts = []
        need = n
        if self._ftop:
            need = self._pop_front_stack(need, parts)
        if need:
            self._pop_back_buffer(need, parts)
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        self.stamp_of[out] = -1
        self.num_free_blocks -= n
        return out

    def _pop_front_stack(self, need: int, parts: list) -> int:
        stamp_of = self.stamp_of
        while need and self._ftop:
            top = self._ftop
            lo = max(0, top - max(2 * need, 64))
            cand = self._fids[lo:top][::-1]
            live = (stamp_of.take(cand) == self._fstamps[lo:top][::-1]).nonzero()[0]
            if len(live) >= need:
                parts.append(cand[live[:need]])
                self._ftop = top - int(live[need - 1]) - 1
                return 0
            if len(live):
                parts.append(cand[live])
                need -= len(live)
            self._ftop = lo
        return need

    def _pop_back_buffer(self, need: int, parts: list) -> None:
        stamp_of = self.stamp_of
        while need:
            head = self._head
            hi = min(self._tail, head + max(2 * need, 64))
            cand = self._ids[head:hi]
            live = (stamp_of.take(cand) == self._stamps[head:hi]).nonzero()[0]
            if len(live) >= need:
                parts.append(cand[live[:need]])
                self._head = head + int(live[need - 1]) + 1
                return
            if len(live):
                parts.append(cand[live])
                need -= len(live)
            self._head = hi
            if hi >= self._tail and need:
                raise RuntimeError("free queue count out of sync (tuner bug)")

    def remove(self, block_id: int) -> None:
        """Take a free block out of the middle (a touched prefix-cache hit)."""
        if self.stamp_of[block_id] < 0:
            raise RuntimeError(f"remove() of block {block_id}, not in the free queue "
                               "(tuner bug)")
        self.stamp_of[block_id] = -1
        self.num_free_blocks -= 1

    def remove_many(self, block_ids: np.ndarray) -> None:
        """Take free, distinct blocks out of the middle (the caller checked both)."""
        self.stamp_of[block_ids] = -1
        self.num_free_blocks -= len(block_ids)

    # ----------------------------------------------------------------- insertion
    def append_n(self, block_ids: np.ndarray) -> None:
        """Put distinct non-free blocks at the back, in the given order (kept longest)."""
        k = len(block_ids)
        if not k:
            return
        if self._next_stamp + k > self.stamp_limit:
            self._rebase(k)  # compacts both buffers: before the room check below
        if self._tail + k > len(self._ids):
            self._compact(k)
        tail, stamp = self._tail, self._next_stamp
        stamps = np.arange(stamp, stamp + k, dtype=_STAMP)
        self._ids[tail:tail + k] = block_ids
        self._stamps[tail:tail + k] = stamps
        self.stamp_of[block_ids] = stamps
        self._tail = tail + k
        self._next_stamp = stamp + k
        self.num_free_blocks += k

    def prepend_n(self, block_ids: np.ndarray) -> None:
        """Put distinct non-free blocks at the front, keeping their order (reused first)."""
        k = len(block_ids)
        if not k:
            return
        if self._next_stamp + k > self.stamp_limit:
            self._rebase(k)  # compacts both buffers: before the room check below
        if self._ftop + k > len(self._fids):
            self._compact_front(k)
        top = self._ftop
        stamp = self._next_stamp
        stamps = np.arange(stamp, stamp + k, dtype=_STAMP)
        self._fids[top:top + k] = block_ids[::-1]  # the first one ends on top
        self._fstamps[top:top + k] = stamps
        self.stamp_of[block_ids[::-1]] = stamps
        self._ftop = top + k
        self._next_stamp = stamp + k
        self.num_free_blocks += k

    def _rebase(self, extra: int) -> None:
        """Renumber the live entries' stamps from 0 (the counter neared the limit).

        Both buffers are compacted first (stale entries dropped: their stamps could
        otherwise equal a renumbered live one), then the live entries, front stack then
        back buffer, take 0..n-1: the order and the set of free blocks are unchanged,
        only the stamps' values, which are compared for equality alone. O(blocks), once
        every ~2**31 frees (a pool of 400,000 blocks: after ~5,000 full turnovers).
        """
        self._compact_front(0)
        self._compact(0)
        f, b = self._ftop, self._tail - self._head
        self._fstamps[:f] = np.arange(f, dtype=_STAMP)
        self._stamps[self._head:self._tail] = np.arange(f, f + b, dtype=_STAMP)
        self.stamp_of[self._fids[:f]] = self._fstamps[:f]
        self.stamp_of[self._ids[self._head:self._tail]] = self._stamps[self._head:self._tail]
        self._next_stamp = f + b
        self.num_rebases += 1
        if self._next_stamp + extra > self.stamp_limit:
            raise RuntimeError("free queue stamps: more live entries than the limit "
                               "allows (tuner bug)")

    def _compact(self, extra: int) -> None:
        """Drop stale back entries (and grow if the live ones still do not leave room)."""
        self._ids, self._stamps, n = self._repack(self._ids, self._stamps, self._head,
                                                  self._tail, extra)
        self._head, self._tail = 0, n

    def _compact_front(self, extra: int) -> None:
        self._fids, self._fstamps, self._ftop = self._repack(self._fids, self._fstamps, 0,
                                                             self._ftop, extra)

    def _repack(self, ids_buf: np.ndarray, stamps_buf: np.ndarray, lo: int, hi: int,
                extra: int) -> tuple[np.ndarray, np.ndarray, int]:
        """The live entries of ``[lo, hi)`` moved to the start of the (maybe new, twice
        larger) buffers, with room for ``extra`` more; returns the buffers and count."""
        ids, stamps = ids_buf[lo:hi], stamps_buf[lo:hi]
        live = self.stamp_of.take(ids) == stamps
        ids, stamps = ids[live], stamps[live]
        n = len(ids)
        if n + extra > len(ids_buf) // 2:
            ids_buf = np.empty(2 * (n + extra), dtype=_ID)
            stamps_buf = np.empty(2 * (n + extra), dtype=_STAMP)
        ids_buf[:n] = ids
        stamps_buf[:n] = stamps
        return ids_buf, stamps_buf, n
