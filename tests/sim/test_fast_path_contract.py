"""The fast path's contract (``tuner.sim.fast_path``): every settings field is declared,
a refused or undeclared one runs the plain path, and over generated values of every field
the fast path gives byte-identical records, with per-step checks on and off, and the
checks change nothing it does."""

from __future__ import annotations

from dataclasses import fields

import pytest
from hypothesis import HealthCheck, event, given, settings as hyp_settings, strategies as st

from tuner.sim.engine import Simulator
from tuner.sim.fast_path import FAST_PATH_FIELDS, fast_path_refusal
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.scheduler import Scheduler
from tuner.sim.kv_connector.settings import OffloadSettings
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions
from tuner.sim.spec_decode import from_vllm_config

from sim_helpers import assert_identical, check_result, nonlinear_step as step_time, random_trace

SETTINGS_CLASSES = (SchedulerSettings, CacheSettings, SimOptions)
#: The two fields the differential test itself varies (each run takes both values).
VARIED_BY_TEST = {"SimOptions.fast_forward", "SimOptions.check_invariants"}

#: A strategy for every settings field: a new field fails ``test_every_field_is_generated``
#: until the differential test below generates it too.
FIELD_VALUES: dict[str, st.SearchStrategy] = {
    "SchedulerSettings.max_num_batched_tokens": st.integers(1, 600),
    "SchedulerSettings.max_num_seqs": st.integers(1, 32),
    "SchedulerSettings.long_prefill_token_threshold": st.sampled_from([0, 0, 8, 64, 200]),
    "SchedulerSettings.enable_chunked_prefill": st.booleans(),
    "SchedulerSettings.policy": st.sampled_from(["fcfs", "priority"]),
    "SchedulerSettings.scheduler_reserve_full_isl": st.booleans(),
    "SchedulerSettings.watermark": st.sampled_from([0.0, 0.0, 0.02, 0.1]),
    "SchedulerSettings.prefill_schedule_interval": st.sampled_from([1, 1, 2, 4]),
    "SchedulerSettings.cache_aware_admission_window": st.sampled_from([0, 0, 2, 8]),
    "SchedulerSettings.cache_aware_admission_threshold": st.sampled_from([0.0, 0.3, 0.5, 1.0]),
    "CacheSettings.block_size": st.sampled_from([1, 4, 16, 16]),
    # Tokens of KV capacity (turned into blocks below): from a pool that preempts all the
    # time to one that never fills.
    "CacheSettings.num_gpu_blocks": st.one_of(st.integers(300, 1500), st.integers(1500, 8000)),
    "CacheSettings.enable_prefix_caching": st.booleans(),
    "CacheSettings.max_model_len": st.sampled_from([1 << 20, 1 << 20, 200, 330]),
    "SimOptions.prefill_interval_mode": st.sampled_from(["local", "dp", "off"]),
    "SimOptions.record_steps": st.just(True),  # the step records are compared
    "SimOptions.async_scheduling": st.booleans(),
    "SimOptions.self_preemption_continues": st.booleans(),
    "SimOptions.extra": st.sampled_from([{}] * 7 + [{"unmodelled": 1}]),
    # speculative decoding: refused by the fast path (both runs take the plain path, with
    # the per-step invariants on: drafts, lookahead slots and bursts under every setting)
    "SimOptions.speculative": st.sampled_from([None] * 6 + [
        from_vllm_config({"method": "ngram", "num_speculative_tokens": 2}, "0.7"),
        from_vllm_config({"method": "eagle3", "num_speculative_tokens": 3}, "0.8,0.5,0.2")]),
    # A CPU KV tier: the fast path runs with it (members are the requests the connector
    # leaves alone; tests/sim/test_fast_path_connectors.py generates tier setups in depth).
    "SimOptions.kv_offload": st.sampled_from([None] * 6 + [
        OffloadSettings(num_chunks=40, bytes_per_block=1 << 16, load_bytes_per_s=1e9,
                        store_bytes_per_s=1e9, latency_s=1e-4),
        OffloadSettings(num_chunks=400, blocks_per_chunk=2, policy="arc",
                        bytes_per_block=1 << 16, load_bytes_per_s=1e9,
                        store_bytes_per_s=1e9)]),
}


def _field_names() -> set[str]:
    return {f"{cls.__name__}.{f.name}" for cls in SETTINGS_CLASSES for f in fields(cls)}


def test_every_field_is_declared() -> None:
    """A new settings field fails here until the fast path declares how it treats it."""
    names = _field_names()
    assert set(FAST_PATH_FIELDS) - names == set(), "contract entries for fields that are gone"
    assert names - set(FAST_PATH_FIELDS) == set(), (
        "fields without a fast-path declaration: add them to "
        "tuner.sim.fast_path.FAST_PATH_FIELDS")


def test_every_field_is_generated() -> None:
    """...and until the differential test generates its values."""
    assert set(FIELD_VALUES) | VARIED_BY_TEST == _field_names()


def test_refused_setting_runs_the_plain_path() -> None:
    options = SimOptions(extra={"unmodelled": 1})
    s = Scheduler(SchedulerSettings(), CacheSettings(), options)
    assert s.group is None
    assert s.fast_path_refusal == "SimOptions.extra={'unmodelled': 1} is not modelled by the fast path"
    assert Scheduler(SchedulerSettings(), CacheSettings(), SimOptions()).group is not None
    assert Scheduler(SchedulerSettings(), CacheSettings(), SimOptions(fast_forward=False)
                     ).fast_path_refusal is None  # not asked for: nothing refused


def test_undeclared_field_runs_the_plain_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(FAST_PATH_FIELDS, "SchedulerSettings.watermark")
    reason = fast_path_refusal(SchedulerSettings(), CacheSettings(), SimOptions())
    assert reason == ("SchedulerSettings.watermark is not declared in the fast-path contract "
                      "(FAST_PATH_FIELDS)")
    assert Scheduler(SchedulerSettings(), CacheSettings(), SimOptions()).group is None


@st.composite
def replay_setup(draw: st.DrawFn) -> tuple:
    values = {name: draw(strategy) for name, strategy in FIELD_VALUES.items()}
    of = {cls: {name.split(".", 1)[1]: v for name, v in values.items()
                if name.startswith(cls.__name__ + ".")} for cls in SETTINGS_CLASSES}
    sched = of[SchedulerSettings]
    sched["max_num_batched_tokens"] = max(sched["max_num_batched_tokens"], sched["max_num_seqs"])
    options = of[SimOptions]
    if options["speculative"] is not None:  # the two together are refused (ConfigError)
        options["kv_offload"] = None
    cache = of[CacheSettings]
    cache["num_gpu_blocks"] = max(2, cache["num_gpu_blocks"] // cache["block_size"])
    bs = cache["block_size"]
    trace = random_trace(draw(st.integers(0, 10_000)), draw(st.integers(5, 40)),
                         block_size=bs, max_input=300 if bs > 1 else 80,
                         max_output=draw(st.sampled_from([20, 80, 200])),
                         with_output_hashes=draw(st.booleans()),
                         rate=draw(st.sampled_from([5.0, 30.0, 200.0])))
    load = draw(st.sampled_from([OpenLoop(), OpenLoop(3.0), ClosedLoop(4), ClosedLoop(12)]))
    return (trace, SchedulerSettings(**sched), CacheSettings(**cache), of[SimOptions], load)


def _run(trace, settings, cache, options: dict, load, *, fast: bool, check: bool,
         spy: list | None = None):
    sim = Simulator(trace, settings, cache, step_time, load=load,
                    options=SimOptions(**options, fast_forward=fast, check_invariants=check))
    if spy is not None:  # per step: group step?, then every running request's stored counters
        scheduler = sim.scheduler
        original = scheduler.schedule

        def schedule():
            out = original()
            spy.append((out.group is not None, [
                (r.request_id, r.num_tokens, r.num_computed_tokens, r.g0, r.steady)
                for r in scheduler.running]))
            return out

        scheduler.schedule = schedule  # type: ignore[method-assign]
    return sim.run()


@hyp_settings(max_examples=50, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(replay_setup())
def test_fast_path_is_identical_over_every_field(setup) -> None:
    trace, settings, cache, options, load = setup
    plain = _run(trace, settings, cache, options, load, fast=False, check=True)
    check_result(trace, plain)
    checked_path: list = []
    unchecked_path: list = []
    fast_checked = _run(trace, settings, cache, options, load, fast=True, check=True,
                        spy=checked_path)
    fast = _run(trace, settings, cache, options, load, fast=True, check=False,
                spy=unchecked_path)
    assert_identical(plain, fast_checked)
    assert_identical(plain, fast)
    # The checks read the group and change nothing: the same steps are group steps and
    # every stored (lagging) counter is the same, step by step.
    assert checked_path == unchecked_path
    # What the example exercised (pytest --hypothesis-show-statistics).
    group_steps = sum(group for group, _ in unchecked_path)
    event("fast path refused" if options["extra"] or options["speculative"] else
          "group steps" if group_steps else "no group step")
    if plain.counters["preemptions"]:
        event("preempts")


def test_generated_settings_take_group_steps() -> None:
    """The property test above is not vacuous: its default-like examples run group steps."""
    trace = random_trace(5, 30, max_output=200, rate=30.0)
    path: list = []
    _run(trace, SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=16),
         CacheSettings(num_gpu_blocks=300), {"record_steps": True}, OpenLoop(),
         fast=True, check=True, spy=path)
    assert sum(group for group, _ in path) > len(path) // 2


def test_generated_async_settings_take_group_steps() -> None:
    """...and so do its async examples: the async decode group runs, joins and leaves
    (finishing members, preemptions under a small pool) while identical to the plain path."""
    trace = random_trace(5, 30, max_output=200, rate=30.0)
    for blocks in (300, 60):
        path: list = []
        settings = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=16)
        cache = CacheSettings(num_gpu_blocks=blocks)
        options = {"record_steps": True, "async_scheduling": True}
        fast = _run(trace, settings, cache, options, OpenLoop(), fast=True, check=True,
                    spy=path)
        assert sum(group for group, _ in path) > len(path) // 2
        plain = _run(trace, settings, cache, options, OpenLoop(), fast=False, check=True)
        assert_identical(plain, fast)
        assert (plain.counters["preemptions"] > 0) == (blocks == 60)


def test_group_step_items_expire_when_the_scheduler_moves_on() -> None:
    """``items()`` of a group step reads live membership: after the step is applied, or
    the next one is scheduled, it raises instead of listing another step's members."""
    from tuner.sim.request import SimRequest

    s = Scheduler(SchedulerSettings(max_num_batched_tokens=64, max_num_seqs=4),
                  CacheSettings(num_gpu_blocks=100), SimOptions())
    s.add_request(SimRequest(request_id="a", index=0, arrival_s=0.0, num_prompt_tokens=4,
                             max_tokens=50, block_size=16))
    s.update_from_output(s.schedule(), 1.0)  # prefill; "a" joins the group
    out = s.schedule()
    assert out.group is not None and list(out.items()) == [(s.running[0], 1)]
    assert out.num_scheduled_tokens() == {"a": 1}
    s.update_from_output(out, 2.0)
    with pytest.raises(RuntimeError, match="after the scheduler applied it"):
        out.num_scheduled_tokens()
    first = s.schedule()
    s.schedule()  # the next step, before ``first`` was applied
    with pytest.raises(RuntimeError):
        list(first.items())


def _short_group_steps(trace, blocks: int, block_size: int, async_scheduling: bool,
                       fenced: bool = False) -> list[tuple[int, int]]:
    """Replay ``trace`` on the fast path and on the plain path (per-step checks on), assert
    identical records, and return ``(requests that fit, requests left)`` of every run
    between failing allocations in a group step that ran short of blocks
    (``DecodeGroup._run_preempting``, ``_fitting_prefix``)."""
    from tuner.sim.decode_group import DecodeGroup

    shorts: list[tuple[int, int]] = []
    original = DecodeGroup._fitting_prefix

    def spy(self, work, start):
        fit = original(self, work, start)
        shorts.append((fit, len(work) - start))
        return fit

    settings = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=24)
    cache = CacheSettings(num_gpu_blocks=blocks, block_size=block_size)
    options: dict = {"record_steps": True, "async_scheduling": async_scheduling}
    if fenced:  # a connector under async: the block fence ends a loop at a busy victim
        options["kv_offload"] = OffloadSettings(
            num_chunks=40, bytes_per_block=1 << 16, load_bytes_per_s=1e9,
            store_bytes_per_s=1e9, latency_s=1e-4)
    DecodeGroup._fitting_prefix = spy  # type: ignore[method-assign]
    try:
        fast = _run(trace, settings, cache, options, OpenLoop(), fast=True, check=True)
    finally:
        DecodeGroup._fitting_prefix = original  # type: ignore[method-assign]
    plain = _run(trace, settings, cache, options, OpenLoop(), fast=False, check=True)
    assert_identical(plain, fast)
    return shorts


@hyp_settings(max_examples=15, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 10_000), tokens=st.integers(400, 1500),
       block_size=st.sampled_from([1, 4, 16]), async_scheduling=st.booleans(),
       fenced=st.booleans(), with_output_hashes=st.booleans())
def test_short_group_steps_batch_the_requests_before_the_first_failure_generated(
        seed: int, tokens: int, block_size: int, async_scheduling: bool, fenced: bool,
        with_output_hashes: bool) -> None:
    """A group step short of free blocks (fcfs) runs the requests between two failing
    allocations as one group step does (members batched) and vLLM's preempting loop for
    the ones that fail (``DecodeGroup._fitting_prefix``): records identical to the plain
    path, under small pools that preempt, in both modes, with and without the block
    fence."""
    trace = random_trace(seed, 30, block_size=block_size,
                         max_input=300 if block_size > 1 else 80, max_output=200,
                         with_output_hashes=with_output_hashes, rate=30.0)
    shorts = _short_group_steps(trace, max(8, tokens // block_size), block_size,
                                async_scheduling, fenced and async_scheduling)
    event("short group steps with a batched run" if any(fit for fit, _ in shorts)
          else "short group steps, none batched" if shorts else "no short group step")


def test_short_group_steps_do_batch_a_prefix() -> None:
    """The generated test above is not vacuous: short group steps occur in both modes and
    some run requests as a group step does, before a failure and after a preemption
    (with none, the batching would go untested)."""
    trace = random_trace(5, 30, block_size=4, max_output=200, rate=30.0,
                         with_output_hashes=True)
    for async_scheduling in (False, True):
        shorts = _short_group_steps(trace, 250, 4, async_scheduling)
        assert shorts, "no group step ran short of blocks"
        assert any(fit for fit, _ in shorts)
        assert any(fit and fit < left for fit, left in shorts)  # a run ended by a failure
