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

A hash with several holders keeps them on an intrusive doubly linked list in
registration order (``next_holder``/``prev_holder`` per block, ``first_holder`` and
``last_holder`` per hash id), so registering or evicting a batch of such blocks is a
few array calls as for single holders. Why: the bundled agentic hour registers many
hashes twice (plausibly a session's next turn prefilling the previous turn's output
blocks before that turn has decoded them), and the dict-of-lists this replaced spent
~6.6 % of that replay's samples in Python loops over the extra holders (py-spy; see
docs/performance.md, where ``bench/replay.py --compare`` measures the round's gain).

Dtypes: arrays that hold block ids (the holder links and the hash -> holder map, and the
duplicate check's positions) are int32: a block id is < ``num_gpu_blocks``, which the
constructor bounds below 2**31. Why: a P/D replay alternates two pools of ~400,000 blocks
step by step on one core, and the per-call cost grew with the bytes both keep hot
(docs/disaggregation.md, cost section). Block ids leave the pool and are used as indices
as int64 (``int(...)``, ``_longest_hit``'s hit, ``popleft_n``), because numpy converts
an int32 index array on every gather and scatter (twice a gather's cost, numpy 2.4).
Hash ids (``block_hash``) stay int64; the free queue's stamps are int32
(``tuner.sim._free_queue``, renumbered before they reach 2**31).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from tuner.sim._free_queue import FreeBlockQueue

if TYPE_CHECKING:
    from tuner.sim.request import SimRequest

__all__ = ["BlockPool", "NULL_BLOCK", "WATCH_SLOTS"]

NULL_BLOCK = 0
_ID = np.int64
_LINK = np.int32  # stored block ids: < num_gpu_blocks < 2**31 (checked at construction)
_NO_IDS = np.empty(0, dtype=_ID)
# Watch slots of memoised prefix hits: one bit a slot per hash id. 2 bytes an id (the
# bool mask this replaced took 1): 15 own slots cover the ~16 requests a window of 16
# probes (requests past the 15th share the last slot, whose memos all go stale at one
# of their hashes' eviction, as every memo did with one global epoch).
_WATCH_BITS = np.uint16
WATCH_SLOTS = 16
# Eviction batches up to this many linked blocks find repeated hashes with a Python set.
_SMALL_BATCH = 256


def _grown(values: np.ndarray, size: int, fill: object) -> np.ndarray:
    """``values`` followed by ``fill`` up to ``size`` entries, in a new array written once."""
    out = np.empty(size, dtype=values.dtype)
    n = len(values)
    out[:n] = values
    out[n:] = fill
    return out


def _first_occurrences(values: np.ndarray) -> np.ndarray | None:
    """None when ``values`` are distinct, else a mask of each value's first occurrence.

    Why not ``np.unique(..., return_index=True)``: an eviction batch's linked blocks are
    a few dozen (the agentic hour: ~36 a batch, ~7,000 batches), where ``np.unique``'s
    Python layers and stable sort cost ~10x a set over the list (py-spy: ~1.6 % of the
    window-16 replay). Large batches keep the vectorised sort.
    """
    n = len(values)
    if n <= _SMALL_BATCH:
        listed = values.tolist()
        if len(set(listed)) == n:
            return None
        seen: set = set()
        mask = []
        for value in listed:
            mask.append(value not in seen)
            seen.add(value)
        return np.array(mask, dtype=bool)
    order = values.argsort(kind="stable")
    ordered = values.take(order)
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    if np.count_nonzero(starts) == n:
        return None
    mask = np.zeros(n, dtype=bool)
    mask[order.compress(starts)] = True  # stable sort: a group's first is the earliest
    return mask


class BlockPool:
    """Owns the blocks' ref counts and hashes, the free queue and hash -> block map.

    Invariants (``check_invariants`` walks them): the free queue holds exactly the
    non-null blocks with ``ref_cnt == 0``; every hashed block is a holder of its hash
    and every holder carries that hash: a hash's holders, in registration order, run
    from ``first_holder[h]`` along ``next_holder`` to ``last_holder[h]`` (and back
    along ``prev_holder``); an unhashed block has no links; ``ref_cnt >= 0``.
    """

    __slots__ = ("num_gpu_blocks", "enable_caching", "ref_cnt", "block_hash",
                 "free_block_queue", "first_holder", "last_holder", "next_holder",
                 "prev_holder", "num_hash_ids", "null_block", "num_evictions", "watched",
                 "watch_bits", "slot_epochs", "free_slots", "num_watched_ids", "num_stale_watched",
                 "_mark", "_positions32", "id_capacity_bound", "block_epochs")

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True,
                 num_hash_ids: int = 1 << 16) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks={num_gpu_blocks} must be >= 2 (block 0 is null)")
        if num_gpu_blocks >= 1 << 31:  # block ids are stored as int32 (module doc)
            raise ValueError(f"num_gpu_blocks={num_gpu_blocks} must be < 2**31")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = np.zeros(num_gpu_blocks, dtype=np.int32)
        self.block_hash = np.full(num_gpu_blocks, -1, dtype=_ID)  # hash id, -1: none
        self.free_block_queue = FreeBlockQueue(np.arange(1, num_gpu_blocks, dtype=_ID),
                                               num_gpu_blocks)
        # Hash ids below num_hash_ids are the trace's; synthetic ones are reserved above.
        self.num_hash_ids = num_hash_ids
        # The hash's first holder (block, -1: none), and its latest: int32, block ids
        # being < num_gpu_blocks < 2**31. Indexed by hash id, these are the pool's largest
        # arrays (the agentic hour's 20-minute slice: ~1 million ids, capacity 1.9 million;
        # first_holder alone took 15 MB as int64), and a P/D replay keeps two pools hot in
        # a 32 MB L3. Hits read from here leave as int64 (``_longest_hit``): numpy
        # converts an int32 index array on every gather and scatter, at twice the cost.
        self.first_holder = np.full(max(num_hash_ids, 16), -1, dtype=_LINK)
        self.last_holder = np.full(len(self.first_holder), -1, dtype=_LINK)
        # The holder registered after / before this block with the same hash, -1: none.
        # int32 (block ids < num_gpu_blocks < 2**31): read at every eviction batch, so
        # half the bytes of int64 in the cache; used as indices only on the rare linked
        # path (a hash with several holders), where numpy converts them.
        self.next_holder = np.full(num_gpu_blocks, -1, dtype=_LINK)
        self.prev_holder = np.full(num_gpu_blocks, -1, dtype=_LINK)
        #: Doubling stops here (0: no bound): the id-space owner renumbers the ids before
        #: they pass it (``tuner.replay._stream``), so room past it is never used.
        self.id_capacity_bound = 0
        self.null_block = NULL_BLOCK
        self.num_evictions = 0  # cached hashes dropped by reallocation
        # Waiting requests with a memoised prefix hit (``SimRequest.hit_memo``), each on
        # a watch slot, and per hash id the slots whose memos may cover it (a superset),
        # so an eviction tells in one read which memos may be stale: it bumps those
        # slots' epochs (KVCacheManager.num_hit_blocks). Per slot, not one global epoch:
        # with the window on, one eviction of any watched hash used to send all ~16
        # probed requests to a full recompute, 9 in 10 of them for nothing (the agentic
        # hour: 16,737 recomputes, 15,020 of them giving the memo back unchanged).
        self.watched: set = set()
        self.watch_bits = np.zeros(len(self.first_holder), dtype=_WATCH_BITS)
        self.slot_epochs = [0] * WATCH_SLOTS
        # Per slot, bumped when a watched hash keeps its place in the map but its first
        # holder is evicted (a later holder becomes the first): memos keep their
        # length, the hit blocks kept with them go stale (KVCacheManager._memo_hit).
        self.block_epochs = [0] * WATCH_SLOTS
        # Own slots, the longest free first (a slot's stale bits then likely belong to
        # hashes still cached at the LRU's back); the last slot is shared by overflow.
        self.free_slots = deque(range(WATCH_SLOTS - 1))
        # Ids marked in the bits (with stale ones); 0 means no bit is set anywhere (bits
        # are set only with an increment here, and cleared together with a reset), so
        # evictions skip reading the bits: a replay without probed waiting requests (the
        # agentic hour's P/D replay: 0 of 58,224 evictions) never needs them, and the
        # reads kept up to 7.6 MB of zeros a pool (3.8 million ids) in the cache.
        self.num_watched_ids = 0
        self.num_stale_watched = 0  # ids of unwatched requests still in the bits
        # Scratch for the duplicate check of a block batch (see _has_repeats): int32,
        # it holds positions in one batch (< num_gpu_blocks < 2**31), compared only.
        self._mark = np.zeros(num_gpu_blocks, dtype=np.int32)
        # Positions 0..n-1 for both duplicate checks (_has_repeats on _mark, touch's on
        # ref_cnt), int32 like both arrays: a store of int64 into int32 casts on the way.
        self._positions32 = np.arange(1024, dtype=np.int32)

    # ----------------------------------------------------------------- hash ids
    def reserve_ids(self, count: int) -> int:
        """Reserve ``count`` fresh hash ids (a request's synthetic hashes); the first."""
        base = self.num_hash_ids
        self.num_hash_ids = base + count
        if self.num_hash_ids > len(self.first_holder):
            self._grow_ids(self.num_hash_ids)
        return base

    def _grow_ids(self, needed: int) -> None:
        """At least double the per-hash-id arrays (up to ``id_capacity_bound``, then to
        what is ``needed``), each written once.

        Why not ``concatenate`` with ``np.full``: that writes the new part twice (the
        filler, then the copy) into fresh pages; the agentic hour grows these arrays to
        3.8 million ids and its five growths cost ~170 ms of page faults and copies that
        way (~2.7 % of the replay, measured in the replay with a timer around this call).
        """
        doubled = 2 * len(self.first_holder)
        if self.id_capacity_bound:
            doubled = min(doubled, self.id_capacity_bound)
        size = max(needed, doubled)
        self.first_holder = _grown(self.first_holder, size, -1)
        self.last_holder = _grown(self.last_holder, size, -1)
        self.watch_bits = _grown(self.watch_bits, size, 0)

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
        if n > len(self._positions32):
            self._positions32 = np.arange(2 * n, dtype=np.int32)
        pos = self._positions32[:n]
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
        """Append ``block`` to its hash's holders (the first one when it has none)."""
        tail = int(self.last_holder[block_hash])
        if tail < 0:
            self.first_holder[block_hash] = block
        else:
            self.next_holder[tail] = block
            self.prev_holder[block] = tail
        self.last_holder[block_hash] = block

    def cache_full_blocks(self, request: "SimRequest", blocks: np.ndarray,
                          num_cached_blocks: int, num_full_blocks: int) -> None:
        """Register hashes of ``blocks[num_cached_blocks:num_full_blocks]``."""
        ids = blocks[num_cached_blocks:num_full_blocks]
        hashes = request.hashes_between(num_cached_blocks, num_full_blocks)
        self.cache_blocks(ids, hashes)

    def cache_blocks(self, blocks: np.ndarray, hashes: np.ndarray) -> None:
        """Register ``hashes[i]`` for ``blocks[i]``, in order (as ``cache_block`` each).

        One vectorised pass: each block becomes its hash's last holder, linked after the
        previous last one (or first, for a hash new to the map). Holders of different
        hashes are independent, so the batch order matters only for a hash twice in the
        batch (rare: a chain repeating a hash); the store of ``last_holder`` shows it (it
        kept the hash's last block only), and such batches are redone one by one.
        """
        assert not np.count_nonzero(self.block_hash.take(blocks) >= 0), (
            "a block cached twice (BlockPool bug)")
        if len(blocks) == 1:
            self.cache_block(int(blocks[0]), int(hashes[0]))
            return
        index = blocks  # int64: the per-block arrays' index
        blocks = blocks.astype(_LINK)  # the holder arrays' values: one cast, not four
        last = self.last_holder
        tails = last.take(hashes)
        last[hashes] = blocks
        if np.count_nonzero(last.take(hashes) != blocks):  # a hash twice in the batch
            last[hashes] = tails  # every copy of a hash read the same tail
            for block, block_hash in zip(blocks.tolist(), hashes.tolist()):
                self.cache_block(block, block_hash)
            return
        self.block_hash[index] = hashes
        held = tails >= 0
        num_held = np.count_nonzero(held)
        if not num_held:  # the usual case: every hash new to the map
            self.first_holder[hashes] = blocks
            return
        if num_held < len(blocks):
            fresh = ~held
            self.first_holder[hashes.compress(fresh)] = blocks.compress(fresh)
            tails, blocks, index = tails.compress(held), blocks.compress(held), index.compress(held)
        self.next_holder[tails] = blocks
        self.prev_holder[index] = tails

    def _evict_many(self, blocks: np.ndarray, hashes: np.ndarray) -> None:
        """Drop the cached hashes of freshly popped ``blocks`` (``_evict`` each).

        Vectorised: a block that is its hash's only holder (no links, the usual case)
        only clears the map, and unlinking holders of different hashes is independent.
        Linked blocks of one hash popped together (two turns' copies of a block, freed
        together, are common under pressure) are unlinked one by one, only those:
        the final lists do not depend on the order of removals.
        """
        prev = self.prev_holder.take(blocks)
        nxt = self.next_holder.take(blocks)
        self.block_hash[blocks] = -1
        n = len(blocks)
        self.num_evictions += n
        # One mask and one count decide both cases: a reduction (``max``) costs ~2.3 us of
        # numpy's Python layers on a few dozen ids, a count ~0.6 us, and the decode
        # group's ~28-block batches took two of them (~1.5 % of a window-16 replay).
        lone = (prev & nxt) == -1  # both -1 (every bit set in both): no links
        num_lone = np.count_nonzero(lone)
        if num_lone == n:  # only holders: the hashes leave the map
            self._unmap(hashes)
            return
        if num_lone:
            self._unmap(hashes.compress(lone))
            linked = ~lone
            blocks, hashes = blocks.compress(linked), hashes.compress(linked)
            prev, nxt = prev.compress(linked), nxt.compress(linked)
        while True:  # rounds of distinct hashes: as many as a hash has popped holders
            now = _first_occurrences(hashes)
            if now is None:  # all distinct
                self._unlink_many(blocks, hashes, prev, nxt)
                return
            self._unlink_many(blocks.compress(now), hashes.compress(now))
            later = ~now
            blocks, hashes = blocks.compress(later), hashes.compress(later)
            prev = nxt = None

    def _unlink_many(self, blocks: np.ndarray, hashes: np.ndarray,
                     prev: np.ndarray | None = None, nxt: np.ndarray | None = None) -> None:
        """``_unlink`` for linked blocks of distinct hashes, vectorised (each list loses
        one node, so the removals do not interact). ``prev``/``nxt``: their links, if
        read already."""
        if prev is None or nxt is None:
            prev, nxt = self.prev_holder.take(blocks), self.next_holder.take(blocks)
        head, tail = prev < 0, nxt < 0
        self.first_holder[hashes.compress(head)] = nxt.compress(head)
        self.last_holder[hashes.compress(tail)] = prev.compress(tail)
        emptied = head & tail  # a later round's block may be its hash's last holder
        if self.num_watched_ids and np.count_nonzero(emptied):
            bits = self.watch_bits.take(hashes.compress(emptied))
            if np.count_nonzero(bits):  # a count first: half an OR-reduce's cost
                self._stale_slots(int(np.bitwise_or.reduce(bits)))
        moved = head & ~tail  # the next holder becomes the first
        if self.num_watched_ids and np.count_nonzero(moved):
            bits = self.watch_bits.take(hashes.compress(moved))
            if np.count_nonzero(bits):
                self._moved_slots(int(np.bitwise_or.reduce(bits)))
        inner_next, inner_prev = ~tail, ~head
        self.next_holder[prev.compress(inner_prev)] = nxt.compress(inner_prev)
        self.prev_holder[nxt.compress(inner_next)] = prev.compress(inner_next)
        self.prev_holder[blocks] = -1
        self.next_holder[blocks] = -1

    def _unmap(self, hashes: np.ndarray) -> None:
        """The hashes of evicted only holders leave the map (memos over them go stale)."""
        self.first_holder[hashes] = -1
        self.last_holder[hashes] = -1
        if not self.num_watched_ids:  # no bit set anywhere: nothing to read
            return
        bits = self.watch_bits.take(hashes)
        if np.count_nonzero(bits):  # the usual answer is no: a count is half an OR-reduce
            self._stale_slots(int(np.bitwise_or.reduce(bits)))

    def _stale_slots(self, bits: int) -> None:
        """Watched hashes with these slot bits left the map: those slots' memos are stale."""
        epochs = self.slot_epochs
        while bits:
            low = bits & -bits
            epochs[low.bit_length() - 1] += 1
            bits ^= low

    def _moved_slots(self, bits: int) -> None:
        """Watched hashes with these slot bits have a new first holder: the hit blocks
        those slots' memos keep are stale (their lengths are not)."""
        epochs = self.block_epochs
        while bits:
            low = bits & -bits
            epochs[low.bit_length() - 1] += 1
            bits ^= low

    def _evict(self, block: int, block_hash: int) -> None:
        """Drop ``block``'s cached hash ``block_hash`` (it is being reallocated)."""
        self._unlink(block, block_hash)
        self.block_hash[block] = -1
        self.num_evictions += 1

    def _unlink(self, block: int, block_hash: int) -> None:
        """Take ``block`` out of its hash's holders; the next one registered becomes the
        first, and a hash whose last holder leaves leaves the map."""
        prev = int(self.prev_holder[block])
        nxt = int(self.next_holder[block])
        if prev < 0:
            assert self.first_holder[block_hash] == block, (
                f"hash map does not point {block_hash} at block {block} (BlockPool bug)")
            self.first_holder[block_hash] = nxt
            if self.num_watched_ids and self.watch_bits[block_hash]:
                if nxt < 0:  # left the map
                    self._stale_slots(int(self.watch_bits[block_hash]))
                else:  # a later holder is the first now
                    self._moved_slots(int(self.watch_bits[block_hash]))
        else:
            self.next_holder[prev] = nxt
            self.prev_holder[block] = -1
        if nxt < 0:
            self.last_holder[block_hash] = prev
        else:
            self.prev_holder[nxt] = prev
            self.next_holder[block] = -1

    def touch(self, blocks: np.ndarray, refs: np.ndarray | None = None,
              free: np.ndarray | None = None, num_free: int = -1) -> bool:
        """Adopt prefix-cache hits: free ones leave the free queue; ref count + 1.

        ``refs``: ``ref_cnt[blocks]`` if the caller already read it, and with it ``free``
        (``refs == 0``) and ``num_free`` (its count): the admission check counts the
        free hit blocks first, so the prompt is not gathered and compared twice.
        Returns whether a block occurred twice (a hash repeated in one chain).
        """
        n = len(blocks)
        if not n:
            return False
        ref = self.ref_cnt
        if refs is None:
            refs = ref.take(blocks)
        # The duplicate check (``_has_repeats``) on the ref counts themselves: their
        # lines were just read, so the scatter and gather stay in cache (a scratch array
        # of its own missed it once a block). Every copy of a repeated block read the
        # same count, so the store below, or the restore, is exact either way.
        if n > len(self._positions32):
            self._positions32 = np.arange(2 * n, dtype=np.int32)
        pos = self._positions32[:n]
        ref[blocks] = pos
        if np.count_nonzero(ref.take(blocks) != pos):
            ref[blocks] = refs
            queue = self.free_block_queue
            for block in blocks.tolist():
                if ref[block] == 0:
                    queue.remove(block)
                ref[block] += 1
            return True
        if free is None:
            free = refs == 0
            num_free = np.count_nonzero(free)
        if num_free == len(blocks):  # a finished turn's prefix, all in the queue
            self.free_block_queue.remove_many(blocks)
        elif num_free:
            self.free_block_queue.remove_many(blocks.compress(free))
        ref[blocks] = refs + 1
        return False

    def free_blocks(self, ordered_blocks: np.ndarray, may_repeat: bool = True,
                    num_hashed: int = -1) -> None:
        """Release blocks in the given order (callers pass a request's blocks tail first).

        ``may_repeat=False``: the caller knows no block occurs twice (a request whose
        prefix hit named distinct blocks), which skips the check.

        ``num_hashed``: the caller knows that exactly the first ``num_hashed`` blocks in
        sequence order (the last ones of ``ordered_blocks``) carry a hash, which skips
        gathering ``block_hash`` over the released blocks to tell which end of the queue
        they go to (a request's registered blocks are its leading ``num_cached_blocks``:
        ``KVCacheManager.free``, checked by ``KVCacheManager.check_invariants``). -1:
        unknown, gathered.

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
            refs = ref.take(seq)  # one gather and one store (no block occurs twice)
            if refs.min() <= 0:  # one reduction, no mask
                raise RuntimeError("a block was freed more often than taken (tuner bug)")
            refs -= 1
            ref[seq] = refs
            zero = refs == 0
            num_zero = np.count_nonzero(zero)
            # compress: a selection without boolean indexing's cost; none when all go.
            if num_hashed >= 0:  # hashed = a known prefix of seq: slices, no gather
                queue = self.free_block_queue
                if num_zero == len(seq):
                    queue.append_n(seq[:num_hashed][::-1])
                    queue.prepend_n(seq[num_hashed:][::-1])
                elif num_zero:
                    queue.append_n(seq[:num_hashed].compress(zero[:num_hashed])[::-1])
                    queue.prepend_n(seq[num_hashed:].compress(zero[num_hashed:])[::-1])
                return
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
        holders: dict[int, list[int]] = {}
        for block_hash in np.flatnonzero(self.first_holder >= 0).tolist():
            members, block = [], int(self.first_holder[block_hash])
            while block >= 0 and len(members) < self.num_gpu_blocks:
                assert self.prev_holder[block] == (members[-1] if members else -1), (
                    f"hash {block_hash}: prev link of block {block} broken")
                members.append(block)
                block = int(self.next_holder[block])
            assert self.last_holder[block_hash] == members[-1], (
                f"hash {block_hash}: last holder {self.last_holder[block_hash]} is not "
                f"the end of its list {members[-1]}")
            holders[block_hash] = members
        mapped = self.first_holder >= 0
        assert (mapped == (self.last_holder >= 0)).all(), "first/last holder disagree"
        for block in range(1, self.num_gpu_blocks):
            ref = int(self.ref_cnt[block])
            assert ref >= 0, f"block {block} has a negative ref count"
            assert (ref == 0) == (block in free_ids), (
                f"block {block} (ref {ref}): ref_cnt 0 <=> in free queue violated")
            block_hash = int(self.block_hash[block])
            if block_hash >= 0:
                assert block in holders.get(block_hash, ()), (
                    f"block {block} carries hash {block_hash} the map does not point back from")
            else:
                assert self.next_holder[block] < 0 and self.prev_holder[block] < 0, (
                    f"unhashed block {block} is linked to holders")
        for block_hash, members in holders.items():
            assert len(set(members)) == len(members), f"hash {block_hash} lists a block twice"
            for block in members:
                assert self.block_hash[block] == block_hash, f"map {block_hash} -> {block}"
