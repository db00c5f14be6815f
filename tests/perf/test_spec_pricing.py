"""Pricing of speculative-decoding steps (tuner.perf.spec_decode): drafts cost only
where drafted, and a per-batch-size k prices the drafter at the step's own k."""

from __future__ import annotations

import pytest

from tuner.perf.presets import resolve_target
from tuner.perf.spec_decode import with_spec_decode
from tuner.perf.target import Target
from tuner.sim.batch import StepBatch
from tuner.sim.spec_decode import from_vllm_config

BASE = resolve_target(Target(hardware="mi355x", model="llama-3.1-70b", tp=8)).step_time


def _decode(n: int, drafts: int = 0) -> StepBatch:
    if not drafts:
        return StepBatch(num_decode_reqs=n, decode_ctx_tokens=n * 2000)
    return StepBatch(num_prefill_reqs=n, num_prefill_tokens=n * (1 + drafts),
                     prefill_ctx_tokens=n * 2000, num_spec_reqs=n,
                     num_spec_tokens=n * drafts)


def test_off_is_the_base_model() -> None:
    assert with_spec_decode(BASE, None) is BASE


def test_drafter_cost_grows_with_k() -> None:
    prices = [with_spec_decode(BASE, from_vllm_config(
        {"method": "mtp", "num_speculative_tokens": k}, "0.8")).drafter_s(_decode(16))
        for k in (1, 2, 4)]
    assert 0 < prices[0] < prices[1] < prices[2]


def test_per_batch_size_k_prices_the_steps_own_k() -> None:
    """k = 3 up to 8 requests, none from 9: the drafter costs k = 3's price at 8
    requests and nothing at 16; a verify-only step keeps vLLM's piecewise launch gaps
    (dynamic k forces PIECEWISE graphs), so it costs at least the fixed-k price."""
    dynamic = with_spec_decode(BASE, from_vllm_config(
        {"method": "mtp", "num_speculative_tokens": 3,
         "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, 1024, 0]]}, "0.8"))
    fixed = with_spec_decode(BASE, from_vllm_config(
        {"method": "mtp", "num_speculative_tokens": 3}, "0.8"))
    assert dynamic.drafter_s(_decode(8)) == pytest.approx(fixed.drafter_s(_decode(8)))
    assert dynamic.drafter_s(_decode(16)) == 0.0 < fixed.drafter_s(_decode(16))
    verify = _decode(8, drafts=3)
    assert dynamic.verify_extra_s(verify) >= fixed.verify_extra_s(verify)


def test_drafter_layers_take_their_kv_and_weights() -> None:
    """MTP / EAGLE-3 keep their layer's KV in the same cache (one more layer per block)
    and their weights before it is sized; n-gram and a --num-gpu-blocks override do not
    change the cache."""
    from tuner.perf.spec_decode import spec_deployment
    from tuner.sim.settings import SimOptions

    plain = resolve_target(Target(hardware="mi355x", model="deepseek-v3", tp=8))
    layers = plain.model.num_layers

    def blocks(method: str, resolved=plain) -> int:  # type: ignore[no-untyped-def]
        spec = from_vllm_config({"method": method, "num_speculative_tokens": 2}, "0.7")
        return spec_deployment(resolved, SimOptions(speculative=spec))[0].cache.num_gpu_blocks

    base = plain.cache.num_gpu_blocks
    assert blocks("ngram") == base
    mtp = blocks("mtp")
    assert mtp < base * layers / (layers + 1) <= base  # the KV share, and the weights too
    assert mtp > 0.9 * base
    fixed = resolve_target(Target(hardware="mi355x", model="deepseek-v3", tp=8,
                                  num_gpu_blocks=5000))
    assert blocks("mtp", fixed) == 5000
