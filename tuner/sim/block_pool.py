"""``BlockPool``: every KV block, the free queue and the prefix-cache hash map.

Mirrors ``vllm/v1/core/block_pool.py`` @ 0.33.0 for one full-attention KV-cache group:

* block 0 is the null block, never in the free queue and never counted
  (usage = ``1 - free / (num_gpu_blocks - 1)``);
* allocation pops the front of the free queue and evicts the popped block's cached
  hash, if any (``_maybe_evict_cached_block``);
* ``touch`` adopts a prefix-cache hit: a free hit block leaves the queue, ref count + 1;
* ``free_blocks`` takes the blocks in the order the manager passes them (a request's
  blocks tail first): blocks reaching ref count 0 go to the *back* when they carry a
  hash (kept longest, LRU eviction) and to the *front* when not (reused first);
* hashes are registered when a block becomes full at scheduling time
  (``cache_full_blocks``); two blocks may carry the same hash (e.g. the last-token
  rule recomputes a cached last block), a lookup then returns the first one
  registered that is still cached, as vLLM's ``BlockHashToBlockMap`` does.

Representation (why it differs from vLLM's objects): a block is an int id and a hash is
a dense *hash id* (``tuner.sim.hash_ids``). Reference counts, each block's hash and the
hash -> first holder map are numpy arrays, so looking up, touching or freeing the ~3,000
blocks of an agentic prompt is a few vectorised calls instead of a Python loop (or dict
probe) per block. Divergences: no KV events, no metrics collector, one KV-cache group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tuner.sim._free_queue import FreeBlockQueue

if TYPE_CHECKING:
    from tuner.sim.request import SimRequest

__all__ = ["BlockPool", "NULL_BLOCK"]

NULL_BLOCK = 0
_ID = np.int64
_NO_IDS = np.empty(0, dtype=_ID)


class BlockPool:
    """Owns the blocks' ref counts and hashes, the free queue and hash -> block map.

    Invariants (``check_invariants`` walks them): the free queue holds exactly the
    non-null blocks with ``ref_cnt == 0``; every hashed block is a holder of its hash
    (the first one in ``first_holder``, later ones in ``extra_holders`` in registration
    order, ``has_extra`` marking those hashes) and every holder carries that hash;
    ``ref_cnt >= 0``.
    """

    __slots__ = ("num_gpu_blocks", "enable_caching", "ref_cnt", "block_hash",
                 "free_block_queue", "first_holder", "extra_holders", "has_extra",
                 "num_hash_ids", "null_block", "num_evictions", "watched", "watched_mask",
                 "num_watched_ids", "num_stale_watched", "watch_epoch", "_mark", "_positions")

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True,
                 num_hash_ids: int = 1 << 16) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks={num_gpu_blocks} must be >= 2 (block 0 is null)")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = np.zeros(num_gpu_blocks, dtype=np.int32)
        self.block_hash = np.full(num_gpu_blocks, -1, dtype=_ID)  # hash id, -1: none
        self.free_block_queue = FreeBlockQueue(np.arange(1, num_gpu_blocks, dtype=_ID),
                                               num_gpu_blocks)
        # Hash ids below num_hash_ids are the trace's; synthetic ones are reserved above.
        self.num_hash_ids = num_hash_ids
        self.first_holder = np.full(max(num_hash_ids, 16), -1, dtype=_ID)
        self.has_extra = np.zeros(len(self.first_holder), dtype=bool)
        self.extra_holders: dict[int, list[int]] = {}
        self.null_block = NULL_BLOCK
        self.num_evictions = 0  # cached hashes dropped by reallocation
        # Waiting requests with a memoised prefix hit (``SimRequest.hit_memo``) and a
        # superset of the hash ids their memos cover, so an eviction tells in one read
        # whether memos may be stale (KVCacheManager.num_hit_blocks).
        self.watched: set = set()
        self.watched_mask = np.zeros(len(self.first_holder), dtype=bool)
        self.num_watched_ids = 0  # ids set in the mask (with stale ones)
        self.num_stale_watched = 0  # ids of unwatched requests still in the mask
        self.watch_epoch = 0  # bumped when a marked id leaves the map: memos are stale
        # Scratch for the duplicate check of a block batch (see _has_repeats).
        self._mark = np.zeros(num_gpu_blocks, dtype=_ID)
        self._positions = np.arange(1024, dtype=_ID)

    # ----------------------------------------------------------------- hash ids
    def reserve_ids(self, count: int) -> int:
        """Reserve ``count`` fresh hash ids (a request's synthetic hashes); the first."""
        base = self.num_hash_ids
        self.num_hash_ids = base + count
        if self.num_hash_ids > len(self.first_holder):
            self._grow_ids(self.num_hash_ids)
        return base

    def _grow_ids(self, needed: int) -> None:
        size = max(needed, 2 * len(self.first_holder))
        grow = size - len(self.first_holder)
        self.first_holder = np.concatenate([self.first_holder, np.full(grow, -1, dtype=_ID)])
        self.has_extra = np.concatenate([self.has_extra, np.zeros(grow, dtype=bool)])
        self.watched_mask = np.concatenate([self.watched_mask, np.zeros(grow, dtype=bool)])

    # ----------------------------------------------------------------- lookups
    def get_cached_block(self, block_hash: int) -> int | None:
        block = int(self.first_holder[block_hash])
        return None if block < 0 else block

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction 0.0-1.0 of usable blocks held by live requests (cached free count as free)."""
        return 1.0 - self.free_block_queue.num_free_blocks / (self.num_gpu_blocks - 1)

    def _has_repeats(self, block_ids: np.ndarray) -> bool:
        """Whether a block occurs twice in the batch (two fancy-index stores, no sort).

        Only a hash repeated inside one request's chain can do that; vectorised ref
        count updates would count such a block once, so those batches take the loop.
        """
        n = len(block_ids)
        if n > len(self._positions):
            self._positions = np.arange(2 * n, dtype=_ID)
        pos = self._positions[:n]
        self._mark[block_ids] = pos
        return np.count_nonzero(self._mark.take(block_ids) != pos) != 0

    # ----------------------------------------------------------------- state changes
    def get_new_blocks(self, num_blocks: int) -> np.ndarray:
        """Pop ``num_blocks`` from the front, evicting their cached hashes; ref count 1."""
        blocks = self.free_block_queue.popleft_n(num_blocks)
        self.ref_cnt[blocks] = 1  # free blocks have ref count 0
        hashes = self.block_hash.take(blocks)
        cached = hashes >= 0
        num_cached = np.count_nonzero(cached)
        if num_cached == len(blocks):  # the usual case under pressure: no selection
            self._evict_many(blocks, hashes)
        elif num_cached:
            self._evict_many(blocks.compress(cached), hashes.compress(cached))
        return blocks

    def get_new_block(self) -> int:
        """``get_new_blocks(1)[0]`` without arrays (decode-group hot path)."""
        block = self.free_block_queue.popleft()
        block_hash = int(self.block_hash[block])
        if block_hash >= 0:
            self._evict(block, block_hash)
        self.ref_cnt[block] += 1
        return block

    def cache_block(self, block: int, block_hash: int) -> None:
        """Register one full block's hash (``cache_full_blocks`` for a single block)."""
        assert self.block_hash[block] < 0, f"block {block} already cached (BlockPool bug)"
        self.block_hash[block] = block_hash
        self._add_holder(block, block_hash)

    def _add_holder(self, block: int, block_hash: int) -> None:
        if self.first_holder[block_hash] < 0:
            self.first_holder[block_hash] = block
        else:
            self.extra_holders.setdefault(block_hash, []).append(block)
            self.has_extra[block_hash] = True

    def cache_full_blocks(self, request: "SimRequest", blocks: np.ndarray,
                          num_cached_blocks: int, num_full_blocks: int) -> None:
        """Register hashes of ``blocks[num_cached_blocks:num_full_blocks]``."""
        ids = blocks[num_cached_blocks:num_full_blocks]
        hashes = request.hashes_upto(num_full_blocks)[num_cached_blocks:]
        self.cache_blocks(ids, hashes)

    def cache_blocks(self, blocks: np.ndarray, hashes: np.ndarray) -> None:
        """Register ``hashes[i]`` for ``blocks[i]``, in order (as ``cache_block`` each).

        Hashes new to the map are stored in one vectorised pass; a hash already held
        adds a holder, one by one in batch order. Holders of different hashes are
        independent, so splitting the batch changes nothing. A new hash twice in the
        batch (rare: a chain repeating a hash) shows after the store, which kept its
        last block instead of its first; those batches are redone one by one.
        """
        assert not np.count_nonzero(self.block_hash.take(blocks) >= 0), (
            "a block cached twice (BlockPool bug)")
        self.block_hash[blocks] = hashes
        held = self.first_holder.take(hashes) >= 0
        if np.count_nonzero(held):  # an extra holder each, in batch order
            more, ids = blocks.compress(held), hashes.compress(held)
            self.has_extra[ids] = True
            extra = self.extra_holders
            for block, block_hash in zip(more.tolist(), ids.tolist()):
                extra.setdefault(block_hash, []).append(block)
            fresh = ~held
            blocks, hashes = blocks.compress(fresh), hashes.compress(fresh)
        holder = self.first_holder
        holder[hashes] = blocks
        if len(blocks) > 1 and np.count_nonzero(holder.take(hashes) != blocks):
            holder[hashes] = -1
            for block, block_hash in zip(blocks.tolist(), hashes.tolist()):
                self._add_holder(block, block_hash)

    def _evict_many(self, blocks: np.ndarray, hashes: np.ndarray) -> None:
        """Drop the cached hashes of freshly popped ``blocks`` (vectorised when each is
        its hash's only holder, the common case)."""
        shared = self.has_extra.take(hashes)
        if np.count_nonzero(shared):
            keep = ~shared
            self._evict_shared(blocks.compress(shared), hashes.compress(shared))
            blocks, hashes = blocks.compress(keep), hashes.compress(keep)
        if len(blocks):
            self.first_holder[hashes] = -1
            self.block_hash[blocks] = -1
            self.num_evictions += len(blocks)
            if np.count_nonzero(self.watched_mask.take(hashes)):
                self.watch_epoch += 1

    def _evict_shared(self, blocks: np.ndarray, hashes: np.ndarray) -> None:
        """``_evict`` for blocks whose hashes have several holders: the first holder
        passes to the next one registered, else the block leaves the extra list."""
        if len(set(hashes.tolist())) < len(hashes):  # two holders of one hash popped
            for block, block_hash in zip(blocks.tolist(), hashes.tolist()):
                self._evict(block, block_hash)
            return
        # _drop_holder inlined (one Python pass; first holders stored in one call).
        extra = self.extra_holders
        emptied: list[int] = []
        promoted: list[int] = []  # hashes whose first holder passes to the next one
        successors: list[int] = []
        for block, block_hash, head in zip(blocks.tolist(), hashes.tolist(),
                                           self.first_holder[hashes].tolist()):
            holders = extra[block_hash]
            if head == block:
                promoted.append(block_hash)
                successors.append(holders.pop(0))
            else:
                holders.remove(block)
            if not holders:
                del extra[block_hash]
                emptied.append(block_hash)
        if promoted:
            self.first_holder[promoted] = successors
        if emptied:
            self.has_extra[emptied] = False
        self.block_hash[blocks] = -1
        self.num_evictions += len(blocks)

    def _drop_holder(self, block: int, block_hash: int, first: int) -> bool:
        """Take ``block`` out of the holders of a hash with several (``first`` is its
        first holder): the first one passes to the next registered. True when the
        extra list emptied (the caller clears ``has_extra``)."""
        holders = self.extra_holders[block_hash]
        if first == block:
            self.first_holder[block_hash] = holders.pop(0)
        else:
            holders.remove(block)
        if holders:
            return False
        del self.extra_holders[block_hash]
        return True

    def _evict(self, block: int, block_hash: int) -> None:
        """Drop ``block``'s cached hash ``block_hash`` (it is being reallocated)."""
        if not self.has_extra[block_hash]:
            assert self.first_holder[block_hash] == block, (
                f"hash map does not point {block_hash} at block {block} (BlockPool bug)")
            self.first_holder[block_hash] = -1
            if self.watched_mask[block_hash]:
                self.watch_epoch += 1
        elif self._drop_holder(block, block_hash, int(self.first_holder[block_hash])):
            self.has_extra[block_hash] = False
        self.block_hash[block] = -1
        self.num_evictions += 1

    def touch(self, blocks: np.ndarray, refs: np.ndarray | None = None) -> bool:
        """Adopt prefix-cache hits: free ones leave the free queue; ref count + 1.

        ``refs``: ``ref_cnt[blocks]`` if the caller already read it (the admission check
        counts the free hit blocks first), saving a second gather over the prompt.
        Returns whether a block occurred twice (a hash repeated in one chain).
        """
        if not len(blocks):
            return False
        ref = self.ref_cnt
        if self._has_repeats(blocks):
            queue = self.free_block_queue
            for block in blocks.tolist():
                if ref[block] == 0:
                    queue.remove(block)
                ref[block] += 1
            return True
        if refs is None:
            refs = ref.take(blocks)
        free = refs == 0
        if np.count_nonzero(free):
            self.free_block_queue.remove_many(blocks.compress(free))
        ref[blocks] = refs + 1
        return False

    def free_blocks(self, ordered_blocks: np.ndarray, may_repeat: bool = True) -> None:
        """Release blocks in the given order (callers pass a request's blocks tail first).

        ``may_repeat=False``: the caller knows no block occurs twice (a request whose
        prefix hit named distinct blocks), which skips the check.

        Blocks reaching ref count 0 go to the back when hashed (kept longest: FIFO/LRU
        eviction among cached blocks) and to the front when not (nothing to keep, so
        they are reused first, as in vLLM 0.31-0.33).
        """
        blocks = ordered_blocks
        if not len(blocks):
            return
        ref = self.ref_cnt
        if may_repeat and self._has_repeats(blocks):
            zero = []
            for block in blocks.tolist():  # a block reaches 0 at its last occurrence
                ref[block] -= 1
                if ref[block] == 0:
                    zero.append(block)
            released = np.asarray(zero, dtype=_ID)
            if np.count_nonzero(ref[blocks] < 0):
                raise RuntimeError("a block was freed more often than taken (tuner bug)")
            released_seq = released[::-1]
        else:
            # The gathers run over ``seq``, the blocks in sequence order: callers pass a
            # reversed view of a request's buffer, and ``take`` copies a strided index
            # before gathering (ref counts do not depend on the order; the release
            # order is turned back to tail first at the queue).
            seq = blocks[::-1]
            refs = ref.take(seq) - 1  # one gather and one store (no block occurs twice)
            if np.count_nonzero(refs < 0):
                raise RuntimeError("a block was freed more often than taken (tuner bug)")
            ref[seq] = refs
            zero = refs == 0
            num_zero = np.count_nonzero(zero)
            # compress: a selection without boolean indexing's cost; none when all go.
            released_seq = seq if num_zero == len(seq) else seq.compress(zero)
        if len(released_seq):
            hashed = self.block_hash.take(released_seq) >= 0
            num_hashed = np.count_nonzero(hashed)
            queue = self.free_block_queue
            if num_hashed == len(released_seq):
                queue.append_n(released_seq[::-1])
            else:
                queue.append_n(released_seq.compress(hashed)[::-1])
                queue.prepend_n(released_seq.compress(~hashed)[::-1])

    # ----------------------------------------------------------------- checks
    def check_invariants(self) -> None:
        """Walk the pool; raise ``AssertionError`` naming the first broken invariant."""
        free = self.free_block_queue.get_all_free_blocks()
        assert len(free) == self.free_block_queue.num_free_blocks, (
            f"free count {self.free_block_queue.num_free_blocks} != list length {len(free)}")
        free_ids = set(free)
        assert len(free_ids) == len(free), "a block appears twice in the free queue"
        assert NULL_BLOCK not in free_ids, "null block in the free queue"
        holders: dict[int, list[int]] = {
            h: [int(self.first_holder[h])] + self.extra_holders.get(h, [])
            for h in np.flatnonzero(self.first_holder >= 0).tolist()}
        assert self.extra_holders.keys() <= holders.keys(), "extra holders of an unmapped hash"
        assert set(np.flatnonzero(self.has_extra).tolist()) == self.extra_holders.keys(), (
            "has_extra out of sync with extra_holders")
        for block in range(1, self.num_gpu_blocks):
            ref = int(self.ref_cnt[block])
            assert ref >= 0, f"block {block} has a negative ref count"
            assert (ref == 0) == (block in free_ids), (
                f"block {block} (ref {ref}): ref_cnt 0 <=> in free queue violated")
            block_hash = int(self.block_hash[block])
            if block_hash >= 0:
                assert block in holders.get(block_hash, ()), (
                    f"block {block} carries hash {block_hash} the map does not point back from")
        for block_hash, members in holders.items():
            assert len(set(members)) == len(members), f"hash {block_hash} lists a block twice"
            for block in members:
                assert self.block_hash[block] == block_hash, f"map {block_hash} -> {block}"
