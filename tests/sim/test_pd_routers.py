"""The P/D proxy's choices (tuner.sim.disagg.routers): vLLM's example proxy cycles, llm-d's
scheduler and Dynamo's KV router follow the prefix caches, and each pool sees its calls in
the documented order."""

from __future__ import annotations

import pytest
from sim_helpers import Req, nonlinear_step, prompt_hashes

from tuner.errors import ConfigError
from tuner.sim.disagg import PD_ROUTERS, PDSettings
from tuner.sim.disagg.routers import LlmdPDRouter, PDView
from tuner.sim.disagg.simulator import PDPool, PDSimulator
from tuner.sim.settings import CacheSettings, SchedulerSettings

SETTINGS = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=32)
CACHE = CacheSettings(num_gpu_blocks=400)
LINK = dict(bytes_per_token_rank=131072, link_bytes_per_s=45e9, link_latency_s=50e-6)


def _revisit_trace() -> list[Req]:
    """``a`` (a 30-block prompt), two others, then ``c`` = ``a``'s prompt + 2 blocks
    once ``a`` has finished. Round robin over two engines per pool sends ``c`` where
    ``a`` was not (the 4th request goes to engine 1 of each pool; ``a`` went to 0)."""
    base = prompt_hashes(0, 480, shared_blocks=30, unique=0)
    longer = base + prompt_hashes(7, 32, shared_blocks=0, unique=2)
    return [Req("a", 0.0, 480, 4, base),
            Req("x", 0.01, 160, 4, prompt_hashes(1, 160, shared_blocks=0, unique=10)),
            Req("y", 0.02, 160, 4, prompt_hashes(2, 160, shared_blocks=0, unique=10)),
            Req("c", 2.0, 512, 4, longer)]


def _run(router: str, reqs: list[Req]):
    pd = PDSettings(num_prefill=2, num_decode=2, router=router, **LINK)
    sim = PDSimulator(reqs, PDPool(SETTINGS, CACHE, nonlinear_step),
                      PDPool(SETTINGS, CACHE, nonlinear_step), pd)
    sim.prefill_of = {}  # trace index -> the prefill engine the router chose
    for e, engine in enumerate(sim.prefill):
        def add(index, source, arrival_s, _e=e, _add=engine.add_request):
            sim.prefill_of[index] = _e
            _add(index, source, arrival_s)
        engine.add_request = add
    return sim, sim.run()


def _prefill_of(sim, index: int) -> int:
    return sim.prefill_of[index]


def test_the_registry_names_every_router():
    assert list(PD_ROUTERS) == ["vllm-proxy", "llm-d", "dynamo"]
    with pytest.raises(ConfigError, match="--pd-router 'sglang'"):
        PDSettings(num_prefill=1, num_decode=1, router="sglang", **LINK).validate()


def test_vllm_proxy_cycles_where_the_prefix_routers_follow_the_cache():
    reqs = _revisit_trace()
    rr, rr_result = _run("vllm-proxy", reqs)
    assert _prefill_of(rr, 3) == 1 and rr_result.requests.engine[3] == 3
    assert rr.prefill_times[3][2] == 0  # no prefill hit: a's blocks are on engine 0
    for name in ("llm-d", "dynamo"):
        sim, result = _run(name, reqs)
        assert _prefill_of(sim, 3) == _prefill_of(sim, 0), name  # where a was prefilled
        assert result.requests.engine[3] == result.requests.engine[0], name  # a's decoder
        assert sim.prefill_times[3][2] == 30 * 16, name  # a's 30 blocks hit on prefill
        # the decoder held a's blocks: c reads only its 2 new blocks (+ the last one)
        assert result.counters["pd_read_blocks"] < rr_result.counters["pd_read_blocks"], name
        assert result.counters["num_finished"] == len(reqs)


def test_llmd_sends_a_prompt_its_decoder_holds_to_the_decoder_alone():
    """llm-d's prefix-based-pd-decider (nonCachedTokens 16): ``d`` repeats ``a``'s
    30-block prompt after ``a`` finished on a decoder that now holds it: no prefill, no
    read, the decoder computes it (a local hit of all but the last token); the other
    routers prefill it again and read the last block."""
    base = prompt_hashes(0, 480, shared_blocks=30, unique=0)
    reqs = [Req("a", 0.0, 480, 4, base), Req("d", 2.0, 480, 4, base)]
    sim, result = _run("llm-d", reqs)
    assert 1 not in sim.prefill_of and 1 not in sim.reads  # never prefilled or read
    assert result.requests.engine[1] == result.requests.engine[0]  # a's decoder
    assert result.counters["pd_reads"] == 1
    assert [r.status for r in result.requests] == ["finished", "finished"]
    assert result.requests[1].num_cached_tokens == 480 - 16  # all but the last block
    for name in ("vllm-proxy", "dynamo"):
        other, res = _run(name, reqs)
        assert 1 in other.prefill_of and res.counters["pd_reads"] == 2, name


class _Source:
    def __init__(self, n: int) -> None:
        self.block_hashes = list(range(n))
        self.input_len = 16 * n


def test_llmd_scores_two_prefix_share_plus_one_normalised_queue():
    """llm-d's sample P/D config: 2 x prefix-cache-scorer + 1 x queue-scorer, the
    max-score-picker; the decode profile runs first (at the arrival)."""
    cached = {0: 0, 1: 5, 2: 8, 3: 0}  # engine -> cached leading blocks (of 10)
    waiting = {0: 4, 1: 0, 2: 2, 3: 0}
    view = PDView(2, 2, kv_block_size=16, num_hash_ids=16,
                  cached_blocks=lambda e, s: cached[e], waiting=lambda e: waiting[e],
                  first_token=lambda e, i: False)
    router = LlmdPDRouter(view)
    src = _Source(10)
    assert router.scores(range(0, 2), src) == pytest.approx([0.0, 2 * 0.5 + 1.0])
    assert router.scores(range(2, 4), src) == pytest.approx([2 * 0.8 + 0.0, 0.0 + 1.0])
    assert router.route(7, src, 0.0) == 1
    assert router.route_decode(7, src) == 2  # chosen at the arrival, kept to the handoff
    waiting.update({2: 0, 3: 0})
    cached.update({2: 0, 3: 0})  # all equal: the first endpoint
    assert router.route(8, src, 0.0) == 1
    router.refused(8)
    assert 8 not in router._decode_of
    cached[3] = 10  # the decoder holds the whole prompt: decode only (the decode engine)
    assert router.route(9, src, 0.0) == 3 and 9 not in router._decode_of
    cached[3] = 9  # 16 tokens it does not hold: not fewer than nonCachedTokens
    assert router.route(10, src, 0.0) == 1 and router.route_decode(10, src) == 3
