"""The robust pick: the recommendation re-checked under clock variants (tuner.tune.robust)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.tune.fake import FakeEvaluator
from tuner.errors import ConfigError
from tuner.perf.clock_variant import ClockVariant, VariantStepTimeModel, with_variant
from tuner.perf.presets import resolve_target
from tuner.perf.step_time import RooflineStepTimeModel
from tuner.perf.target import Target
from tuner.sim.batch import StepBatch
from tuner.sim.settings import SchedulerSettings
from tuner.tune import SearchOptions, TuneInputs, tune
from tuner.tune.robust import (RobustOptions, draw_variants, part_ranges, robust_check)
from tuner.tune.space import space_from_dict

BAND_KEYS = {"band_vendor": "amd", "band_regime": "below", "band_knee_batch": 64,
             "band_running_per_engine": 4.0}


# --------------------------------------------------------------------------- the clock
def test_a_variant_scales_each_part_of_a_step() -> None:
    target = Target(hardware="mi355x", model="llama-3.1-70b", tp=8)
    plain = resolve_target(target).step_time
    decode = StepBatch(num_decode_reqs=32, decode_ctx_tokens=32 * 2000)
    prefill = StepBatch(num_prefill_reqs=1, num_prefill_tokens=8192,
                        prefill_attn_pairs=8192 * 4096)
    cpu, gpu = plain.step_parts_s(decode)
    link = plain.transfer_s(decode)
    assert 0 < link < gpu
    v = VariantStepTimeModel(plain, ClockVariant(prefill=3.0, decode=0.5, cpu=2.0, transfer=4.0))
    vcpu, vgpu = v.step_parts_s(decode)
    assert vcpu == pytest.approx(2.0 * cpu)
    assert vgpu == pytest.approx(0.5 * (gpu - link) + 4.0 * link)
    pcpu, pgpu = plain.step_parts_s(prefill)
    plink = plain.transfer_s(prefill)
    assert v.step_parts_s(prefill)[1] == pytest.approx(3.0 * (pgpu - plink) + 4.0 * plink)
    assert v.step_time_s(prefill) == pytest.approx(sum(v.step_parts_s(prefill)))


def test_the_nominal_clock_is_the_plain_model() -> None:
    """Replays outside the robust check never see the wrapper (golden digests, speed)."""
    resolved = resolve_target(Target(hardware="mi355x", model="llama-3.1-8b", tp=1))
    assert type(resolved.step_time) is RooflineStepTimeModel
    assert with_variant(resolved.step_time, ClockVariant()) is resolved.step_time
    varied = resolve_target(Target(hardware="mi355x", model="llama-3.1-8b", tp=1,
                                   clock=ClockVariant(prefill=2.0)))
    assert isinstance(varied.step_time, VariantStepTimeModel)
    assert "clock variant" in varied.description
    assert varied.cache == resolved.cache  # the KV capacity is not the clock's


def test_a_variant_refuses_a_non_positive_factor() -> None:
    with pytest.raises(ConfigError, match="decode=0"):
        ClockVariant(decode=0)


def test_variants_come_from_the_bands_balanced_and_seeded() -> None:
    from tuner.metrics.bands import bands_from_keys

    ranges = part_ranges(bands_from_keys(BAND_KEYS))
    by = {r.part: r for r in ranges}
    assert by["decode"].cell.startswith("tpot band") and by["decode"].low < 1 < by["decode"].high
    # the published TTFT cell is too thin (4 rows): prefill borrows the throughput band
    assert by["prefill"].cell.startswith("throughput band")
    for n in (4, 8, 16):
        variants = draw_variants(ranges, n, seed=3)
        assert variants == draw_variants(ranges, n, seed=3)
        assert len(set(variants)) == n
        for i, r in enumerate(ranges):
            highs = sum(v.factors()[i] == r.high for v in variants)
            assert highs == n // 2, (r.part, highs)
    assert draw_variants(ranges, 8, seed=3) != draw_variants(ranges, 8, seed=4)


def test_the_sim_evaluator_replays_under_a_clock_variant(small_trace) -> None:
    from tuner.tune.evaluate import ReplayEvaluator

    ev = ReplayEvaluator(small_trace, target=Target(hardware="mi355x", model="llama-3.1-8b"),
                         holdout=0.0, stage1_fraction=1.0)
    nominal = ev.evaluate(ev.default_settings, "train")
    slow = ev.evaluate(ev.default_settings, "train", clock=ClockVariant(2.0, 2.0, 2.0, 2.0))
    assert slow["tpot_p90_s"] > 1.5 * nominal["tpot_p90_s"]
    again = ev.evaluate(ev.default_settings, "train")  # nothing left behind
    assert {k: v for k, v in again.items() if k not in ("wall_s", "speed_ratio")} == \
        {k: v for k, v in nominal.items() if k not in ("wall_s", "speed_ratio")}


# --------------------------------------------------------------------------- the pick
class ClockFake(FakeEvaluator):
    """Three token budgets: the baseline's (B0), 4x it (A: +10 % throughput on the nominal
    clock, which turns into -5 % when prefill is slow) and 2x it (B: +5 % everywhere)."""

    supports_clock_variants = True

    def __init__(self) -> None:
        super().__init__(holdout_scale=1.0)
        self.clocks: list[ClockVariant | None] = []
        self.base_tokens = self.default_settings.max_num_batched_tokens

    def evaluate(self, settings: SchedulerSettings, window: str, *,
                 clock: ClockVariant | None = None) -> dict[str, Any]:
        self.clocks.append(clock)
        k = settings.max_num_batched_tokens / self.base_tokens
        slow_prefill = clock is not None and clock.prefill > 1
        thr, inter = {1: (1000.0, 10.0), 2: (1050.0, 11.0),
                      4: (950.0 if slow_prefill else 1100.0, 10.5)}[round(k)]
        return {"p90_interactivity": inter, "output_throughput_per_gpu": thr,
                "total_throughput_per_gpu": 11 * thr, "ttft_p90_s": 1.0, "ttft_mean_s": 0.5,
                "prefix_cache_hit_rate": 0.9, "preemptions": 0.0, **BAND_KEYS}


def _space(fake: ClockFake):
    base = fake.base_tokens
    return space_from_dict({"name": "budgets", "params": {"max_num_batched_tokens": {
        "type": "categorical", "choices": [base, 2 * base, 4 * base]}}})


def _tune(robust: RobustOptions) -> Any:
    fake = ClockFake()
    result = tune(TuneInputs(evaluator=fake),
                  SearchOptions(space=_space(fake), n_trials=9, n_survivors=3, robust=robust))
    return fake, result


def _tokens(result: Any) -> int:
    return int(result.recommended.settings["max_num_batched_tokens"])


def test_the_robust_pick_is_the_point_whose_advantage_survives_the_clock() -> None:
    """Fails if the check is skipped: the plain pick (4x the budget) loses to the baseline
    whenever prefill is slow, so the recommendation must be the 2x budget."""
    fake, result = _tune(RobustOptions(variants=4, share=0.75))
    base = fake.base_tokens
    report = result.robust
    assert report is not None and report.skipped is None
    assert int(report.plain.settings["max_num_batched_tokens"]) == 4 * base
    assert _tokens(result) == 2 * base, result.selection.reason
    assert report.changed
    first, second = report.checked
    assert (first.held, len(first.outcomes)) == (2, 4)
    assert (second.held, len(second.outcomes)) == (4, 4)
    # 4 variants x (baseline + plain pick) + 4 x the runner-up, each under a clock
    assert sum(c is not None for c in fake.clocks) == 12
    lines = "\n".join(report.lines(result.objectives))
    assert ("in 4 of 4 clock variants; by +10.0 % p90 interactivity, +5.0 % output "
            "throughput") in lines
    assert "plain pick (nominal clock)" in lines and "fewer than the 3 needed" in lines
    assert result.to_dict()["robust"]["changed"] is True
    assert "the robust pick" in result.selection.reason


def test_robust_off_keeps_the_plain_pick() -> None:
    fake, result = _tune(RobustOptions(enabled=False))
    assert _tokens(result) == 4 * fake.base_tokens
    assert result.robust.skipped == "--robust off"
    assert all(c is None for c in fake.clocks)


def test_no_candidate_survives_keeps_the_baseline() -> None:
    fake, result = _tune(RobustOptions(variants=4, share=1.0))
    # share 1: the plain pick fails two variants, the runner-up holds in all four
    assert _tokens(result) == 2 * fake.base_tokens

    class AlwaysWorse(ClockFake):
        def evaluate(self, settings, window, *, clock=None):  # type: ignore[override]
            out = super().evaluate(settings, window, clock=clock)
            if clock is not None and settings.max_num_batched_tokens != self.base_tokens:
                out["output_throughput_per_gpu"] = 900.0
            return out

    worse = AlwaysWorse()
    result = tune(TuneInputs(evaluator=worse),
                  SearchOptions(space=_space(worse), n_trials=9, n_survivors=3))
    assert result.recommended.is_baseline
    assert "no candidate's advantage over vLLM's defaults holds" in result.selection.reason


def test_a_custom_evaluator_without_a_clock_says_the_check_was_skipped() -> None:
    result = tune(TuneInputs(evaluator=FakeEvaluator()), SearchOptions(n_trials=12))
    assert result.robust is not None
    assert "cannot replay under another clock" in (result.robust.skipped or "")


def test_robust_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="clock variants 0"):
        RobustOptions(variants=0)
    with pytest.raises(ConfigError, match="robust share"):
        RobustOptions(share=0.0)
    assert RobustOptions(variants=8, share=0.8).required == 7
    assert dataclasses.replace(RobustOptions(), variants=9, share=1.0).required == 9


def test_robust_check_needs_bands_on_the_baseline() -> None:
    from tuner.tune.select import PickRule, Point, Selection

    base = Point(0, {}, {}, {"output_throughput_per_gpu": 1.0}, is_baseline=True)
    pick = Point(1, {}, {}, {"output_throughput_per_gpu": 2.0})
    report = robust_check(ClockFake(), Selection(pick, "rule", "why"), base, (), (),
                          PickRule(), RobustOptions())
    assert report.skipped and "no error bands" in report.skipped


def test_a_point_the_failed_pick_beat_on_held_out_is_considered_again() -> None:
    """The 2x budget loses to the plain pick on the held-out window (so it is no runner-up);
    once the plain pick fails the clock variants, the rule re-selects without it."""

    class HeldOutBeaten(ClockFake):
        def evaluate(self, settings, window, *, clock=None):  # type: ignore[override]
            out = super().evaluate(settings, window, clock=clock)
            if window == "holdout" and settings.max_num_batched_tokens == 2 * self.base_tokens:
                out["p90_interactivity"] = 10.4  # below the plain pick's 10.5
            return out

    fake = HeldOutBeaten()
    result = tune(TuneInputs(evaluator=fake),
                  SearchOptions(space=_space(fake), n_trials=9, n_survivors=3,
                                robust=RobustOptions(variants=4, share=0.75)))
    report = result.robust
    assert int(report.plain.settings["max_num_batched_tokens"]) == 4 * fake.base_tokens
    assert _tokens(result) == 2 * fake.base_tokens, result.selection.reason
    assert [c.held for c in report.checked] == [2, 4]
