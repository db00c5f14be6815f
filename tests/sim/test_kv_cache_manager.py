"""KVCacheManager, from spec §2.1, §4.4 and §5.4 (vLLM 0.33.0 kv_cache_manager.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.sim.kv_cache_manager import KVCacheManager
from tuner.sim.request import RequestStatus, SimRequest


def make_request(rid: str, input_len: int, hashes: list[int], bs: int = 16,
                 status: RequestStatus = RequestStatus.WAITING, max_tokens: int = 4
                 ) -> SimRequest:
    r = SimRequest(request_id=rid, index=0, arrival_s=0.0, num_prompt_tokens=input_len,
                   max_tokens=max_tokens, block_size=bs, prompt_block_hashes=hashes)
    r.status = status
    return r


def cached_pool(num_blocks: int, *prompts: tuple[int, list[int]]) -> KVCacheManager:
    """A pool where each (input_len, hashes) prompt ran and finished (cached, free)."""
    kvm = KVCacheManager(num_gpu_blocks=num_blocks, block_size=16)
    for input_len, hashes in prompts:
        r = make_request("warm0", input_len, hashes)
        assert kvm.allocate_slots(r, input_len)
        kvm.free(r)
    return kvm


@pytest.mark.parametrize("input_len,max_cached", [(48, 32), (50, 48), (16, 0), (17, 16)])
def test_last_token_rule(input_len, max_cached):
    hashes = [1, 2, 3][: input_len // 16]
    kvm = cached_pool(10, (input_len, hashes))
    probe = make_request("p", input_len, hashes)
    blocks, tokens = kvm.get_computed_blocks(probe)
    assert tokens == max_cached
    assert len(blocks) * 16 == tokens
    assert kvm.get_num_cached_tokens(probe) == max_cached


def test_no_hit_when_prefix_caching_is_off():
    kvm = KVCacheManager(num_gpu_blocks=10, block_size=16, enable_caching=False)
    r = make_request("a", 48, [1, 2, 3])
    assert kvm.allocate_slots(r, 48)
    assert all(kvm.block_pool.block_hash[b] == -1 for b in r.blocks)
    kvm.free(r)
    blocks, tokens = kvm.get_computed_blocks(make_request("b", 48, [1, 2, 3]))
    assert len(blocks) == 0 and tokens == 0
    assert kvm.get_num_cached_tokens(make_request("b", 48, [1, 2, 3])) == 0


def test_hit_stops_at_first_missing_block():
    kvm = cached_pool(10, (64, [1, 2, 3, 4]))
    assert kvm.get_num_cached_tokens(make_request("p", 80, [1, 2, 9, 4, 5])) == 32


def test_probe_is_side_effect_free():
    kvm = cached_pool(6, (48, [1, 2, 3]))
    pool = kvm.block_pool
    before = (pool.free_block_queue.get_all_free_blocks(), pool.ref_cnt.tolist(),
              pool.first_holder.tolist(), pool.block_hash.tolist())
    assert kvm.get_num_cached_tokens(make_request("p", 48, [1, 2, 3])) == 32
    after = (pool.free_block_queue.get_all_free_blocks(), pool.ref_cnt.tolist(),
             pool.first_holder.tolist(), pool.block_hash.tolist())
    assert before == after


def test_touched_free_hits_count_as_consumption():
    # 5 blocks (4 usable): warm prompt cached in 3 free blocks. A 48-token request
    # hitting 2 of them needs 1 new block + 2 touched free blocks = 3 <= 4: fits.
    kvm = cached_pool(5, (48, [1, 2, 3]))
    r = make_request("w", 48, [1, 2, 3])
    blocks, hit = kvm.get_computed_blocks(r)
    assert kvm.allocate_slots(r, 48 - hit, hit, blocks, full_sequence_must_fit=True)
    assert kvm.block_pool.get_num_free_blocks() == 1
    # 4 blocks needed by a cold 64-token prompt, only 1 free: refused, nothing changes.
    c = make_request("c", 64, [5, 6, 7, 8])
    assert not kvm.allocate_slots(c, 16, full_sequence_must_fit=True)
    assert c.blocks == [] and kvm.block_pool.get_num_free_blocks() == 1


def test_full_sequence_must_fit_checks_whole_prompt_not_first_chunk():
    kvm = KVCacheManager(num_gpu_blocks=4, block_size=16)  # 3 usable
    r = make_request("a", 64, [1, 2, 3, 4])
    assert not kvm.allocate_slots(r, 16, full_sequence_must_fit=True)
    assert kvm.allocate_slots(r, 16, full_sequence_must_fit=False)
    assert len(r.blocks) == 1


def test_watermark_only_for_waiting_while_something_runs():
    kvm = KVCacheManager(num_gpu_blocks=10, block_size=16, watermark=0.2)  # 2 blocks
    assert kvm.watermark_blocks == 2
    filler = make_request("f", 16 * 6, [], status=RequestStatus.RUNNING)
    assert kvm.allocate_slots(filler, 16 * 6)  # 3 free left
    waiting = make_request("w", 32, [])
    assert not kvm.allocate_slots(waiting, 32, has_scheduled_reqs=True)  # 2 + 2 > 3
    assert kvm.allocate_slots(waiting, 32, has_scheduled_reqs=False)
    kvm.free(waiting)
    running = make_request("r", 32, [], status=RequestStatus.RUNNING)
    assert kvm.allocate_slots(running, 32, has_scheduled_reqs=True)  # no watermark


def test_decode_allocates_a_block_only_at_a_block_boundary():
    kvm = KVCacheManager(num_gpu_blocks=10, block_size=16)
    r = make_request("a", 32, [1, 2], status=RequestStatus.RUNNING, max_tokens=16)
    assert kvm.allocate_slots(r, 32)
    r.num_computed_tokens = 32
    r.append_output_token()  # 33 tokens: the 33rd needs block 3
    assert kvm.allocate_slots(r, 1)
    assert len(r.blocks) == 3
    r.num_computed_tokens = 33
    for _ in range(15):
        r.append_output_token()
        assert kvm.allocate_slots(r, 1)
        r.num_computed_tokens += 1
    assert len(r.blocks) == 3 and r.num_tokens == 48
    # The generated block 3 was registered when it became full (at scheduling time).
    # Synthetic: above every trace hash id, so it never matches another request.
    assert kvm.block_pool.block_hash[r.blocks[2]] == r.block_hashes[2] >= kvm.num_trace_hash_ids
    assert kvm.block_pool.get_cached_block(r.block_hashes[2]) == r.blocks[2]


def test_generated_blocks_take_trace_output_hashes():
    r = SimRequest(request_id="a", index=3, arrival_s=0.0, num_prompt_tokens=20, max_tokens=40,
                   block_size=16, prompt_block_hashes=[5], output_block_hashes=[77])
    r.bind_synthetic(1000)  # the cache reserves ids 1000.. for what the trace lacks
    for _ in range(28):
        r.append_output_token()
    assert r.block_hashes == [5, 77, 1000] and r.synthetic_hash(2) == 1000


def test_missing_prompt_hashes_get_synthetic_ids_unique_per_request():
    kvm = KVCacheManager(num_gpu_blocks=10, block_size=16, num_hash_ids=50)
    a, b = make_request("a", 48, [1]), make_request("b", 48, [1])
    kvm.adopt(a)
    kvm.adopt(b)
    assert a.block_hashes[0] == b.block_hashes[0] == 1
    assert a.block_hashes[1:] == [50, 51] and b.block_hashes[1:][0] >= 50 + a.num_synthetic_ids()
    with pytest.raises(ValueError, match="num_hash_ids"):
        kvm.adopt(make_request("c", 16, [50]))


def test_memoised_hit_shrinks_on_eviction_and_grows_on_registration():
    kvm = cached_pool(6, (48, [1, 2, 3]))  # free queue [4, 5?]: blocks 1-3 cached
    waiter = make_request("w", 64, [1, 2, 3, 4])
    assert kvm.num_hit_blocks(waiter) == 3
    pool = kvm.block_pool
    assert waiter in pool.watched
    bit = 1 << waiter.hit_slot
    assert (pool.watch_bits[[1, 2, 3]] & bit).all() and not pool.watch_bits[4] & bit
    epoch = pool.slot_epochs[waiter.hit_slot]
    # Take blocks until block 2 (hash 2) is reallocated: the memo drops to 1 block.
    taken = []
    while pool.block_hash[2] >= 0:
        taken.extend(pool.get_new_blocks(1).tolist())
    assert pool.slot_epochs[waiter.hit_slot] > epoch  # a covered hash left: memo stale
    assert kvm.num_hit_blocks(waiter) == len(kvm._longest_hit(waiter)) == 1
    assert waiter.hit_memo == 1 and waiter.hit_epoch == pool.slot_epochs[waiter.hit_slot]
    pool.free_blocks(np.asarray(taken))
    # Registering hash 2 again (another request computes it) extends the memo.
    other = make_request("o", 32, [1, 2], status=RequestStatus.RUNNING)
    blocks, hit = kvm.get_computed_blocks(other)
    assert kvm.allocate_slots(other, 32 - hit, hit, blocks)
    assert kvm.num_hit_blocks(waiter) == len(kvm._longest_hit(waiter)) == 2
    kvm.unwatch(waiter)
    assert waiter.hit_memo == -1 and waiter not in pool.watched


def test_memo_stays_exact_through_a_pressured_replay():
    """check_invariants compares every memo with a fresh walk after each step."""
    from sim_helpers import random_trace, replay
    from tuner.sim.settings import CacheSettings, SchedulerSettings

    reqs = random_trace(5, 60, families=2, max_input=200, rate=60.0)
    sim, res = replay(reqs, SchedulerSettings(max_num_batched_tokens=128, max_num_seqs=12,
                                              cache_aware_admission_window=6,
                                              cache_aware_admission_threshold=0.0),
                      CacheSettings(num_gpu_blocks=30))
    assert sim.scheduler.kv_cache_manager.block_pool.num_evictions > 0
    assert not sim.scheduler.kv_cache_manager.block_pool.watched  # all unwatched at the end


@pytest.mark.parametrize("seed", range(12))
def test_memos_stay_exact_per_watch_slot_generated(seed, monkeypatch):
    """Generated pressured replays, windows below and above the 15 own watch slots (the
    rest share the overflow slot; window 2-40), both modes, with the watch bits rebuilt at every
    unwatch or never: check_invariants compares every memo with a fresh walk after each
    step, and every window probe (``num_cached_tokens_of``, which decides valid memos
    inline) is compared with a walk, so a slot whose epoch an eviction of its hashes
    failed to bump (a memo invalidated too little) fails here."""
    import random

    from sim_helpers import random_trace, replay
    import tuner.sim.kv_cache_manager as kv_cache_manager
    from tuner.sim.block_pool import WATCH_SLOTS
    from tuner.sim.settings import CacheSettings, SchedulerSettings

    rng = random.Random(seed)
    if seed % 2:
        monkeypatch.setattr(kv_cache_manager, "REBUILD_STALE_IDS", -(1 << 30))
    batch_probe = kv_cache_manager.KVCacheManager.num_cached_tokens_of
    probes = []

    def checked_probe(kvm, requests):  # the window's inline memo case against a walk
        got = batch_probe(kvm, requests)
        assert got == [len(kvm._longest_hit(r)) * kvm.block_size for r in requests]
        probes.append(len(requests))
        return got

    monkeypatch.setattr(kv_cache_manager.KVCacheManager, "num_cached_tokens_of",
                        checked_probe)
    computed = kv_cache_manager.KVCacheManager.get_computed_blocks
    memo_hits, from_kept = [], []

    def checked_hit(kvm, request):  # an admission's hit from a current memo, or a walk
        pool = kvm.block_pool
        memo_current = (request.hit_memo >= 0 and request.hit_epoch
                        == pool.slot_epochs[request.hit_slot])
        kept = kvm.memo_blocks.get(request)  # the memo's walk's blocks, still current?
        from_kept.append(memo_current and kept is not None and kept[1:] == (
            pool.slot_epochs[request.hit_slot], pool.block_epochs[request.hit_slot]))
        blocks, tokens = computed(kvm, request)
        walk = kvm._longest_hit(request)
        assert blocks.dtype == walk.dtype and blocks.tolist() == walk.tolist()
        assert tokens == len(walk) * kvm.block_size
        memo_hits.append(memo_current)
        return blocks, tokens

    monkeypatch.setattr(kv_cache_manager.KVCacheManager, "get_computed_blocks", checked_hit)
    window = rng.choice([2, 4, 12, 40])
    reqs = random_trace(seed, 90, families=rng.choice([2, 3, 6]), max_input=400, rate=120.0)
    sim, _ = replay(reqs, SchedulerSettings(max_num_batched_tokens=128, max_num_seqs=8,
                                            cache_aware_admission_window=window,
                                            cache_aware_admission_threshold=0.0),
                    CacheSettings(num_gpu_blocks=rng.choice([30, 45, 70])),
                    async_scheduling=bool(seed % 3 == 0))
    pool = sim.scheduler.kv_cache_manager.block_pool
    assert pool.num_evictions > 0 and probes and any(memo_hits) and any(from_kept)
    assert not pool.watched and len(pool.free_slots) == WATCH_SLOTS - 1
    assert not sim.scheduler.kv_cache_manager.memo_blocks  # dropped with the memos


@pytest.mark.parametrize("seed", range(8))
def test_kept_hit_blocks_follow_first_holder_changes_generated(seed, monkeypatch):
    """Block-aligned prompts of a few families: the last-token rule recomputes a cached
    last block, so hashes get second holders, and under pressure first holders of
    watched hashes are evicted while the hash stays (``block_epochs``). Every admission's
    hit (kept blocks or a gather) is compared with a walk, and check_invariants compares
    every current memo's kept blocks with the map after each step."""
    import random

    from sim_helpers import Req, prompt_hashes, replay
    from tuner.sim.settings import CacheSettings, SchedulerSettings

    rng = random.Random(seed)
    reqs, t = [], 0.0
    for i in range(80):
        t += rng.expovariate(150.0)
        input_len = 16 * rng.randint(2, 24)
        reqs.append(Req(f"r{i}", t, input_len, rng.randint(1, 30),
                        prompt_hashes(rng.randrange(3), input_len)))
    computed = KVCacheManager.get_computed_blocks

    def checked_hit(kvm, request):
        blocks, tokens = computed(kvm, request)
        assert blocks.tolist() == kvm._longest_hit(request).tolist()
        return blocks, tokens

    monkeypatch.setattr(KVCacheManager, "get_computed_blocks", checked_hit)
    sim, _ = replay(reqs, SchedulerSettings(max_num_batched_tokens=128, max_num_seqs=8,
                                            cache_aware_admission_window=rng.choice([4, 16]),
                                            cache_aware_admission_threshold=0.0),
                    CacheSettings(num_gpu_blocks=rng.choice([40, 60, 90])),
                    async_scheduling=bool(seed % 2))
    assert any(sim.scheduler.kv_cache_manager.block_pool.block_epochs)


def test_a_new_first_holder_makes_the_kept_hit_blocks_stale():
    """A memo keeps its walk's blocks (``memo_blocks``); evicting the first holder of a
    covered hash that has a second holder keeps the hash in the map (the memo's length
    holds, ``slot_epochs`` stays) but changes its block: ``block_epochs`` moves and the
    admission's hit is gathered again, the second holder in it."""
    kvm = KVCacheManager(num_gpu_blocks=7, block_size=16)
    pool = kvm.block_pool
    first, second = make_request("a", 48, [1, 2, 3]), make_request("b", 48, [1, 2, 3])
    assert kvm.allocate_slots(first, 48) and kvm.allocate_slots(second, 48)  # no hit passed:
    kvm.free(first)  # every hash has two holders, ``first``'s first; its tail block heads
    kvm.free(second)  # the queue (freed tail first), then the rest of the LRU order
    waiter = make_request("w", 64, [1, 2, 3, 4])
    assert kvm.num_hit_blocks(waiter) == 3
    slot = waiter.hit_slot
    kept, epoch, block_epoch = kvm.memo_blocks[waiter]
    assert kept.tolist() == first.block_buf[:3].tolist()
    blocks, _ = kvm.get_computed_blocks(waiter)  # from the kept blocks
    assert blocks.tolist() == kept.tolist() == kvm._longest_hit(waiter).tolist()
    popped = pool.get_new_blocks(1)  # evicts hash 3's first holder
    assert popped.tolist() == [int(first.block_buf[2])]
    assert kvm.num_hit_blocks(waiter) == 3  # the memo holds
    blocks, _ = kvm.get_computed_blocks(waiter)
    assert blocks.tolist() == kvm._longest_hit(waiter).tolist() == [
        int(first.block_buf[0]), int(first.block_buf[1]), int(second.block_buf[2])]
    assert pool.slot_epochs[slot] == epoch and pool.block_epochs[slot] == block_epoch + 1
    pool.free_blocks(popped)  # unhashed now: back to the queue's front
    kvm.check_invariants([waiter])  # which compares kept blocks with the map too
    kvm.unwatch(waiter)
    assert not kvm.memo_blocks


def test_a_memo_survives_the_eviction_of_another_watched_prefix():
    """Per-slot invalidation: evicting a hash only another waiter covers leaves this
    waiter's memo valid (no recompute), and bumps only the other's slot."""
    kvm = cached_pool(8, (48, [1, 2, 3]), (48, [7, 8, 9]))
    pool = kvm.block_pool
    a, b = make_request("a", 64, [1, 2, 3, 4]), make_request("b", 64, [7, 8, 9, 10])
    assert kvm.num_hit_blocks(a) == kvm.num_hit_blocks(b) == 3
    assert a.hit_slot != b.hit_slot
    taken = []
    while pool.get_cached_block(1) is not None:  # the LRU front: a's prefix goes first
        taken.extend(pool.get_new_blocks(1).tolist())
    assert pool.get_cached_block(7) is not None
    assert a.hit_epoch != pool.slot_epochs[a.hit_slot]
    assert b.hit_epoch == pool.slot_epochs[b.hit_slot]
    assert kvm.num_hit_blocks(a) == 0 and kvm.num_hit_blocks(b) == 3


def test_memo_with_a_hash_repeated_in_one_chain_uses_its_first_position():
    kvm = cached_pool(8, (48, [5, 6, 5]))  # a (pathological) chain repeating hash 5
    waiter = make_request("w", 64, [5, 6, 5, 7])
    assert kvm.num_hit_blocks(waiter) == 3
    pool = kvm.block_pool
    taken = []
    while pool.get_cached_block(5) is not None:  # evict every block carrying hash 5
        taken.extend(pool.get_new_blocks(1).tolist())
    assert kvm.num_hit_blocks(waiter) == len(kvm._longest_hit(waiter)) == 0


def test_a_known_hit_length_stores_the_memo_a_walk_would():
    """``num_hit_blocks(request, known)`` (a blocked head's memo from the hit just
    gathered) stores the same memo, epoch and watch bits as the walk."""
    kvm = cached_pool(8, (48, [1, 2, 3]))
    walked, told = make_request("a", 64, [1, 2, 3, 4]), make_request("b", 64, [1, 2, 3, 4])
    assert kvm.num_hit_blocks(walked) == 3
    assert kvm.num_hit_blocks(told, len(kvm._longest_hit(told))) == 3
    assert (told.hit_memo, told.hit_watched) == (walked.hit_memo, walked.hit_watched)
    assert told.hit_epoch == kvm.block_pool.slot_epochs[told.hit_slot]
    bits = kvm.block_pool.watch_bits
    assert all(bits[h] & (1 << told.hit_slot) for h in told.hashes_upto(3).tolist())


@pytest.mark.parametrize("seed", range(30))
def test_hash_at_and_hashes_between_equal_the_laid_out_array_generated(seed):
    """``hash_at`` and ``hashes_between`` (generated ids without a lay-out) give exactly
    the laid-out ``hashes_upto`` entries: every block, every range, prompts with missing
    hashes and partial last blocks, output ids shorter or longer than the output, and
    before and after the lay-out and a renumbering. Fails when a generated id is off by
    one (the synthetic offset) or a traced one is taken past the output."""
    import random

    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 16])
    prompt = rng.randint(1, 6 * bs)
    max_tokens = rng.randint(1, 8 * bs)
    n_full = prompt // bs
    known = [rng.randrange(40) for _ in range(rng.randint(0, n_full))]
    outputs = [40 + rng.randrange(40) for _ in range(rng.randint(0, 10))]

    def fresh() -> SimRequest:
        r = SimRequest(request_id="a", index=0, arrival_s=0.0, num_prompt_tokens=prompt,
                       max_tokens=max_tokens, block_size=bs, prompt_block_hashes=known,
                       output_block_hashes=outputs)
        r.bind_synthetic(1000)
        return r

    n_all = (prompt + max_tokens) // bs
    laid = fresh()
    laid.lay_out_hashes()
    want = laid.hash_array.tolist()
    assert len(want) == n_all
    lazy = fresh()
    for i in range(n_all):
        assert lazy.hash_at(i) == want[i], (i, bs, prompt, max_tokens)
    assert len(lazy.hash_array) == n_full, "hash_at laid the ids out"
    for start in range(n_all + 1):
        for end in range(start, n_all + 1):
            got = fresh().hashes_between(start, end).tolist()
            assert got == want[start:end], (start, end)
            assert laid.hashes_between(start, end).tolist() == want[start:end]
    live = np.unique(np.concatenate([np.asarray(want, dtype=np.int64),
                                     np.arange(1000, 1000 + lazy.num_synthetic_ids())]))
    live = np.concatenate([live, [5000]])  # ids above stay in place after the gap closes
    lazy.renumber_hash_ids(live)
    laid.renumber_hash_ids(live)
    want = laid.hash_array.tolist()
    assert [lazy.hash_at(i) for i in range(n_all)] == want
    assert lazy.hashes_between(n_full, n_all).tolist() == want[n_full:]


@pytest.mark.parametrize("seed", range(40))
def test_free_with_known_hashed_prefix_equals_the_gather_generated(seed):
    """``KVCacheManager.free`` tells the pool the request's hashed blocks (its leading
    ``num_cached_blocks``) instead of the pool gathering ``block_hash``: the pool ends in
    the same state as freeing the same blocks with the gather, over random requests
    sharing prefixes (some blocks stay held by another request), partly registered,
    with and without ``keep``. Fails when a hashed block goes to the front (or an
    unhashed one to the back), checked by handing ``free_blocks`` one block less."""
    import copy
    import random

    rng = random.Random(seed)
    bs = rng.choice([1, 4, 16])
    kvm = KVCacheManager(num_gpu_blocks=rng.randint(40, 200), block_size=bs,
                         num_hash_ids=2000)
    live: list[SimRequest] = []
    for i in range(60):
        if live and rng.random() < 0.4:
            r = live.pop(rng.randrange(len(live)))
            r.num_computed_tokens = rng.randint(0, r.num_tokens)
            keep = rng.choice([0, 0, rng.randint(0, r.num_blocks)])
            twin = copy.deepcopy((kvm, r))
            twin_kvm, twin_r = twin
            kvm.free(r, keep)
            # The same release through the gather (num_hashed unknown), on a copy.
            n = twin_r.num_blocks
            num_full = min(twin_r.num_computed_tokens, twin_r.num_tokens) // bs
            if num_full > twin_r.num_cached_blocks:
                twin_kvm.block_pool.cache_full_blocks(twin_r, twin_r.block_buf,
                                                      twin_r.num_cached_blocks, num_full)
            if n > keep:
                twin_kvm.block_pool.free_blocks(twin_r.block_buf[keep:n][::-1],
                                                may_repeat=twin_r.repeated_blocks)
            assert (kvm.block_pool.free_block_queue.get_all_free_blocks()
                    == twin_kvm.block_pool.free_block_queue.get_all_free_blocks())
            assert kvm.block_pool.ref_cnt.tolist() == twin_kvm.block_pool.ref_cnt.tolist()
            if keep:  # the kept blocks stay held by nobody the check knows: release them
                kvm.block_pool.free_blocks(r.block_buf[:keep][::-1])
            continue
        prompt = rng.randint(1, 12 * bs)
        shared = rng.randint(0, prompt // bs)  # a prefix of one chain: shared, no repeats
        hashes = list(range(shared)) + [100 + 20 * i + j for j in range(prompt // bs - shared)]
        r = make_request(f"r{i}", prompt, hashes, bs)
        hit, tokens = kvm.get_computed_blocks(r)
        if tokens >= prompt:
            continue
        if not kvm.allocate_slots(r, prompt - tokens, tokens, hit):
            continue
        r.num_computed_tokens = prompt
        live.append(r)
        kvm.check_invariants(live)
