"""The shared replay loop (tuner.sim.loop) on a fake StepEngine: call order, clock, depth."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tuner.sim.batch import StepBatch
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.clock import price_function
from tuner.sim.loop import AdmissionRules, ReplayLoop

RULES = AdmissionRules(block_size=16, num_gpu_blocks=1000, max_model_len=4096)


@dataclass
class Src:
    arrival_s: float
    input_len: int = 10
    output_len: int = 2


class FakeEngine:
    """Each request needs ``output_len`` steps; one token per step for every admitted,
    unfinished request seen by ``schedule``. Logs every call in order."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.live: dict[int, int] = {}  # index -> tokens still to produce (as of schedule)
        self.pending: dict[int, int] = {}  # step -> finishing count
        self.next_step = 0

    def add_request(self, index: int, source: Src, arrival_s: float) -> None:
        self.log.append(("add", index, arrival_s))
        self.live[index] = source.output_len

    def reject_request(self, index: int, source: Src, arrival_s: float) -> None:
        self.log.append(("reject", index, arrival_s))

    def has_requests(self) -> bool:
        return any(n > 0 for n in self.live.values())

    def schedule(self, now_s: float) -> int:
        step = self.next_step
        self.next_step += 1
        members = [i for i, n in self.live.items() if n > 0]
        done = 0
        for i in members:
            self.live[i] -= 1
            done += self.live[i] == 0
        self.pending[step] = done
        self.log.append(("schedule", step, now_s, tuple(members)))
        return step

    def batch(self, step: int) -> StepBatch:
        return StepBatch(num_decode_reqs=1, decode_ctx_tokens=1)

    def start(self, step: int, start_s: float, duration_s: float) -> None:
        self.log.append(("start", step, start_s, duration_s))

    def update(self, step: int, end_s: float) -> int:
        self.log.append(("update", step, end_s))
        return self.pending.pop(step)

    def idle(self) -> None:
        self.log.append(("idle",))


def run(sources: list[Src], depth: int, load: Any = OpenLoop(), rules: AdmissionRules = RULES
        ) -> FakeEngine:
    engine = FakeEngine()
    order = sorted(range(len(sources)), key=lambda i: (sources[i].arrival_s, i))
    ReplayLoop(engine, ((i, sources[i]) for i in order), lambda batch: 1.0, rules, load=load,
               num_requests=len(sources), batch_queue_depth=depth).run()
    return engine


def calls(engine: FakeEngine, *kinds: str) -> list[tuple[Any, ...]]:
    return [c for c in engine.log if c[0] in kinds]


def test_depth_1_schedules_after_each_update() -> None:
    engine = run([Src(0.0, output_len=3)], depth=1)
    assert calls(engine, "schedule", "update") == [
        ("schedule", 0, 0.0, (0,)), ("update", 0, 1.0),
        ("schedule", 1, 1.0, (0,)), ("update", 1, 2.0),
        ("schedule", 2, 2.0, (0,)), ("update", 2, 3.0)]


def test_depth_2_schedules_next_batch_before_applying_outputs() -> None:
    """vLLM's step_with_batch_queue: schedule(N+1) before update(N); batches back to back
    on the GPU; an arrival during batch N is first seen by schedule(N+2)."""
    engine = run([Src(0.0, output_len=4), Src(0.5, output_len=1)], depth=2)
    got = calls(engine, "add", "schedule", "start", "update")
    assert got[:9] == [
        ("add", 0, 0.0),
        ("schedule", 0, 0.0, (0,)), ("start", 0, 0.0, 1.0),
        ("schedule", 1, 0.0, (0,)), ("start", 1, 1.0, 1.0),  # queued behind batch 0
        ("update", 0, 1.0),
        ("add", 1, 0.5),  # arrived during batch 0: added at the loop time 1.0
        ("schedule", 2, 1.0, (0, 1)), ("start", 2, 2.0, 1.0),  # = schedule(N+2), N = 0
    ]
    order = [(c[0], c[1]) for c in got if c[0] in ("schedule", "update")]
    # every update(N) comes after schedule(N+1) while work remains
    for n in range(engine.next_step - 1):
        assert order.index(("schedule", n + 1)) < order.index(("update", n))
    assert [c[1] for c in calls(engine, "update")] == list(range(engine.next_step))
    starts = [c[2] for c in calls(engine, "start")]
    assert starts == [float(i) for i in range(len(starts))]  # the GPU never idles


def test_idle_engine_jumps_to_next_arrival() -> None:
    engine = run([Src(0.0, output_len=1), Src(5.0, output_len=1)], depth=1)
    assert ("idle",) in engine.log
    assert ("schedule", 1, 5.0, (1,)) in engine.log


def test_closed_loop_issues_on_finish_and_on_reject() -> None:
    rules = AdmissionRules(block_size=16, num_gpu_blocks=1000, max_model_len=100)
    sources = [Src(9.0, output_len=2), Src(0.0, input_len=200), Src(0.0, output_len=1)]
    engine = run(sources, depth=1, load=ClosedLoop(1), rules=rules)
    # issue order by arrival time then index: 1 (rejected, slot freed at once), 2, then 0
    assert calls(engine, "add", "reject") == [
        ("reject", 1, 0.0), ("add", 2, 0.0), ("add", 0, 1.0)]


@pytest.mark.parametrize("depth", [1, 2])
def test_closed_loop_replacement_misses_the_step_scheduled_when_its_slot_freed(
        depth: int) -> None:
    """A closed loop of 2, 1-second steps: request 1 finishes with the update at 2 s;
    its replacement (request 2, sent at 2 s) is not in the schedule at 2 s, which vLLM's
    engine core runs before the client's new request exists, but in the next one, at
    3 s, synchronous or async (docs/step-time-model.md §1.4). Request 3's slot frees
    when the engine has nothing left: an idle engine takes it at once."""
    sources = [Src(0.0, output_len=6), Src(0.0, output_len=2), Src(0.0, output_len=2),
               Src(0.0, output_len=1)]
    engine = run(sources, depth=depth, load=ClosedLoop(2))
    log = calls(engine, "add", "schedule", "update", "idle")
    assert log[:2] == [("add", 0, 0.0), ("add", 1, 0.0)]  # the first C at once
    at = log.index(("add", 2, 2.0))
    missed = ("schedule", 2, 2.0, (0,)) if depth == 1 else ("schedule", 3, 2.0, (0,))
    assert log[at - 2:at] == [missed, ("update", 2, 3.0)]  # sent at 2, added before 3
    assert log[at + 1][:3] == ("schedule", 3 if depth == 1 else 4, 3.0)
    assert 2 in log[at + 1][3]
    if depth == 1:  # request 2 finishes at 5 s while request 0 still runs: missed again
        assert log.index(("add", 3, 5.0)) > log.index(("schedule", 5, 5.0, (0,)))
        assert ("schedule", 6, 6.0, (3,)) in log
    else:  # both finish with the update at 6 s: the engine idles and takes it at once
        assert log[-4:] == [("idle",), ("add", 3, 6.0), ("schedule", 6, 6.0, (3,)),
                            ("update", 6, 7.0)]


def test_closed_loop_without_the_missed_step_joins_the_next_schedule() -> None:
    """``replacement_misses_step=False`` (the benchmark fit's recording): the replacement
    is in the schedule at the instant its slot freed."""
    sources = [Src(0.0, output_len=6), Src(0.0, output_len=2), Src(0.0, output_len=2)]
    engine = run(sources, depth=1, load=ClosedLoop(2, replacement_misses_step=False))
    log = calls(engine, "add", "schedule")
    assert log[log.index(("add", 2, 2.0)) + 1] == ("schedule", 2, 2.0, (0, 2))


def test_open_loop_speedup_scales_arrivals() -> None:
    engine = run([Src(4.0, output_len=1)], depth=1, load=OpenLoop(speedup=2.0))
    assert calls(engine, "add") == [("add", 0, 2.0)]


@pytest.mark.parametrize("input_len,output_len,chunked,rejected", [
    (0, 5, True, True), (5, 0, True, True), (90, 11, True, True), (90, 10, True, False),
    (60, 10, False, True), (50, 10, True, False), (50, 10, False, False)])
def test_admission_rules(input_len: int, output_len: int, chunked: bool, rejected: bool) -> None:
    rules = AdmissionRules(block_size=16, num_gpu_blocks=100, max_model_len=100,
                           enable_chunked_prefill=chunked, max_num_batched_tokens=64)
    assert rules.rejects(input_len, output_len) is rejected


def test_admission_rules_cache_bound() -> None:
    rules = AdmissionRules(block_size=16, num_gpu_blocks=5, max_model_len=1000)
    assert not rules.rejects(60, 5)  # 64 tokens computed: 4 blocks of the 4 usable
    assert rules.rejects(60, 6)


def test_price_function_prefers_step_time_s() -> None:
    class Model:
        def step_time_s(self, batch: StepBatch) -> float:
            return 2.0

        def __call__(self, batch: StepBatch) -> float:
            return 3.0

    assert price_function(Model())(StepBatch()) == 2.0
    assert price_function(lambda b: 4.0)(StepBatch()) == 4.0
    with pytest.raises(TypeError):
        price_function(5)


def test_batch_queue_depth_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ReplayLoop(FakeEngine(), [], lambda b: 1.0, RULES, batch_queue_depth=0)


class Split:
    """A step-time model with a CPU and a GPU part per step (``step_parts_s``)."""

    def __init__(self, cpu: float, gpu: float) -> None:
        self.cpu, self.gpu = cpu, gpu

    def step_time_s(self, batch: StepBatch) -> float:
        return self.cpu + self.gpu

    def step_parts_s(self, batch: StepBatch) -> tuple[float, float]:
        return self.cpu, self.gpu


def run_split(sources: list[Src], depth: int, model: Split) -> FakeEngine:
    engine = FakeEngine()
    order = sorted(range(len(sources)), key=lambda i: (sources[i].arrival_s, i))
    ReplayLoop(engine, ((i, sources[i]) for i in order), model, RULES,
               num_requests=len(sources), batch_queue_depth=depth).run()
    return engine


def test_depth_1_period_is_cpu_plus_gpu() -> None:
    """Sync: schedule, input prep, then the GPU; the next schedule waits for update."""
    engine = run_split([Src(0.0, output_len=3)], depth=1, model=Split(cpu=0.25, gpu=1.0))
    assert calls(engine, "schedule", "start", "update") == [
        ("schedule", 0, 0.0, (0,)), ("start", 0, 0.0, 1.25), ("update", 0, 1.25),
        ("schedule", 1, 1.25, (0,)), ("start", 1, 1.25, 1.25), ("update", 1, 2.5),
        ("schedule", 2, 2.5, (0,)), ("start", 2, 2.5, 1.25), ("update", 2, 3.75)]


def test_depth_2_gpu_bound_runs_batches_back_to_back() -> None:
    """Async, GPU 1.0 > CPU 0.25: the CPU launches N+1 while N runs; period = GPU.

    Hand-computed: schedule 0 at 0, launched 0.25, GPU 0.25-1.25; schedule 1 at 0.25,
    launched 0.5, waits for the GPU: 1.25-2.25; the CPU waits for batch 0 (1.25),
    updates it, schedules 2 at 1.25, launched 1.5, GPU 2.25-3.25; update 1 at 2.25;
    update 2 at 3.25 (nothing left to schedule)."""
    engine = run_split([Src(0.0, output_len=3)], depth=2, model=Split(cpu=0.25, gpu=1.0))
    assert calls(engine, "schedule", "start", "update") == [
        ("schedule", 0, 0.0, (0,)), ("start", 0, 0.25, 1.0),
        ("schedule", 1, 0.25, (0,)), ("start", 1, 1.25, 1.0),
        ("update", 0, 1.25),
        ("schedule", 2, 1.25, (0,)), ("start", 2, 2.25, 1.0),
        ("update", 1, 2.25),
        ("update", 2, 3.25)]


def test_depth_2_cpu_bound_period_is_cpu() -> None:
    """Async, CPU 1.0 > GPU 0.25: the GPU waits for each launch; period = CPU, and a
    batch's outputs are applied only once the CPU has launched the next one.

    Hand-computed: schedule 0 at 0, launched 1, GPU 1-1.25; schedule 1 at 1, launched 2,
    GPU 2-2.25; update 0 at max(1.25, 2) = 2; schedule 2 at 2, launched 3, GPU 3-3.25;
    update 1 at 3; update 2 at 3.25."""
    engine = run_split([Src(0.0, output_len=3)], depth=2, model=Split(cpu=1.0, gpu=0.25))
    assert calls(engine, "schedule", "start", "update") == [
        ("schedule", 0, 0.0, (0,)), ("start", 0, 1.0, 0.25),
        ("schedule", 1, 1.0, (0,)), ("start", 1, 2.0, 0.25),
        ("update", 0, 2.0),
        ("schedule", 2, 2.0, (0,)), ("start", 2, 3.0, 0.25),
        ("update", 1, 3.0),
        ("update", 2, 3.25)]


def test_depth_2_arrival_during_cpu_work_is_seen_by_the_next_schedule() -> None:
    """The CPU time advances by the CPU part: a request arriving while step 0 is being
    prepared is added before schedule(1), at the CPU's time 0.5."""
    engine = run_split([Src(0.0, output_len=2), Src(0.3, output_len=1)], depth=2,
                       model=Split(cpu=0.5, gpu=1.0))
    got = calls(engine, "add", "schedule")
    assert got[:4] == [("add", 0, 0.0), ("schedule", 0, 0.0, (0,)),
                       ("add", 1, 0.3), ("schedule", 1, 0.5, (0, 1))]


def test_plain_callable_is_gpu_only_under_the_async_clock() -> None:
    from tuner.sim.clock import split_price_function

    assert split_price_function(lambda b: 0.01)(StepBatch()) == (0.0, 0.01)
    assert split_price_function(Split(0.1, 0.2))(StepBatch()) == (0.1, 0.2)


class SplitModel:
    """A nonlinear step time with a CPU part: the async clock overlaps it."""

    def step_time_s(self, batch: StepBatch) -> float:
        return sum(self.step_parts_s(batch))

    def step_parts_s(self, batch: StepBatch) -> tuple[float, float]:
        cpu = 0.002 + 4e-5 * batch.num_reqs
        gpu = (0.003 + 3e-6 * batch.num_prefill_tokens + 2e-5 * batch.num_decode_reqs
               + 1e-8 * batch.decode_ctx_tokens)
        return cpu, gpu


@pytest.mark.parametrize("seed", [0, 1])
def test_a_one_engine_fleet_runs_the_async_clock_of_the_replay_loop(seed: int) -> None:
    """FleetLoop's unit clock is ReplayLoop's at depth 2 (CPU part overlapped): one engine
    gives byte-identical records, and they differ from the sync clock's."""
    from sim_helpers import random_trace

    from tuner.sim.engine import Simulator
    from tuner.sim.fleet.simulator import FleetSimulator
    from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

    requests = random_trace(seed, n=60, rate=80.0)
    settings, cache = SchedulerSettings(max_num_seqs=8), CacheSettings(num_gpu_blocks=400)
    options = SimOptions(async_scheduling=True, record_steps=True)
    single = Simulator(requests, settings, cache, SplitModel(), options=options).run()
    fleet = FleetSimulator(requests, settings, cache, SplitModel(), options=options).run()
    for key in ("requests", "steps", "itl_samples", "timeseries", "simulated_s"):
        assert repr(getattr(single, key)) == repr(getattr(fleet, key)), key
    assert {k: fleet.counters[k] for k in single.counters} == single.counters
    sync = Simulator(requests, settings, cache, SplitModel(),
                     options=SimOptions(record_steps=True)).run()
    assert sync.simulated_s > single.simulated_s  # the overlap shortens the replay
