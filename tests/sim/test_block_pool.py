"""BlockPool and its free queue, from spec §5 (vLLM 0.33.0 block_pool.py).

The pool keeps vLLM's state in numpy arrays; ``reference_block_pool.py`` keeps it the
way vLLM does (block objects on a linked free list). The random differential tests at the
end drive both with the same operations and compare everything observable.
"""

from __future__ import annotations

import random
from collections import deque

import numpy as np
import pytest

from reference_block_pool import BlockPool as ReferencePool
from tuner.sim._free_queue import FreeBlockQueue
from tuner.sim.block_pool import BlockPool
from tuner.sim.kv_cache_manager import KVCacheManager
from tuner.sim.request import SimRequest


def ids(pool: BlockPool) -> list[int]:
    return pool.free_block_queue.get_all_free_blocks()


def arr(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def make_request(rid: str, input_len: int, hashes: list[int], bs: int = 16) -> SimRequest:
    return SimRequest(request_id=rid, index=0, arrival_s=0.0, num_prompt_tokens=input_len,
                      max_tokens=1, block_size=bs, prompt_block_hashes=hashes)


def test_null_block_is_taken_and_not_counted():
    pool = BlockPool(5)
    assert ids(pool) == [1, 2, 3, 4]
    assert pool.null_block == 0
    assert pool.get_num_free_blocks() == 4
    assert pool.get_usage() == 0.0
    pool.get_new_blocks(1)
    assert pool.get_usage() == pytest.approx(0.25)


def test_free_queue_after_one_48_token_request_is_4_3_2_1():
    kvm = KVCacheManager(num_gpu_blocks=5, block_size=16)
    req = make_request("a", 48, [11, 12, 13])
    assert kvm.allocate_slots(req, 48)
    assert req.blocks == [1, 2, 3]
    pool = kvm.block_pool
    assert [pool.block_hash[b] for b in req.blocks] == [11, 12, 13]  # hashed at scheduling
    kvm.free(req)
    assert ids(pool) == [4, 3, 2, 1]
    assert [pool.block_hash[i] for i in (1, 2, 3)] == [11, 12, 13]
    assert pool.get_usage() == 0.0  # cached free blocks count as free
    pool.check_invariants()


def test_allocation_pops_front_and_evicts_its_hash():
    kvm = KVCacheManager(num_gpu_blocks=5, block_size=16)
    req = make_request("a", 48, [11, 12, 13])
    assert kvm.allocate_slots(req, 48)
    kvm.free(req)
    pool = kvm.block_pool
    blocks = pool.get_new_blocks(2).tolist()
    assert blocks == [4, 3]
    assert pool.block_hash[3] == -1  # block 3 (hash 13) evicted on reuse
    assert pool.get_cached_block(13) is None
    assert pool.get_cached_block(12) == 2
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
    assert kvm.block_pool.ref_cnt[1:4].tolist() == [2, 2, 1]
    kvm.free(a)
    assert ids(kvm.block_pool) == [5, 3]
    kvm.check_invariants([b])


def test_duplicate_hashes_lookup_first_and_survive_eviction_of_one():
    pool = BlockPool(6)
    a = pool.get_new_block()
    b = pool.get_new_block()
    pool.cache_block(a, 7)
    pool.cache_block(b, 7)
    assert pool.get_cached_block(7) == a
    pool.free_blocks(arr([a]))
    pool.check_invariants()
    # Allocate until block a is popped again: its hash copy goes, block b remains.
    taken = pool.get_new_blocks(pool.get_num_free_blocks()).tolist()
    assert a in taken
    assert pool.get_cached_block(7) == b
    pool.check_invariants()


def test_a_block_held_twice_by_one_request_is_counted_twice():
    """A hash repeated in one chain makes a hit list name a block twice (as in vLLM)."""
    pool = BlockPool(6)
    block = pool.get_new_block()
    pool.cache_block(block, 5)
    pool.free_blocks(arr([block]))
    pool.touch(arr([block, block]))
    assert pool.ref_cnt[block] == 2 and block not in ids(pool)
    pool.free_blocks(arr([block, block]))
    assert pool.ref_cnt[block] == 0 and ids(pool)[-1] == block
    pool.check_invariants()


def test_empty_pool_raises_value_error():
    pool = BlockPool(2)
    pool.get_new_blocks(1)
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    with pytest.raises(ValueError):
        pool.get_new_block()


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("stamp_limit", [None, 30, 47])
def test_free_queue_matches_deque_reference(seed, stamp_limit):
    """Random popleft/popleft_n/remove/append_n/prepend_n against a slow deque; with a
    small ``stamp_limit`` the int32 stamps are renumbered many times on the way."""
    rng = random.Random(seed)
    if stamp_limit is None:
        queue = FreeBlockQueue(list(range(30)), 30)
    else:
        queue = FreeBlockQueue(list(range(30)), 30, stamp_limit=stamp_limit)
    ref: deque[int] = deque(range(30))
    out: list[int] = []
    for _ in range(400):
        op = rng.randrange(6)
        if op == 0 and ref:
            block = queue.popleft()
            assert block == ref.popleft()
            out.append(block)
        elif op == 1 and ref:
            n = rng.randint(0, len(ref))
            got = queue.popleft_n(n).tolist()
            assert got == [ref.popleft() for _ in range(n)]
            out.extend(got)
        elif op == 2 and ref:
            victim = rng.choice(list(ref))
            queue.remove(victim)
            ref.remove(victim)
            out.append(victim)
        elif op == 3 and ref:
            victims = rng.sample(list(ref), rng.randint(1, len(ref)))
            queue.remove_many(arr(victims))
            for victim in victims:
                ref.remove(victim)
            out.extend(victims)
        elif op == 4 and out:
            rng.shuffle(out)
            k = rng.randint(1, len(out))
            chunk, out = out[:k], out[k:]
            queue.append_n(arr(chunk))
            ref.extend(chunk)
        elif op == 5 and out:
            rng.shuffle(out)
            k = rng.randint(1, len(out))
            chunk, out = out[:k], out[k:]
            queue.prepend_n(arr(chunk))
            ref.extendleft(reversed(chunk))
        assert queue.get_all_free_blocks() == list(ref)
        assert queue.num_free_blocks == len(ref)
        assert queue._next_stamp <= (stamp_limit or 2**31 - 1)  # noqa: SLF001
    if stamp_limit is not None:
        assert queue.num_rebases > 0  # the renumbering was exercised


def test_free_queue_stamps_are_int32_and_limit_is_checked():
    """The stamps' dtype is the point (bytes kept hot); a limit below the pool's size
    could not renumber every live entry, so it is refused."""
    queue = FreeBlockQueue(list(range(10)), 10)
    assert queue.stamp_of.dtype == np.int32
    with pytest.raises(ValueError):
        FreeBlockQueue(list(range(10)), 10, stamp_limit=9)


def test_free_queue_compacts_and_stays_bounded():
    """Stale entries from many remove/append cycles are dropped, not accumulated."""
    queue = FreeBlockQueue(list(range(100)), 100)
    for i in range(5000):
        block = i % 100
        queue.remove(block)
        queue.append_n(arr([block]))
    assert queue.get_all_free_blocks() == list(range(100))
    assert len(queue._ids) <= 1024  # noqa: SLF001 - the bound is the point


def test_check_invariants_catches_corruption():
    pool = BlockPool(4)
    pool.ref_cnt[2] = 1  # claims to be used while sitting in the free queue
    with pytest.raises(AssertionError):
        pool.check_invariants()


# ----------------------------------------------------------------------------- differential


def _state(pool: BlockPool, ref: ReferencePool, num_hashes: int) -> None:
    """Assert the array pool and vLLM's object design agree on everything observable."""
    assert pool.free_block_queue.get_all_free_blocks() == [
        b.block_id for b in ref.free_block_queue.get_all_free_blocks()]
    assert pool.get_num_free_blocks() == ref.get_num_free_blocks()
    assert pool.ref_cnt.tolist() == [b.ref_cnt for b in ref.blocks]
    assert pool.block_hash.tolist() == [
        -1 if b.block_hash is None else b.block_hash for b in ref.blocks]
    for h in range(num_hashes):
        got = ref.get_cached_block(h)
        assert pool.get_cached_block(h) == (None if got is None else got.block_id)
    assert pool.num_evictions == ref.num_evictions


@pytest.mark.parametrize("seed", range(40))
def test_pool_matches_vllm_object_design_on_random_operations(seed):
    """Allocate, register (hashes from a small space, so duplicates happen), look up and
    touch hit chains (repeats included), free tail first, single decode allocations."""
    rng = random.Random(seed)
    size, num_hashes = rng.choice([(8, 5), (20, 12), (40, 30)])
    pool, ref = BlockPool(size, num_hash_ids=num_hashes), ReferencePool(size)
    held: list[list[int]] = []
    for _ in range(300):
        op = rng.randrange(6)
        free = pool.get_num_free_blocks()
        if op == 0 and free:
            n = rng.randint(1, min(free, 6))
            got = pool.get_new_blocks(n).tolist()
            ref_blocks = ref.get_new_blocks(n)
            assert got == [b.block_id for b in ref_blocks]
            for block in got[:rng.randint(0, n)]:
                h = rng.randrange(num_hashes)
                pool.cache_block(block, h)
                ref.cache_block(ref.blocks[block], h)
            held.append(got)
        elif op == 1:
            chain = [rng.randrange(num_hashes) for _ in range(rng.randint(1, 6))]
            hit = []
            for h in chain:
                block = pool.get_cached_block(h)
                if block is None:
                    break
                hit.append(block)
            if hit:
                pool.touch(arr(hit))
                ref.touch([ref.blocks[b] for b in hit])
                held.append(hit)
        elif op == 2 and held:
            blocks = held.pop(rng.randrange(len(held)))[::-1]
            pool.free_blocks(arr(blocks))
            ref.free_blocks([ref.blocks[b] for b in blocks])
        elif op == 3 and free:
            block = pool.get_new_block()
            assert block == ref.get_new_block().block_id
            held.append([block])
        elif op == 4 and held:  # register a block some request holds, if not yet hashed
            blocks = rng.choice(held)
            block = rng.choice(blocks)
            if pool.block_hash[block] < 0:
                h = rng.randrange(num_hashes)
                pool.cache_block(block, h)
                ref.cache_block(ref.blocks[block], h)
        elif op == 5 and held:  # one batched registration == cache_block one by one
            unhashed = sorted({b for blocks in held for b in blocks
                               if pool.block_hash[b] < 0})
            batch = rng.sample(unhashed, rng.randint(0, min(4, len(unhashed))))
            hashes = [rng.randrange(num_hashes) for _ in batch]
            pool.cache_blocks(arr(batch), arr(hashes))
            for block, h in zip(batch, hashes):
                ref.cache_block(ref.blocks[block], h)
        _state(pool, ref, num_hashes)
        pool.check_invariants()


# ----------------------------------------------------------------------------- holder lists


def _pool_state(pool: BlockPool) -> tuple:
    return (pool.free_block_queue.get_all_free_blocks(), pool.ref_cnt.tolist(),
            pool.block_hash.tolist(), pool.first_holder.tolist(), pool.last_holder.tolist(),
            pool.next_holder.tolist(), pool.prev_holder.tolist(), pool.num_evictions)


def _crowded_pool(rng: random.Random, size: int, num_hashes: int) -> BlockPool:
    """A pool whose free blocks carry hashes from a tiny space (many holders a hash),
    freed in random order so holders of one hash sit anywhere in the queue."""
    pool = BlockPool(size, num_hash_ids=num_hashes)
    blocks = pool.get_new_blocks(size - 1).tolist()
    for block in blocks[:rng.randint(0, len(blocks))]:
        pool.cache_block(block, rng.randrange(num_hashes))
    pool.watch_bits[:] = [rng.choice([0, 0, 1, 2, 5, 1 << 15]) for _ in range(len(pool.watch_bits))]
    rng.shuffle(blocks)
    while blocks:
        k = rng.randint(1, len(blocks))
        pool.free_blocks(arr(blocks[:k]))
        blocks = blocks[k:]
    return pool


@pytest.mark.parametrize("seed", range(60))
def test_batched_holder_updates_equal_one_by_one(seed):
    """Registering and evicting a batch of blocks whose hashes have several holders
    (the vectorised linked-list updates) leaves exactly the state that doing it block by
    block leaves: allocation (``get_new_blocks`` vs ``get_new_block``) and registration
    (``cache_blocks`` vs ``cache_block``), repeated hashes in one batch included."""
    import copy

    rng = random.Random(seed)
    size, num_hashes = rng.choice([(12, 2), (24, 3), (40, 6), (64, 40)])
    batched = _crowded_pool(rng, size, num_hashes)
    single = copy.deepcopy(batched)
    for _ in range(8):
        n = rng.randint(1, batched.get_num_free_blocks())
        epochs = list(batched.slot_epochs), list(single.slot_epochs)
        got = batched.get_new_blocks(n).tolist()
        assert got == [single.get_new_block() for _ in range(n)]
        assert _pool_state(batched) == _pool_state(single)
        # Memos only ask whether their slot's epoch moved (a batch bumps it once, not
        # per block): the same slots must move, exactly those of the evicted hashes.
        moved = [a != b for a, b in zip(batched.slot_epochs, epochs[0])]
        assert moved == [a != b for a, b in zip(single.slot_epochs, epochs[1])]
        batched.check_invariants()
        chosen = rng.sample(got, rng.randint(0, n))
        hashes = [rng.randrange(num_hashes) for _ in chosen]
        if chosen:
            batched.cache_blocks(arr(chosen), arr(hashes))
        for block, h in zip(chosen, hashes):
            single.cache_block(block, h)
        assert _pool_state(batched) == _pool_state(single)
        order = got[::-1]
        rng.shuffle(order)
        batched.free_blocks(arr(order))
        single.free_blocks(arr(order))
        assert _pool_state(batched) == _pool_state(single)
    batched.check_invariants()


def test_lookup_follows_registration_order_when_holders_leave():
    """Three holders of one hash: evicting the first promotes the second; evicting a
    middle one leaves the order of the rest (vLLM's first-registered-still-cached)."""
    pool = BlockPool(6, num_hash_ids=4)
    assert pool.get_new_blocks(5).tolist() == [1, 2, 3, 4, 5]
    pool.cache_blocks(arr([2, 4, 5]), arr([3, 3, 3]))
    assert pool.get_cached_block(3) == 2
    pool.free_blocks(arr([4]))  # 4 alone at the back of the queue
    pool.free_blocks(arr([1, 3]))  # unhashed: to the front
    pool.free_blocks(arr([2]))
    assert ids(pool) == [1, 3, 4, 2]
    assert pool.get_new_blocks(3).tolist() == [1, 3, 4]  # evicts holder 4 (the middle)
    assert pool.get_cached_block(3) == 2
    pool.check_invariants()
    assert pool.get_new_block() == 2  # the first holder: 5 takes over
    assert pool.get_cached_block(3) == 5
    pool.check_invariants()


def test_first_occurrences_matches_unique_small_and_large():
    """The eviction rounds' repeated-hash finder (a set for small batches, a stable sort
    for large ones) marks exactly ``np.unique``'s first occurrences, None when distinct."""
    import numpy as np

    from tuner.sim.block_pool import _SMALL_BATCH, _first_occurrences

    rng = np.random.default_rng(7)
    for n in (1, 2, 9, _SMALL_BATCH, _SMALL_BATCH + 1, 3000):
        for spread in (n // 3 + 1, 10 * n):
            values = rng.integers(0, spread, n).astype(np.int64)
            _, first = np.unique(values, return_index=True)
            mask = _first_occurrences(values)
            if len(first) == n:
                assert mask is None
            else:
                expected = np.zeros(n, dtype=bool)
                expected[first] = True
                assert mask is not None and mask.tolist() == expected.tolist()
