"""The batched CPU pool (tuner.sim.kv_connector.cpu_manager / policies) against the plain,
key-at-a-time port it replaced (_kv_pool_plain.py): generated operation sequences over
LRU and ARC must give the same store/evict answers, the same eviction order and the same
policy state (ranks, heap pops, T1/T2/B1/B2 orders, ARC's target) after every operation."""

from __future__ import annotations

import _kv_pool_plain as plain
from hypothesis import given, settings
from hypothesis import strategies as st

import numpy as np

from tuner.sim.kv_connector import cpu_manager as batched
from tuner.sim.kv_connector.lru_pool import RANK_SPAN
from tuner.sim.kv_connector.policies import ReqContext

NUM_KEYS = 40

_op = st.one_of(
    st.tuples(st.just("store"), st.integers(0, 3), st.lists(st.integers(0, NUM_KEYS - 1),
                                                            min_size=1, max_size=12)),
    st.tuples(st.just("complete"), st.integers(0, 3), st.integers(0, 12)),
    st.tuples(st.just("load"), st.integers(0, 3), st.integers(1, 6)),
    st.tuples(st.just("finish"), st.integers(0, 3), st.just(0)),
    # the LRU pool rebuilds its eviction order when stale entries dominate (its
    # owner array must then name the rebuilt run); the plain port has nothing to do
    st.tuples(st.just("compact"), st.integers(0, 3), st.just(0)),
)


def _rank(p, key: int) -> int:
    """The key's LRU rank as one int (the plain port keeps vLLM's (rank, -position))."""
    rank = p._ranks[key]
    return rank if isinstance(rank, int) else rank[0] * RANK_SPAN + rank[1]


def _state(m) -> tuple:
    if isinstance(m, batched.LRUPool):  # the arrays by key, read back as the plain state
        keys = np.flatnonzero(m._chunk >= 0).tolist()
        rank = m._state >> 1  # the state word is 2 * rank + idle
        pool = sorted((k, int(m._ref[k]), int(m._chunk[k]), int(rank[k])) for k in keys)
        order = sorted((int(rank[k]), k) for k in keys if m._ref[k] == 0)
        return (pool, order, m._next_rank, m.num_evictable, m.num_write_pending,
                m.num_evicted, m._num_allocated, m._free[:m._num_free_ids].tolist())
    p = m.policy
    if p.name == "lru":
        pool = sorted((k, c.ref_cnt, c.chunk_id, _rank(p, k)) for k, c in p.chunks.items())
        order = sorted((_rank(p, k), k) for k in p._evictable)
        return (pool, order, p._next_rank, m.num_evictable, m.num_write_pending,
                m.num_evicted, m._num_allocated, list(m._free))
    lists = tuple([(k, getattr(v, "ref_cnt", None)) for k, v in d.items()]
                  for d in (p.t1, p.t2, p.b1, p.b2))
    return (lists, p.target_t1_size, m.num_evictable, m.num_write_pending, m.num_evicted,
            m._num_allocated, list(m._free))


def _inflight_keys(p) -> set[int]:
    """The pool's keys whose chunk is still being stored (ref_cnt -1), from the chunks."""
    chunks = p.chunks.items() if p.name == "lru" else [*p.t1.items(), *p.t2.items()]
    return {k for k, c in chunks if c.ref_cnt < 0}


#: A full pool's stores, each completed at once by the next operation, and finishes: most
#: stores evict, and a request that stores again offers its own older idle keys, which
#: the eviction must pass over (the LRU pool reads their words only when it reaches
#: their ranks, ``LRUPool._evict``); the operation mix above evicts seldom.
_evicting = st.lists(st.one_of(
    st.tuples(st.integers(0, 3), st.lists(st.integers(0, 15), min_size=1, max_size=8)),
    st.tuples(st.integers(0, 3), st.just([])),  # a finish
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(policy=st.sampled_from(["lru", "arc"]), num_chunks=st.integers(2, 16),
       ops=st.lists(_op, max_size=60))
def test_the_batched_pool_decides_like_the_plain_one(policy: str, num_chunks: int,
                                                     ops: list) -> None:
    _check_against_plain(policy, num_chunks, ops)


@settings(max_examples=300, deadline=None)
@given(policy=st.sampled_from(["lru", "arc"]), num_chunks=st.integers(2, 8), runs=_evicting)
def test_evicting_stores_pass_over_their_own_idle_keys(policy: str, num_chunks: int,
                                                       runs: list) -> None:
    ops: list = []
    for r, keys in runs:
        ops += [("store", r, keys), ("complete", r, 0)] if keys else [("finish", r, 0)]
    _check_against_plain(policy, num_chunks, ops)


def _check_against_plain(policy: str, num_chunks: int, ops: list) -> None:
    """Play ``ops`` on the plain port and on the batched pool; every answer and the
    state after every operation must agree."""
    managers = (plain.CPUOffloadingManager(num_chunks, policy),
                batched.make_pool(num_chunks, policy))
    ctxs = ([plain.ReqContext() for _ in range(4)], [ReqContext() for _ in range(4)])
    for side in ctxs:
        for i, ctx in enumerate(side):  # request i's keys sit at its own positions
            ctx.positions.update({k: (k + i) % 17 * 16 + 16 for k in range(NUM_KEYS)})
    pending: list[list[list[int]]] = [[], []]  # in-flight stores, per side
    loads: list[list[list[int]]] = [[], []]
    finished: set[int] = set()
    for op, r, arg in ops:
        if r in finished:
            continue
        out = []
        for side, m in enumerate(managers):
            ctx = ctxs[side][r]
            if op == "store":
                if side and isinstance(m, batched.LRUPool) and r % 2:  # positions given
                    res = m.prepare_store(list(arg), ctx, np.array(  # as the connector does
                        [ctx.positions[k] for k in arg], dtype=np.int64))
                else:
                    res = m.prepare_store(list(arg), ctx)
                if res is not None:
                    res = (list(map(int, res[0])), res[1])
                if res is not None and res[0]:
                    pending[side].append(res[0])
                out.append(res)
            elif op == "complete":
                if pending[side]:
                    m.complete_store(pending[side].pop(arg % len(pending[side])))
                if loads[side]:
                    m.complete_load(loads[side].pop(0))
            elif op == "load":
                keys = [k for k in range(NUM_KEYS) if m.lookup(k) == plain.HIT][:arg]
                m.prepare_load(keys, ctx)
                loads[side].append(keys)
                out.append(keys)
            elif op == "compact":
                if isinstance(m, batched.LRUPool):
                    m._compact()
            else:
                m.on_request_finished(ctx)
        if op == "finish":
            finished.add(r)
        assert out[:1] == out[1:] or not out, (op, out)
        assert _state(managers[0]) == _state(managers[1]), op
        pool = managers[1]
        if isinstance(pool, batched.LRUPool):  # every idle key's newest order entry (the
            # one its owner run holds; the eviction reads no other as live) is unread and
            # at its rank: every rank change of an idle key pushes it (no lazy entries)
            # (an entry holds the key's state word, 2 * rank + 1)
            newest = {key: word for word, key in pool._order.entries()}
            idle = np.flatnonzero((pool._chunk >= 0) & (pool._ref == 0)).tolist()
            assert all(newest.get(k) == pool._state[k] for k in idle)
            # the state word the eviction and the calls read: odd for an idle key, even
            # and non-zero for a stored busy one (in flight or loading), 0 outside the
            # pool (no key is protected, i.e. negative, between operations)
            idle_mask = (pool._chunk >= 0) & (pool._ref == 0)
            busy_mask = (pool._chunk >= 0) & (pool._ref != 0)
            assert ((pool._state & 1).astype(bool) == idle_mask).all()
            assert (pool._state[busy_mask] > 0).all()
            assert (pool._state[pool._chunk < 0] == 0).all()
        else:  # the in-flight set classify and complete_stores read: the ref_cnt -1 keys
            assert pool.policy._inflight == _inflight_keys(pool.policy)
