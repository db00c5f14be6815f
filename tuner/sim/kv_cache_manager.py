"""``KVCacheManager``: turns "this request needs N more tokens" into blocks.

Mirrors ``vllm/v1/core/kv_cache_manager.py`` and the full-attention path of
``single_type_kv_cache_manager.py`` @ 0.33.0 (one KV-cache group, no sliding window,
no connector; speculative decoding's lookahead slots via ``num_lookahead_tokens``), plus PR #54625's side-effect-free probe
``get_num_cached_tokens``.

Token ranges of ``allocate_slots`` (vLLM's map, without the connector part)::

    | < comp > | < new_comp > | < new > |
               |   adopted   |  to be computed   |
               |   < to be allocated (new blocks) >|
    comp = request.num_computed_tokens, new_comp = prefix hit (whole blocks),
    new = tokens scheduled this step
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tuner.sim._step_rules import blocks_needed
from tuner.sim.block_pool import WATCH_SLOTS, BlockPool
from tuner.sim.request import RequestStatus

if TYPE_CHECKING:
    from tuner.sim.request import SimRequest

_NO_BLOCKS = np.empty(0, dtype=np.int64)
_NO_HOLDERS = np.empty(0, dtype=np.int32)
# Stale ids (of unwatched requests) the pool's watch bits may hold, on top of 2/3 of the
# marked ones, before ``unwatch`` rebuilds them from the watched requests: stale bits
# only cost spurious recomputes, a rebuild clears the whole id space (tests lower it).
REBUILD_STALE_IDS = 100_000


class KVCacheManager:
    """Per-request block lists on top of a ``BlockPool``; the scheduler's only cache API."""

    __slots__ = ("block_pool", "block_size", "enable_caching", "max_model_len",
                 "watermark_blocks", "num_trace_hash_ids", "register_on_free",
                 "num_lookahead_tokens", "memo_blocks")

    def __init__(self, *, num_gpu_blocks: int, block_size: int, enable_caching: bool = True,
                 max_model_len: int = 1 << 30, watermark: float = 0.0,
                 num_hash_ids: int = 1 << 16) -> None:
        """``num_hash_ids``: requests' hashes are ids below it (``tuner.sim.hash_ids``);
        synthetic ids are reserved above it."""
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching, num_hash_ids)
        self.num_trace_hash_ids = num_hash_ids
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        # vLLM: int(watermark * num_gpu_blocks), kept free when admitting while busy.
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        # Sync: free first registers the full blocks the decode group left unregistered.
        # Async: it registers nothing (vLLM's _free_request, scheduler.py:3031-3062): there
        # a full block can be unregistered at free, completed by a token the update just
        # applied, and the group catches up when a member leaves instead.
        self.register_on_free = True
        # Speculative decoding: KV slots reserved past the scheduled tokens (vLLM's
        # num_lookahead_tokens, kv_cache_manager.py:550-553; tuner.sim.spec_decode).
        self.num_lookahead_tokens = 0
        # Per watched request, the hit blocks its memo's last walk gathered (int32, as
        # the map holds them) with the slot's two epochs then (``_memo_hit``).
        self.memo_blocks: dict["SimRequest", tuple[np.ndarray, int, int]] = {}

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    # ----------------------------------------------------------------- prefix lookups
    def adopt(self, request: "SimRequest") -> None:
        """First contact: reserve the request's synthetic hash ids (see ``SimRequest``).

        The scheduler calls it on arrival; the cache's entry points call it for requests
        they have not seen, so the manager can be driven directly (tests).
        """
        if request.synthetic_base >= 0:
            return
        known = request.hash_array
        if len(known) and int(known.max()) >= self.num_trace_hash_ids:
            raise ValueError(f"{request!r}: hash id {int(known.max())} >= num_hash_ids "
                             f"{self.num_trace_hash_ids} (intern the hashes first)")
        request.bind_synthetic(self.block_pool.reserve_ids(request.num_synthetic_ids()))

    def _max_hit_blocks(self, request: "SimRequest") -> int:
        """The most blocks a hit can cover. Last-token rule: cap at num_tokens - 1 so a
        fully cached prompt still runs its last token; hits are whole blocks, so a
        block-aligned prompt recomputes its whole last block (48 tokens -> <= 32 cached;
        50 -> <= 48)."""
        return min((request.num_tokens - 1) // self.block_size, request.num_hashes)

    def _longest_hit(self, request: "SimRequest") -> np.ndarray:
        max_blocks = self._max_hit_blocks(request)
        if max_blocks <= 0:
            return _NO_BLOCKS
        # One gather over the prompt's hash ids: agentic prompts have thousands of
        # blocks and this runs at every admission.
        found = self.block_pool.first_holder.take(request.hashes_upto(max_blocks))
        missing = found < 0
        first = int(missing.argmax())  # stops at the first miss; 0 when none
        # int64 out (the pool stores int32 holders): the hit indexes the pool's arrays
        # several times (touch), and numpy converts an int32 index at each use.
        return (found[:first] if missing[first] else found).astype(np.int64)

    def _hit_length(self, request: "SimRequest") -> int:
        """``len(_longest_hit(request))`` without building the hit: a memo's recompute
        needs only the length, and the int64 copy of a ~3,000-block hit was 15-30 % of
        the call (a microbenchmark; py-spy in the agentic hour)."""
        return self._walk(request)[0]

    def _walk(self, request: "SimRequest") -> tuple[int, np.ndarray]:
        """The hit's length and its blocks as the map holds them (int32: no copy)."""
        max_blocks = self._max_hit_blocks(request)
        if max_blocks <= 0:
            return 0, _NO_HOLDERS
        found = self.block_pool.first_holder.take(request.hashes_upto(max_blocks))
        missing = found < 0
        first = int(missing.argmax())  # stops at the first miss; 0 when none
        return (first, found[:first]) if missing[first] else (max_blocks, found)

    def num_hit_blocks(self, request: "SimRequest", known: int = -1,
                       known_blocks: np.ndarray | None = None) -> int:
        """Length in blocks of the longest cached prefix, memoised across steps.

        Same value as ``len(_longest_hit(request))`` (check_invariants compares them).
        Why: a waiting request is probed every step (the blocked head, PR #54625's window),
        for thousands of steps under pressure, and an agentic prompt has thousands of
        blocks. The memo ``hit_memo`` holds while no hash it covers left the map: the
        request takes a watch slot (``hit_slot``), the pool sets the slot's bit on the
        covered hash ids in ``watch_bits`` and bumps the slot's epoch when it evicts one
        of them, so a memo from its slot's current epoch only needs extending past its
        end (new registrations: usually one array read); an older one is recomputed
        with one gather. Per slot, so an eviction under another request's prefix leaves
        this memo alone. No per-request index is kept (building one per watched prompt
        cost more than the recomputes it saved).

        ``known``: the current hit length when the caller just computed it with the pool
        unchanged since (a head whose allocation failed after ``get_computed_blocks``),
        which saves the second gather over its prompt; ``known_blocks``: that hit.

        A walk's blocks are kept with the memo (``memo_blocks``), so that the admission
        of a request with a current memo takes its hit from them (``_memo_hit``).
        """
        if request.synthetic_base < 0:
            self.adopt(request)
        pool = self.block_pool
        if request.hit_memo < 0:
            pool.watched.add(request)
            free = pool.free_slots
            request.hit_slot = free.popleft() if free else WATCH_SLOTS - 1
        slot = request.hit_slot
        if known >= 0:
            length = known
            if known_blocks is None:
                self.memo_blocks.pop(request, None)
            else:
                self.memo_blocks[request] = (known_blocks, pool.slot_epochs[slot],
                                             pool.block_epochs[slot])
        elif request.hit_memo >= 0 and request.hit_epoch == pool.slot_epochs[slot]:
            length = self._current_hit_blocks(request)  # the memo, extended
        else:
            length, found = self._walk(request)
            self.memo_blocks[request] = (found, pool.slot_epochs[slot], pool.block_epochs[slot])
        request.hit_epoch = pool.slot_epochs[request.hit_slot]
        request.hit_memo = length
        start = request.hit_watched
        if length > start:  # mark the newly covered hash ids
            # A gather and a store, not ``bits[ids] |= bit``, whose read goes through
            # fancy indexing: 29 against 37 wall us a mark in the agentic hour (alternate
            # calls timed in one replay, window 16, load ~12), ~23,000 marks.
            ids = request.hashes_upto(length)[start:]
            bits = pool.watch_bits
            bits[ids] = bits.take(ids) | (1 << request.hit_slot)
            pool.num_watched_ids += length - start
            request.hit_watched = length
        return length

    def _current_hit_blocks(self, request: "SimRequest") -> int:
        """The hit length ``num_hit_blocks`` returns, from the memo where it is valid,
        without storing anything (``check_invariants`` reads it too)."""
        pool = self.block_pool
        length = request.hit_memo
        if length < 0 or request.hit_epoch != pool.slot_epochs[request.hit_slot]:
            return self._hit_length(request)
        max_blocks = self._max_hit_blocks(request)
        if length < max_blocks:
            hashes = request.hashes_upto(max_blocks)
            holder = pool.first_holder
            if holder[hashes[length]] >= 0:
                absent = (holder.take(hashes[length + 1:]) < 0).nonzero()[0]
                length = length + 1 + int(absent[0]) if len(absent) else max_blocks
        return length

    def unwatch(self, request: "SimRequest") -> None:
        """Drop ``request``'s memo (it is admitted). The pool's watched mask is rebuilt
        from the watched requests once stale ids dominate it."""
        if request.hit_memo < 0:
            return
        pool = self.block_pool
        pool.watched.discard(request)
        self.memo_blocks.pop(request, None)
        pool.num_stale_watched += request.hit_watched
        if request.hit_slot < WATCH_SLOTS - 1:  # its stale bits only cost spurious bumps
            pool.free_slots.append(request.hit_slot)
        request.hit_memo = -1
        request.hit_watched = 0
        if pool.num_stale_watched > REBUILD_STALE_IDS + 2 * pool.num_watched_ids // 3:
            pool.watch_bits[:] = 0
            pool.num_watched_ids = 0
            for other in pool.watched:
                pool.watch_bits[other.hashes_upto(other.hit_watched)] |= 1 << other.hit_slot
                pool.num_watched_ids += other.hit_watched
            pool.num_stale_watched = 0

    def get_computed_blocks(self, request: "SimRequest") -> tuple[np.ndarray, int]:
        """Longest cached prefix: (block ids, tokens). Zero when prefix caching is off."""
        if not self.enable_caching:
            return _NO_BLOCKS, 0
        if request.synthetic_base < 0:
            self.adopt(request)
        if request.hit_memo >= 0 and request.hit_epoch == self.block_pool.slot_epochs[
                request.hit_slot]:
            # A current memo (the window or the blocked head probed this request): its
            # extension gives the exact length (check_invariants compares it with the
            # walk), so only the hit itself is gathered, with no search for its end.
            blocks = self._memo_hit(request, self._current_hit_blocks(request))
        else:
            blocks = self._longest_hit(request)
        return blocks, len(blocks) * self.block_size

    def _memo_hit(self, request: "SimRequest", length: int) -> np.ndarray:
        """The hit blocks of a request whose memo is current (its ``length`` blocks).

        From the blocks its memo's walk gathered while neither of its slot's epochs
        moved since: then none of the covered hashes left the map (``slot_epochs``) and
        none changed its first holder (``block_epochs``: the pool bumps them when a
        watched hash's first holder is evicted and a later holder takes its place), so
        the map still gives those blocks; only an extension past them is gathered.
        Why: an admitted agentic prompt's hit is ~3,000 blocks, gathered from the map
        at random (the admission's costliest read after the probe's walk), and the
        window probes nearly every admitted request first. Else gathered as before.
        """
        pool = self.block_pool
        holder = pool.first_holder
        stored = self.memo_blocks.get(request)
        if stored is not None:
            found, epoch, block_epoch = stored
            slot = request.hit_slot
            if (epoch == pool.slot_epochs[slot] and block_epoch == pool.block_epochs[slot]
                    and len(found) <= length):
                if len(found) == length:
                    return found.astype(np.int64)
                rest = holder.take(request.hashes_upto(length)[len(found):])
                return np.concatenate((found, rest)).astype(np.int64)
        return holder.take(request.hashes_upto(length)).astype(np.int64)

    def get_num_cached_tokens(self, request: "SimRequest") -> int:
        """PR #54625 probe: cached prefix tokens, without touch, allocation or stats."""
        if not self.enable_caching:
            return 0
        return self.num_hit_blocks(request) * self.block_size

    def num_cached_tokens_of(self, requests: "list[SimRequest]") -> list[int]:
        """``get_num_cached_tokens`` of each request, the window's probe of a step.

        Why a batch: with the window on, ~16 requests are probed every step under
        pressure (151k probes in the agentic hour), and ~9 in 10 find their memo valid
        and not extendable (the next hash is still not cached). That case is decided
        here inline, with no side effect to skip: ``num_hit_blocks`` would store the
        same memo and epoch and mark nothing (``hit_watched >= hit_memo``). Every other
        case goes through ``num_hit_blocks``.
        """
        if not self.enable_caching:
            return [0] * len(requests)
        pool = self.block_pool
        epochs = pool.slot_epochs
        holder = pool.first_holder
        bs = self.block_size
        out = []
        for request in requests:
            length = request.hit_memo
            if length >= 0 and request.hit_epoch == epochs[request.hit_slot]:
                # Adopted (a memo exists), so num_hashes == num_tokens // bs and the
                # cap of _max_hit_blocks is (num_tokens - 1) // bs.
                hashes = request.hash_array
                if (length >= (request.num_tokens - 1) // bs
                        or (length < len(hashes) and holder[hashes[length]] < 0)):
                    out.append(length * bs)
                    continue
            out.append(self.num_hit_blocks(request) * bs)
        return out

    # ----------------------------------------------------------------- allocation
    def allocate_slots(self, request: "SimRequest", num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: np.ndarray = _NO_BLOCKS, *,
                       full_sequence_must_fit: bool = False,
                       has_scheduled_reqs: bool = True, reserved_blocks: int = 0,
                       delay_cache_blocks: bool = False) -> bool:
        """Give ``request`` slots for ``num_new_tokens`` more tokens; False if it cannot fit.

        KV connector (vLLM's ``reserved_blocks``/``delay_cache_blocks``, used for an
        async load with ``num_new_tokens`` = the external tokens): keep
        ``reserved_blocks`` free for in-flight prefills, and register no hash until the
        load arrives (``cache_blocks`` then).

        Capacity counts new blocks *plus* hit blocks that sit in the free queue
        (touching them consumes free capacity). With ``full_sequence_must_fit``
        (``scheduler_reserve_full_isl``) the whole current sequence must fit first.
        The watermark applies only to WAITING/PREEMPTED requests while something is
        scheduled. On success, hashes of every block that becomes full are registered.
        """
        if num_new_tokens <= 0:
            raise ValueError("num_new_tokens must be greater than 0")
        if request.synthetic_base < 0:
            self.adopt(request)
        bs = self.block_size
        pool = self.block_pool
        held = request.num_blocks
        num_hit = len(new_computed_blocks)
        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(num_local_computed, self.max_model_len)
        watermark = 0
        if has_scheduled_reqs and request.status != RequestStatus.RUNNING:
            watermark = self.watermark_blocks
        free = pool.free_block_queue.num_free_blocks
        need_full = 0
        if full_sequence_must_fit:
            need_full = blocks_needed(min(request.num_tokens, self.max_model_len),
                                      held + num_hit, bs)
        need = blocks_needed(min(total_computed + num_new_tokens + self.num_lookahead_tokens,
                                 self.max_model_len), held + num_hit, bs)
        # Both checks without the evictable hit blocks first: a request that fails
        # anyway skips counting them. ``reserved_blocks`` gates only the blocks taken
        # now, not the full-sequence check (vLLM kv_cache_manager.py:531-587).
        if max(need + reserved_blocks, need_full) + watermark > free:
            return False
        if num_hit:  # hit blocks sitting in the free queue consume free capacity too
            hit_refs = pool.ref_cnt.take(new_computed_blocks)
            hit_free = hit_refs == 0
            num_hit_free = np.count_nonzero(hit_free)
            if max(need + reserved_blocks, need_full) + num_hit_free + watermark > free:
                return False
            if pool.touch(new_computed_blocks, hit_refs, hit_free, num_hit_free):
                request.repeated_blocks = True
            request.extend_blocks(new_computed_blocks)
            request.num_cached_blocks = request.num_blocks
        if need == 1:  # a decode step's new block: the scalar path, no arrays
            request.append_block(pool.get_new_block())
        elif need:
            request.extend_blocks(pool.get_new_blocks(need))
        if self.enable_caching and not delay_cache_blocks:
            num_full = min(total_computed + num_new_tokens, request.num_tokens) // bs
            cached = request.num_cached_blocks
            if num_full == cached + 1:  # one block filled (decode): the scalar path
                pool.cache_block(request.block_buf.item(cached), request.hash_at(cached))
                request.num_cached_blocks = num_full
            elif num_full > cached:
                pool.cache_full_blocks(request, request.block_buf, cached, num_full)
                request.num_cached_blocks = num_full
        return True

    def cache_blocks(self, request: "SimRequest", num_tokens: int) -> None:
        """Register the full blocks of ``request``'s first ``num_tokens`` tokens
        (vLLM's ``KVCacheManager.cache_blocks``, kv_cache_manager.py:791-801; async
        update_from_output calls it, scheduler.py:2402-2415). Capped at the blocks whose
        hash is known, ``num_tokens // block_size`` of the request's tokens."""
        if not self.enable_caching:
            return
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        cached = request.num_cached_blocks
        if num_full == cached + 1:  # one block filled (a decode token): no arrays
            self.block_pool.cache_block(request.block_buf.item(cached),
                                        request.hash_at(cached))
            request.num_cached_blocks = num_full
        elif num_full > cached:
            self.block_pool.cache_full_blocks(request, request.block_buf, cached, num_full)
            request.num_cached_blocks = num_full

    def free(self, request: "SimRequest", keep: int = 0) -> int:
        """Release a finished or preempted request's blocks, tail block first.

        First the hashes of full blocks the decode group left unregistered (generated
        blocks with synthetic ids: no other request can hit them, so registering them
        now, before they reach the free queue, is indistinguishable from on time). Sync
        only (``register_on_free``): in async mode vLLM's ``_free_request`` registers
        nothing, so a block completed by a token still in flight is never registered.
        ``keep``: the first blocks stay held (a P/D prefill instance's blocks the decoder
        will read, ``tuner.sim.disagg.nixl.HoldingKVCacheManager``); the rest are freed
        in the same order. Returns how many of its leading blocks carry a hash (the
        registered ones, those this free registered included): the kept blocks' count
        lets their later release skip the pool's gather of ``block_hash``.
        """
        n = request.num_blocks
        num_hashed = request.num_cached_blocks  # the registered blocks lead (invariant)
        if self.enable_caching and self.register_on_free:
            num_full = min(request.num_computed_tokens, request.num_tokens) // self.block_size
            if num_full > num_hashed:
                self.block_pool.cache_full_blocks(request, request.block_buf,
                                                  num_hashed, num_full)
                num_hashed = num_full
        if n > keep:
            self.block_pool.free_blocks(request.block_buf[n - 1:keep - 1:-1] if keep
                                        else request.block_buf[n - 1::-1],
                                        may_repeat=request.repeated_blocks,
                                        num_hashed=max(0, min(num_hashed, n) - keep))
        request.repeated_blocks = False
        request.num_blocks = 0
        request.num_cached_blocks = 0
        return num_hashed

    def check_invariants(self, live_requests: "list[SimRequest]") -> None:
        """Pool invariants plus: no block owned twice by one request, ref counts equal
        the number of live requests holding each block, free + held = usable blocks."""
        pool = self.block_pool
        pool.check_invariants()
        owners: dict[int, int] = {}
        for request in live_requests:
            ids = request.blocks
            assert len(set(ids)) == len(ids), f"{request!r} holds a block twice"
            assert 0 not in ids, f"{request!r} holds the null block"
            for block_id in ids:
                owners[block_id] = owners.get(block_id, 0) + 1
            assert request.num_cached_blocks <= request.num_blocks
            # ``free`` tells the pool which blocks go to the queue's back from this: a
            # request's hashed blocks are exactly its leading ``num_cached_blocks``.
            hashed = pool.block_hash[request.block_buf[:request.num_blocks]] >= 0
            assert hashed.sum() == request.num_cached_blocks == (
                hashed[:request.num_cached_blocks].sum()), (
                f"{request!r}: hashed blocks are not its {request.num_cached_blocks} leading ones")
        for block in range(1, pool.num_gpu_blocks):
            assert pool.ref_cnt[block] == owners.get(block, 0), (
                f"block {block}: ref_cnt {pool.ref_cnt[block]} != number of holders "
                f"{owners.get(block, 0)}")
        for request in live_requests:
            if request.hit_memo >= 0:
                direct = len(self._longest_hit(request))
                if request.hit_epoch == pool.slot_epochs[request.hit_slot]:
                    assert request.hit_memo <= direct, f"{request!r}: memoised hit too long"
                assert self._current_hit_blocks(request) == direct, f"{request!r}: memo != walk"
                if request.hit_epoch == pool.slot_epochs[request.hit_slot]:
                    hit = self._memo_hit(request, request.hit_memo)
                    assert hit.tolist() == self._longest_hit(request)[:len(hit)].tolist(), (
                        f"{request!r}: the memo's stored hit blocks are not the map's")
        used = len(owners)
        free = pool.get_num_free_blocks()
        assert free + used == pool.num_gpu_blocks - 1, (
            f"free {free} + used {used} != usable {pool.num_gpu_blocks - 1}")
