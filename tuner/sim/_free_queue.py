"""``KVCacheBlock`` and the free-block queue: an intrusive doubly linked list.

Mirrors ``FreeKVCacheBlockQueue`` / ``KVCacheBlock`` in ``vllm/v1/core/kv_cache_utils.py``
@ 0.33.0. Why not a ``deque``: touching a prefix-cache hit must remove a block from the
*middle* of the queue in O(1); rewiring two pointers on the block itself does that
without allocating a Python object per operation. Fake head/tail sentinels remove the
empty-list branches; they are never popped.

Order = eviction order: the front is allocated (and its cached hash evicted) first.
``BlockPool.free_blocks`` decides which end a freed block goes to; this class only
keeps the list. ``tests/sim/test_block_pool.py`` checks it against a slow ``deque``
reference on random operation sequences.
"""

from __future__ import annotations


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
