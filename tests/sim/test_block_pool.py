"""BlockPool and its free queue, from spec §5 (vLLM 0.33.0 block_pool.py)."""

from __future__ import annotations

import random
from collections import deque

import pytest

from tuner.sim._free_queue import FreeBlockQueue, KVCacheBlock
from tuner.sim.block_pool import BlockPool
from tuner.sim.kv_cache_manager import KVCacheManager
from tuner.sim.request import SimRequest


def ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def make_request(rid: str, input_len: int, hashes: list[int], bs: int = 16) -> SimRequest:
    return SimRequest(request_id=rid, index=0, arrival_s=0.0, num_prompt_tokens=input_len,
                      max_tokens=1, block_size=bs, prompt_block_hashes=hashes)


def test_null_block_is_taken_and_not_counted():
    pool = BlockPool(5)
    assert ids(pool) == [1, 2, 3, 4]
    assert pool.null_block.block_id == 0
    assert pool.get_num_free_blocks() == 4
    assert pool.get_usage() == 0.0
    pool.get_new_blocks(1)
    assert pool.get_usage() == pytest.approx(0.25)


def test_free_queue_after_one_48_token_request_is_4_3_2_1():
    kvm = KVCacheManager(num_gpu_blocks=5, block_size=16)
    req = make_request("a", 48, [11, 12, 13])
    assert kvm.allocate_slots(req, 48)
    assert [b.block_id for b in req.blocks] == [1, 2, 3]
    assert [b.block_hash for b in req.blocks] == [11, 12, 13]  # hashed at scheduling time
    kvm.free(req)
    pool = kvm.block_pool
    assert ids(pool) == [4, 3, 2, 1]
    assert [pool.blocks[i].block_hash for i in (1, 2, 3)] == [11, 12, 13]
    assert pool.get_usage() == 0.0  # cached free blocks count as free
    pool.check_invariants()


def test_allocation_pops_front_and_evicts_its_hash():
    kvm = KVCacheManager(num_gpu_blocks=5, block_size=16)
    req = make_request("a", 48, [11, 12, 13])
    assert kvm.allocate_slots(req, 48)
    kvm.free(req)
    pool = kvm.block_pool
    blocks = pool.get_new_blocks(2)
    assert [b.block_id for b in blocks] == [4, 3]
    assert blocks[1].block_hash is None  # block 3 (hash 13) evicted on reuse
    assert pool.get_cached_block(13) is None
    assert pool.get_cached_block(12) is pool.blocks[2]
    assert pool.num_evictions == 1
    assert ids(pool) == [2, 1]


def test_unhashed_blocks_go_to_the_front_hashed_to_the_back():
    kvm = KVCacheManager(num_gpu_blocks=6, block_size=16)
    req = make_request("a", 40, [21, 22])  # 2 full blocks + a partial third
    assert kvm.allocate_slots(req, 40)
    kvm.free(req)  # freed tail first: 3 (unhashed) -> front; 2, 1 -> back
    assert ids(kvm.block_pool) == [3, 4, 5, 2, 1]


def test_touch_removes_free_hit_from_queue_and_counts_refs():
    kvm = KVCacheManager(num_gpu_blocks=6, block_size=16)
    a = make_request("a", 48, [1, 2, 3])
    kvm.allocate_slots(a, 48)
    b = make_request("b", 48, [1, 2, 9])
    hit, tokens = kvm.get_computed_blocks(b)
    assert tokens == 32
    kvm.allocate_slots(b, 16, 32, hit)  # shared blocks 1, 2: ref 2, still not free
    assert [blk.ref_cnt for blk in kvm.block_pool.blocks[1:4]] == [2, 2, 1]
    kvm.free(a)
    assert ids(kvm.block_pool) == [5, 3]
    kvm.check_invariants([b])


def test_duplicate_hashes_lookup_first_and_survive_eviction_of_one():
    pool = BlockPool(6)
    a = make_request("a", 16, [7])
    b = make_request("b", 16, [7])
    blocks_a = pool.get_new_blocks(1)
    blocks_b = pool.get_new_blocks(1)
    pool.cache_full_blocks(a, blocks_a, 0, 1)
    pool.cache_full_blocks(b, blocks_b, 0, 1)
    assert pool.get_cached_block(7) is blocks_a[0]
    pool.free_blocks(blocks_a)
    pool.check_invariants()
    # Allocate until block 1 is popped again: its hash copy goes, block 2 remains.
    taken = pool.get_new_blocks(pool.get_num_free_blocks())
    assert blocks_a[0] in taken
    assert pool.get_cached_block(7) is blocks_b[0]
    pool.check_invariants()


def test_empty_pool_raises_value_error():
    pool = BlockPool(2)
    pool.get_new_blocks(1)
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)


@pytest.mark.parametrize("seed", range(20))
def test_free_queue_matches_deque_reference(seed):
    """Random popleft/popleft_n/remove/append_n/prepend_n against a slow deque."""
    rng = random.Random(seed)
    blocks = [KVCacheBlock(i) for i in range(30)]
    queue = FreeBlockQueue(blocks)
    ref: deque[int] = deque(range(30))
    out: list[KVCacheBlock] = []
    for _ in range(400):
        op = rng.randrange(5)
        if op == 0 and ref:
            block = queue.popleft()
            assert block.block_id == ref.popleft()
            out.append(block)
        elif op == 1 and ref:
            n = rng.randint(0, len(ref))
            got = [b.block_id for b in queue.popleft_n(n)]
            assert got == [ref.popleft() for _ in range(n)]
            out.extend(blocks[i] for i in got)
        elif op == 2 and ref:
            victim = rng.choice(list(ref))
            queue.remove(blocks[victim])
            ref.remove(victim)
            out.append(blocks[victim])
        elif op == 3 and out:
            rng.shuffle(out)
            k = rng.randint(1, len(out))
            chunk, out = out[:k], out[k:]
            queue.append_n(chunk)
            ref.extend(b.block_id for b in chunk)
        elif op == 4 and out:
            rng.shuffle(out)
            k = rng.randint(1, len(out))
            chunk, out = out[:k], out[k:]
            queue.prepend_n(chunk)
            ref.extendleft(reversed([b.block_id for b in chunk]))
        assert [b.block_id for b in queue.get_all_free_blocks()] == list(ref)
        assert queue.num_free_blocks == len(ref)


def test_check_invariants_catches_corruption():
    pool = BlockPool(4)
    pool.blocks[2].ref_cnt = 1  # claims to be used while sitting in the free queue
    with pytest.raises(AssertionError):
        pool.check_invariants()
