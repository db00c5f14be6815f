"""Speculative decoding in the twin (tuner.sim.spec_decode, tuner.sim.spec_update):
the acceptance input, the seeded draw, and the scheduling rules step by step on small
hand-checked cases (the vLLM parity of the same rules is tests/vllm/test_spec_parity.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tuner.errors import ConfigError
from tuner.sim import CacheSettings, SchedulerSettings, SimOptions, Simulator
from tuner.sim.scheduler import Scheduler
from tuner.sim.request import SimRequest
from tuner.sim.spec_decode import from_vllm_config, parse_acceptance, rates_from_length
from tuner.sim.spec_update import SpecDecodeState


def _spec(k: int, acceptance: str, method: str = "ngram"):  # type: ignore[no-untyped-def]
    return from_vllm_config({"method": method, "num_speculative_tokens": k}, acceptance)


def _req(rid: str, prompt: int, output: int, arrival: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, arrival_s=arrival, input_len=prompt,
                           output_len=output, block_hashes=[], output_block_hashes=None,
                           priority=0)


def _replay(requests, spec, *, async_scheduling=False, blocks=200, budget=8192):  # type: ignore[no-untyped-def]
    sim = Simulator(requests, SchedulerSettings(max_num_batched_tokens=budget, max_num_seqs=16),
                    CacheSettings(block_size=16, num_gpu_blocks=blocks), lambda b: 0.01,
                    options=SimOptions(speculative=spec, async_scheduling=async_scheduling,
                                       record_steps=True, check_invariants=True))
    return sim, sim.run()


# ----------------------------------------------------------------- the acceptance input
def test_rates_and_mean_length_parse_as_vllm_reads_them() -> None:
    assert parse_acceptance("0.8,0.6,0.45", 3) == (0.8, 0.6, 0.45)
    # vLLM's minimum-variance schedule (config/speculative.py:590-597)
    assert rates_from_length(2.5, 3) == (1.0, 0.5, 0.0)
    assert parse_acceptance("2.5", 3) == (1.0, 0.5, 0.0)
    # shorter than k: the last ratio continues (0.6 / 0.8 = 0.75)
    assert parse_acceptance("0.8,0.6", 4) == pytest.approx((0.8, 0.6, 0.45, 0.3375))
    assert parse_acceptance("0.9,0.8,0.7", 2) == (0.9, 0.8)


@pytest.mark.parametrize("text", ["0.5,0.7", "1.2,0.5", "x", "", "5", "nan"])
def test_bad_acceptance_is_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_acceptance(text, 3)


@pytest.mark.parametrize("config, needle", [
    ({"method": "medusa", "num_speculative_tokens": 2}, "method"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "bogus": 1}, "bogus"),
    ({"method": "mtp", "num_speculative_tokens": 2,
      "num_speculative_tokens_per_batch_size": [[2, 8, 2]]}, "must start at 1"),
    ({"method": "mtp", "num_speculative_tokens": 2,
      "num_speculative_tokens_per_batch_size": [[1, 8, 2], [8, 9, 1]]}, "overlap"),
    ({"method": "mtp", "num_speculative_tokens": 2,
      "num_speculative_tokens_per_batch_size": [[1, 8]]}, r"per_batch_size\[0\]"),
    ({"method": "mtp", "num_speculative_tokens": 2,
      "num_speculative_tokens_per_batch_size": [[1, 8, -1]]}, "must be >= 0"),
    ({"method": "mtp", "num_speculative_tokens": 2, "parallel_drafting": True},
     "parallel_drafting"),
    ('{"method": "mtp", ', "not JSON"),
    ('[1]', "JSON object"),
])
def test_bad_speculative_config_is_refused_by_name(config: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        from_vllm_config(config, "0.5")  # type: ignore[arg-type]


def test_config_acceptance_comes_from_synthetic_rates_or_defaults() -> None:
    sd = from_vllm_config({"method": "eagle3", "num_speculative_tokens": 2,
                           "rejection_sample_method": "synthetic",
                           "synthetic_acceptance_rates": [0.7, 0.4]})
    assert sd.acceptance == (0.7, 0.4) and sd.num_lookahead_tokens == 2
    assert sd.mean_acceptance_length == pytest.approx(2.1)
    with pytest.raises(ConfigError, match="no acceptance"):
        from_vllm_config({"method": "ngram", "num_speculative_tokens": 2})
    sd = from_vllm_config({"method": "ngram", "num_speculative_tokens": 2},
                          default_rates=lambda method, k: [0.5])
    assert sd.acceptance == (0.5, 0.25) and sd.num_lookahead_tokens == 0  # geometric


def test_draw_is_seeded_deterministic_and_follows_the_profile() -> None:
    sd = _spec(3, "0.8,0.6,0.45")
    draws = [sd.num_accepted(f"r{i}", 100 + i, 3) for i in range(20000)]
    assert draws == [sd.num_accepted(f"r{i}", 100 + i, 3) for i in range(20000)]
    for pos, rate in enumerate(sd.acceptance, 1):  # P(accepted >= pos) ~ the rate
        assert sum(d >= pos for d in draws) / len(draws) == pytest.approx(rate, abs=0.01)
    assert all(sd.num_accepted(f"r{i}", 7, 1) <= 1 for i in range(100))  # capped
    other = from_vllm_config({"method": "ngram", "num_speculative_tokens": 3},
                             "0.8,0.6,0.45", seed=1)
    assert draws != [other.num_accepted(f"r{i}", 100 + i, 3) for i in range(20000)]


# ----------------------------------------------------------------- scheduling rules
def _scheduled(result) -> list[dict[str, int]]:  # type: ignore[no-untyped-def]
    return [s.num_scheduled_tokens for s in result.steps]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_full_acceptance_bursts_and_a_stop_inside_the_last_burst(async_scheduling: bool) -> None:
    """k = 3, every draft accepted: the prefill samples 1 token, each verify returns 4;
    the third burst needs 1 of its 4 (max_tokens 10) and the request stops there."""
    sim, result = _replay([_req("r", 20, 10)], _spec(3, "1"), async_scheduling=async_scheduling)
    r = result.requests[0]
    assert r.status == "finished" and r.output_len == 10
    if async_scheduling:  # the step after the prefill is scheduled before its token exists
        assert _scheduled(result)[:2] == [{"r": 20}, {"r": 4}]
    else:
        assert _scheduled(result) == [{"r": 20}, {"r": 4}, {"r": 4}, {"r": 4}]
    c = result.counters
    assert c["spec_num_accepted_tokens"] == c["spec_num_draft_tokens"] > 0
    assert c["spec_num_accepted_tokens_pos2"] == c["spec_num_drafts"]


def test_no_acceptance_rolls_back_every_draft() -> None:
    """Acceptance 0: each verify schedules 1 + k tokens and yields one; the rejected
    drafts roll num_computed_tokens back, so the next step schedules 1 + k again."""
    sim, result = _replay([_req("r", 20, 6)], _spec(3, "0"))
    assert _scheduled(result) == [{"r": 20}] + [{"r": 4}] * 5
    assert result.counters["spec_num_accepted_tokens"] == 0
    assert result.counters["spec_num_draft_tokens"] == 15


def test_lookahead_slots_reserve_kv_for_drafters_with_a_forward_pass() -> None:
    """A 16-token prompt fills one block; eagle3's 3 lookahead slots need a second at the
    prefill, n-gram's none."""
    for method, blocks in (("ngram", 1), ("eagle3", 2)):
        sched = Scheduler(SchedulerSettings(), CacheSettings(block_size=16, num_gpu_blocks=50),
                          SimOptions(speculative=_spec(3, "0.5", method)))
        req = SimRequest(request_id="r", index=0, arrival_s=0.0, num_prompt_tokens=16,
                         max_tokens=5, block_size=16)
        sched.add_request(req)
        sched.schedule()
        assert req.num_blocks == blocks, method


def test_async_placeholders_cover_the_drafts() -> None:
    """AsyncScheduler: a verify step's request holds 1 + k placeholders and k
    placeholder drafts right after schedule() (async_scheduler.py:24-56)."""
    sched = Scheduler(SchedulerSettings(), CacheSettings(block_size=16, num_gpu_blocks=50),
                      SimOptions(speculative=_spec(2, "0.5", "mtp"), async_scheduling=True))
    req = SimRequest(request_id="r", index=0, arrival_s=0.0, num_prompt_tokens=20,
                     max_tokens=30, block_size=16)
    sched.add_request(req)
    first = sched.schedule()  # the prefill: one placeholder, then k placeholder drafts
    assert req.num_output_placeholders == 1 and req.num_spec_tokens == 2
    second = sched.schedule()  # 1 + 2 tokens scheduled on top of the in-flight one
    assert second.num_scheduled_tokens() == {"r": 3}
    assert req.num_output_placeholders == 4  # 1 (prefill) + 1 + 2 (this verify)
    sched.update_from_output(first, 0.01)
    sched.update_from_output(second, 0.02)
    assert req.num_output_placeholders == 0


def test_off_costs_nothing_visible_and_the_fast_path_refuses_on() -> None:
    reqs = [_req(f"r{i}", 30 + i, 5 + i, i * 0.001) for i in range(6)]
    sim, result = _replay(reqs, None)
    assert not any(k.startswith("spec_") for k in result.counters)
    assert sim.scheduler.spec is None and sim.scheduler.group is not None
    sim, result = _replay(reqs, _spec(2, "0.6"))
    assert sim.scheduler.group is None
    assert "SimOptions.speculative" in (sim.scheduler.fast_path_refusal or "")


def test_preemption_drops_the_drafts() -> None:
    """Four decodes with eagle3 lookahead outgrow 12 blocks: victims lose their drafts
    and every request still finishes with its full output."""
    reqs = [_req(f"p{i}", 30, 40, 0.001 * i) for i in range(4)]
    sim, result = _replay(reqs, _spec(3, "0.7,0.5,0.3", "eagle3"), blocks=12)
    assert result.counters["preemptions"] > 0
    assert all(r.status == "finished" and r.output_len == 40 for r in result.requests)


# ----------------------------------------------------------------- per-batch-size k
def _dynamic(k: int, schedule: list[list[int]], acceptance: str = "1",
             method: str = "ngram"):  # type: ignore[no-untyped-def]
    return from_vllm_config({"method": method, "num_speculative_tokens": k,
                             "num_speculative_tokens_per_batch_size": schedule}, acceptance)


def test_per_batch_size_k_matches_vllms_dense_lookup() -> None:
    """``build_dynamic_sd_schedule_lookup`` (v1/spec_decode/dynamic/utils.py): a gap and
    the tail carry the previous range's k, every k capped by num_speculative_tokens."""
    sd = _dynamic(3, [[1, 2, 5], [5, 6, 1], [9, 9, 0]])
    assert sd.k_lookup(12) == [3, 3, 3, 3, 3, 1, 1, 1, 1, 0, 0, 0, 0]
    assert sd.k_for_batch(0) == 3 and "per batch size 1-2: 3, 5-6: 1, 9-9: 0" in sd.describe()
    assert _spec(2, "1").k_lookup(4) is None


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_per_batch_size_k_follows_the_steps_batch(async_scheduling: bool) -> None:
    """k = 3 for one request, 1 from two: a lone request verifies 3 drafts per step; once
    a second one runs, each gets 1 (sync: the drafter's k of the step that ran; async:
    the placeholders of the step scheduled)."""
    sd = _dynamic(3, [[1, 1, 3], [2, 16, 1]])
    sim, result = _replay([_req("a", 20, 40), _req("b", 20, 40, arrival=0.035)], sd,
                          async_scheduling=async_scheduling)
    spec = [s for s in result.steps if len(s.num_scheduled_tokens) == 1
            and s.num_scheduled_tokens.get("a") == 4]
    both = [s for s in result.steps if s.num_scheduled_tokens.get("a") == 2
            and s.num_scheduled_tokens.get("b") == 2]
    assert spec and both, _scheduled(result)
    c = result.counters  # verifies of 3 and of 1 draft
    assert c["spec_num_drafts"] < c["spec_num_draft_tokens"] < 3 * c["spec_num_drafts"]
    assert all(r.status == "finished" and r.output_len == 40 for r in result.requests)


def test_per_batch_size_turns_the_padding_off() -> None:
    """vLLM pads a full-hit admission to 1 + k only with a fixed k (scheduler.py:1312)."""
    sd = _dynamic(3, [[1, 16, 3]])
    assert SpecDecodeState(sd, 4096, 16).pad(10, 100) == 1
    fixed = SpecDecodeState(_spec(3, "1"), 4096)
    fixed._running_scheduled = True
    assert fixed.pad(10, 100) == 4
