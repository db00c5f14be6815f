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
