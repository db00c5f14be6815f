"""The twin's previous block pool, vLLM's own design (test reference only).

``KVCacheBlock`` objects on an intrusive doubly linked free list and a hash -> block map,
as ``vllm/v1/core/block_pool.py`` and ``kv_cache_utils.py`` @ 0.33.0 build them. The twin
now keeps the same state in numpy arrays (``tuner/sim/block_pool.py``);
``test_block_pool.py`` drives both with the same random operations and compares every
observable: free-queue order, reference counts, each block's hash and every lookup.
"""

from __future__ import annotations

from typing import Iterable


class KVCacheBlock:
    """One KV-cache block (mutable live state; only ``BlockPool`` changes it)."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id  # 0 .. num_gpu_blocks - 1 (0 is the null block); -1 sentinel
        self.ref_cnt = 0  # requests holding the block; 0 <=> in the free queue
        self.block_hash: int | None = None  # chained hash once the block is full and cached
        # Free-list neighbours; only FreeBlockQueue touches these two.
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:  # neighbour ids only, so it cannot recurse
        prev_id = self.prev_free.block_id if self.prev_free else None
        next_id = self.next_free.block_id if self.next_free else None
        return (f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={self.block_hash}, "
                f"prev={prev_id}, next={next_id})")


class FreeBlockQueue:
    """Free blocks in eviction order (front = next to allocate / evict)."""

    __slots__ = ("num_free_blocks", "head", "tail")

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.head = KVCacheBlock(-1)
        self.tail = KVCacheBlock(-1)
        prev = self.head
        for block in blocks:
            prev.next_free = block
            block.prev_free = prev
            prev = block
        prev.next_free = self.tail
        self.tail.prev_free = prev

    def popleft(self) -> KVCacheBlock:
        block = self.head.next_free
        if block is self.tail or block is None:
            raise ValueError("No free blocks available")
        nxt = block.next_free
        self.head.next_free = nxt
        nxt.prev_free = self.head  # type: ignore[union-attr]
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Take ``n`` blocks from the front; the caller checked ``num_free_blocks``."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot take {n} blocks, only {self.num_free_blocks} free")
        out = []
        block = self.head.next_free
        for _ in range(n):
            out.append(block)
            nxt = block.next_free  # type: ignore[union-attr]
            block.prev_free = block.next_free = None  # type: ignore[union-attr]
            block = nxt
        self.head.next_free = block
        block.prev_free = self.head  # type: ignore[union-attr]
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise RuntimeError(f"remove() of a block not in the free queue: {block!r} (tuner bug)")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put ``blocks`` at the back, in the given order (kept longest)."""
        if not blocks:
            return
        last = self.tail.prev_free
        for block in blocks:
            last.next_free = block  # type: ignore[union-attr]
            block.prev_free = last
            last = block
        last.next_free = self.tail
        self.tail.prev_free = last
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put ``blocks`` at the front, keeping their order (reused first)."""
        if not blocks:
            return
        first = self.head.next_free
        prev = self.head
        for block in blocks:
            block.prev_free = prev
            prev.next_free = block
            prev = block
        prev.next_free = first
        first.prev_free = prev  # type: ignore[union-attr]
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """All free blocks front to back (for tests and invariant checks; O(n))."""
        out = []
        block = self.head.next_free
        while block is not self.tail and block is not None:
            out.append(block)
            block = block.next_free
        return out


class BlockPool:
    """Owns all ``KVCacheBlock`` objects, the free queue and hash -> block map.

    Invariants (``check_invariants`` walks them): the free queue holds exactly the
    non-null blocks with ``ref_cnt == 0``; ``num_free_blocks`` equals its length; every
    hashed block is in the map under its hash and every map entry points at a block
    carrying that hash; ``ref_cnt >= 0``.
    """

    __slots__ = ("num_gpu_blocks", "enable_caching", "blocks", "free_block_queue",
                 "cached_block_hash_to_block", "null_block", "num_evictions", "watched",
                 "watched_hashes", "num_stale_watched")

    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks={num_gpu_blocks} must be >= 2 (block 0 is null)")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeBlockQueue(self.blocks)
        # hash -> block, or -> {block_id: block} when several blocks carry the hash
        # (a plain block in the common case saves a dict per entry, as in vLLM).
        self.cached_block_hash_to_block: dict[int, KVCacheBlock | dict[int, KVCacheBlock]] = {}
        self.null_block = self.free_block_queue.popleft()
        self.num_evictions = 0  # cached hashes dropped by reallocation
        # Waiting requests whose memoised prefix hit (``SimRequest.hit_memo``) must
        # shrink when one of their hashes leaves the map (KVCacheManager.num_hit_blocks),
        # and a superset of their hashes, so that an eviction costs one set lookup.
        self.watched: set = set()
        self.watched_hashes: set[int] = set()
        self.num_stale_watched = 0  # hashes of unwatched requests still in the superset

    # ----------------------------------------------------------------- lookups
    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        entry = self.cached_block_hash_to_block.get(block_hash)
        if entry is None or entry.__class__ is KVCacheBlock:
            return entry  # type: ignore[return-value]
        return next(iter(entry.values()))  # type: ignore[union-attr]

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction 0.0-1.0 of usable blocks held by live requests (cached free count as free)."""
        return 1.0 - self.free_block_queue.num_free_blocks / (self.num_gpu_blocks - 1)

    # ----------------------------------------------------------------- state changes
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the front, evicting their cached hashes; ref count 1.

        One pass unlinks, evicts and counts each block (``popleft_n`` plus a second
        loop would walk them twice; a prefill takes hundreds of blocks at once).
        """
        queue = self.free_block_queue
        if num_blocks > queue.num_free_blocks:
            raise ValueError(f"cannot take {num_blocks} blocks, only "
                             f"{queue.num_free_blocks} free")
        table = self.cached_block_hash_to_block
        out = []
        block = queue.head.next_free
        for _ in range(num_blocks):
            nxt = block.next_free  # type: ignore[union-attr]
            block.prev_free = block.next_free = None  # type: ignore[union-attr]
            block_hash = block.block_hash  # type: ignore[union-attr]
            if block_hash is not None:
                if table.get(block_hash) is block:  # the common case: sole holder
                    del table[block_hash]
                    block.block_hash = None  # type: ignore[union-attr]
                    self.num_evictions += 1
                    if block_hash in self.watched_hashes:
                        self._hash_gone(block_hash)
                else:
                    self._evict(block)  # type: ignore[arg-type]
            block.ref_cnt += 1  # type: ignore[union-attr]
            out.append(block)
            block = nxt
        queue.head.next_free = block
        block.prev_free = queue.head  # type: ignore[union-attr]
        queue.num_free_blocks -= num_blocks
        return out  # type: ignore[return-value]

    def get_new_block(self) -> KVCacheBlock:
        """``get_new_blocks(1)[0]`` without the list (decode-group hot path)."""
        block = self.free_block_queue.popleft()
        if block.block_hash is not None:
            self._evict(block)
        block.ref_cnt += 1
        return block

    def cache_block(self, block: KVCacheBlock, block_hash: int) -> None:
        """Register one full block's hash (``cache_full_blocks`` for a single block)."""
        assert block.block_hash is None, f"{block!r} already cached (BlockPool bug)"
        block.block_hash = block_hash
        table = self.cached_block_hash_to_block
        entry = table.get(block_hash)
        if entry is None:
            table[block_hash] = block
        elif entry.__class__ is KVCacheBlock:
            table[block_hash] = {entry.block_id: entry, block.block_id: block}  # type: ignore[union-attr]
        else:
            entry[block.block_id] = block  # type: ignore[index]

    def _evict(self, block: KVCacheBlock) -> None:
        block_hash = block.block_hash
        table = self.cached_block_hash_to_block
        entry = table[block_hash]  # type: ignore[index]
        if entry.__class__ is KVCacheBlock:
            assert entry is block, f"hash map points {block_hash} at another block (BlockPool bug)"
            del table[block_hash]  # type: ignore[arg-type]
            if block_hash in self.watched_hashes:
                self._hash_gone(block_hash)  # type: ignore[arg-type]
        else:
            del entry[block.block_id]  # type: ignore[union-attr]
            if len(entry) == 1:  # type: ignore[arg-type]
                table[block_hash] = next(iter(entry.values()))  # type: ignore[union-attr,index]
        block.block_hash = None
        self.num_evictions += 1

    def _hash_gone(self, block_hash: int) -> None:
        """A watched hash left the map: shrink the memoised hits that reached past it."""
        for request in self.watched:
            index = request.hit_index.get(block_hash)
            if index is not None and request.hit_memo > index:
                request.hit_memo = index

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Adopt prefix-cache hits: free ones leave the free queue; ref count + 1.

        ``FreeBlockQueue.remove`` is inlined: an admission touches every hit block
        (thousands for an agentic prompt) and the call overhead dominated.
        """
        queue = self.free_block_queue
        removed = 0
        for block in blocks:
            if block.ref_cnt == 0:
                prev, nxt = block.prev_free, block.next_free
                prev.next_free = nxt  # type: ignore[union-attr]
                nxt.prev_free = prev  # type: ignore[union-attr]
                block.prev_free = block.next_free = None
                removed += 1
            block.ref_cnt += 1
        queue.num_free_blocks -= removed

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Release blocks in the given order (callers pass a request's blocks tail first).

        Blocks reaching ref count 0 go to the back when hashed (kept longest: FIFO/LRU
        eviction among cached blocks) and to the front when not (nothing to keep, so
        they are reused first, as in vLLM 0.31-0.33). The back is linked in the same
        pass (``append_n`` inlined); unhashed blocks are few and prepended after.
        """
        queue = self.free_block_queue
        to_front: list[KVCacheBlock] = []
        last = queue.tail.prev_free
        appended = 0
        for block in ordered_blocks:
            ref = block.ref_cnt - 1
            block.ref_cnt = ref
            if ref == 0:
                if block.block_hash is not None:
                    last.next_free = block  # type: ignore[union-attr]
                    block.prev_free = last
                    last = block
                    appended += 1
                else:
                    to_front.append(block)
            elif ref < 0:
                raise RuntimeError(f"{block!r} freed more often than taken (tuner bug)")
        last.next_free = queue.tail  # type: ignore[union-attr]
        queue.tail.prev_free = last
        queue.num_free_blocks += appended
        queue.prepend_n(to_front)

    # ----------------------------------------------------------------- checks
    def check_invariants(self) -> None:
        """Walk the pool; raise ``AssertionError`` naming the first broken invariant."""
        free = self.free_block_queue.get_all_free_blocks()
        assert len(free) == self.free_block_queue.num_free_blocks, (
            f"free count {self.free_block_queue.num_free_blocks} != list length {len(free)}")
        free_ids = {b.block_id for b in free}
        assert len(free_ids) == len(free), "a block appears twice in the free queue"
        assert 0 not in free_ids, "null block in the free queue"
        for block in self.blocks[1:]:
            assert block.ref_cnt >= 0, f"{block!r} has a negative ref count"
            assert (block.ref_cnt == 0) == (block.block_id in free_ids), (
                f"{block!r}: ref_cnt 0 <=> in free queue violated")
            if block.block_hash is not None:
                entry = self.cached_block_hash_to_block.get(block.block_hash)
                ok = entry is block or (isinstance(entry, dict)
                                        and entry.get(block.block_id) is block)
                assert ok, f"{block!r} carries a hash the map does not point back from"
        for block_hash, entry in self.cached_block_hash_to_block.items():
            members = [entry] if isinstance(entry, KVCacheBlock) else list(entry.values())
            assert members, f"empty map entry for {block_hash}"
            for block in members:
                assert block.block_hash == block_hash, f"map {block_hash} -> {block!r}"
