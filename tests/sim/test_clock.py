"""The replay clock's halves (tuner.sim.clock): arrivals, batch launches, the depth rule.

Both loops (tuner.sim.loop.ReplayLoop, tuner.sim.fleet.loop.FleetLoop) run on these
objects; the last tests check that the rules exist once, so a loop cannot grow its own
copy again.
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass
from typing import Any

import pytest

from tuner.sim.batch import StepBatch
from tuner.sim.clock import (INF, Arrivals, BatchQueue, batch_queue_depth,
                             launch_price_function, rank_price_function)
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.loop import AdmissionRules

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tuner"
RULES = AdmissionRules(block_size=16, num_gpu_blocks=100, max_model_len=4096)


@dataclass
class Src:
    arrival_s: float
    input_len: int = 10
    output_len: int = 2


class Sink:
    def __init__(self) -> None:
        self.log: list[tuple[str, int, float]] = []

    def add_request(self, index: int, source: Any, arrival_s: float) -> None:
        self.log.append(("add", index, arrival_s))

    def reject_request(self, index: int, source: Any, arrival_s: float) -> None:
        self.log.append(("reject", index, arrival_s))


def test_batch_queue_depth_is_two_under_async_scheduling() -> None:
    assert (batch_queue_depth(True), batch_queue_depth(False)) == (2, 1)


def test_open_loop_arrivals_issue_at_arrival_over_speedup_and_refuse_at_the_door() -> None:
    pairs = [(0, Src(1.0)), (1, Src(2.0, input_len=0)), (2, Src(2.0)), (3, Src(9.0))]
    arrivals, sink = Arrivals(iter(pairs), RULES, OpenLoop(speedup=2.0)), Sink()
    assert arrivals.next_arrival_s(0.0) == arrivals.next_s == 0.5
    arrivals.issue_due(0.4, sink)
    assert sink.log == []
    arrivals.issue_due(1.0, sink)
    assert sink.log == [("add", 0, 0.5), ("reject", 1, 1.0), ("add", 2, 1.0)]
    assert (arrivals.num_issued, arrivals.in_flight, arrivals.next_s) == (3, 2, 4.5)
    arrivals.issue_due(4.5, sink)
    assert arrivals.next_arrival_s(5.0) == INF and arrivals.next_s == INF


def test_arrivals_read_the_next_pair_only_after_the_sink_took_the_last() -> None:
    read: list[int] = []

    def pairs():
        for i in range(3):
            read.append(i)
            yield i, Src(float(i))

    class Checking(Sink):
        def add_request(self, index: int, source: Any, arrival_s: float) -> None:
            assert read[-1] == index  # the next pair is not read yet
            super().add_request(index, source, arrival_s)

    Arrivals(pairs(), RULES, OpenLoop()).issue_due(5.0, Checking())
    assert read == [0, 1, 2]


def test_closed_loop_arrivals_fill_free_slots_at_the_current_time() -> None:
    """Without the missed step (the benchmark fit's recording): a freed slot's
    replacement is due at once."""
    pairs = [(i, Src(100.0 * i)) for i in range(4)]
    arrivals = Arrivals(iter(pairs), RULES, ClosedLoop(2, replacement_misses_step=False))
    sink = Sink()
    arrivals.issue_due(3.0, sink)
    assert sink.log == [("add", 0, 3.0), ("add", 1, 3.0)]
    assert arrivals.next_arrival_s(3.0) == INF  # both slots taken
    arrivals.release(1, 7.0)  # one finished
    assert arrivals.next_arrival_s(7.0) == 7.0 and not arrivals.next_is_on_the_way()
    arrivals.issue_due(7.0, sink)
    assert sink.log[-1] == ("add", 2, 7.0) and arrivals.in_flight == 2


def test_a_closed_loop_replacement_misses_the_schedule_at_its_slots_instant() -> None:
    """vLLM's engine core schedules again before the client's replacement exists
    (docs/step-time-model.md §1.4): a slot freed at 7 is not filled before a schedule at
    7, but before the next one, with the replacement's arrival at 7 (the client sent it
    then); the first ``concurrency`` are free at once; a refused replacement leaves its
    slot (and its time) to the next request; an idle engine takes it at once."""
    rules = AdmissionRules(block_size=16, num_gpu_blocks=100, max_model_len=64)
    pairs = [(0, Src(0.0)), (1, Src(0.0)), (2, Src(0.0, input_len=100)), (3, Src(0.0)),
             (4, Src(0.0)), (5, Src(0.0))]
    arrivals, sink = Arrivals(iter(pairs), rules, ClosedLoop(2)), Sink()
    arrivals.issue_due(0.0, sink)
    assert sink.log == [("add", 0, 0.0), ("add", 1, 0.0)]  # the first C: at once
    arrivals.release(1, 7.0)
    assert arrivals.next_arrival_s(7.0) == 7.0 and arrivals.next_is_on_the_way()
    arrivals.issue_due(7.0, sink)  # the schedule at 7 does not see it
    assert len(sink.log) == 2 and arrivals.in_flight == 1
    arrivals.issue_due(7.5, sink)  # the next schedule does: refused 2, then 3, sent at 7
    assert sink.log[2:] == [("reject", 2, 7.0), ("add", 3, 7.0)]
    assert arrivals.next_arrival_s(7.5) == INF and not arrivals.next_is_on_the_way()
    arrivals.release(2, 9.0)
    arrivals.issue_due(9.0, sink)
    assert len(sink.log) == 4
    arrivals.engine_idle()  # nothing left to run: the engine blocks on its input queue
    assert arrivals.next_arrival_s(9.0) == 9.0 and not arrivals.next_is_on_the_way()
    arrivals.issue_due(9.0, sink)
    assert sink.log[4:] == [("add", 4, 9.0), ("add", 5, 9.0)]
    assert arrivals.next_arrival_s(9.0) == INF


def test_arrivals_refuse_an_unknown_load() -> None:
    with pytest.raises(TypeError, match="OpenLoop or ClosedLoop"):
        Arrivals([], RULES, "open")  # type: ignore[arg-type]


def test_batch_queue_runs_the_gpu_back_to_back_and_applies_outputs_after_the_cpu() -> None:
    """Depth 2, CPU 2 s and GPU 5 s a batch: batch 0 launches at 2 and ends at 7; batch 1,
    scheduled at 2, launches at 4 but starts when the GPU is free (7) and ends at 12."""
    queue = BatchQueue(2)
    assert queue.launch("a", 0.0, 2.0, 5.0) == 2.0
    assert queue.launch("b", 2.0, 2.0, 5.0) == 7.0
    assert (queue.cpu_free_s, queue.gpu_free_s, queue.outputs_s()) == (4.0, 12.0, 7.0)
    assert queue.pop(4.0) == ("a", 7.0)  # the CPU waits for the GPU
    assert queue.pop(20.0) == ("b", 20.0)  # the GPU's tokens wait for the CPU
    slow_cpu = BatchQueue(1)
    slow_cpu.launch("c", 0.0, 3.0, 1.0)
    assert slow_cpu.outputs_s() == 4.0 and slow_cpu.pop(0.0) == ("c", 4.0)
    with pytest.raises(ValueError, match=">= 1"):
        BatchQueue(0)


class Parts:
    couples_ranks = True

    def step_time_s(self, batch: StepBatch) -> float:
        return 0.5

    def step_parts_s(self, batch: StepBatch) -> tuple[float, float]:
        return 0.125, 0.375

    def rank_step_time_s(self, batch: StepBatch, group_tokens: int) -> float:
        return 0.5 + group_tokens


def test_launch_prices_one_total_at_depth_one_and_the_parts_deeper() -> None:
    batch = StepBatch(num_decode_reqs=1, decode_ctx_tokens=1)
    assert launch_price_function(Parts(), 1)(batch) == (0.0, 0.5)
    assert launch_price_function(Parts(), 2)(batch) == (0.125, 0.375)
    assert launch_price_function(lambda b: 0.25, 2)(batch) == (0.0, 0.25)
    assert rank_price_function(Parts())(batch, 3) == 3.5  # type: ignore[misc]
    assert rank_price_function(lambda b: 0.25) is None


# ----------------------------------------------------------------- each rule exists once


def _trees(*packages: str) -> dict[str, ast.Module]:
    out = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            out[str(path.relative_to(ROOT.parent))] = ast.parse(path.read_text())
    return out


def _where(trees: dict[str, ast.Module], found: Any) -> list[str]:
    return sorted({f"{name}:{node.lineno}" for name, tree in trees.items()
                   for node in ast.walk(tree) if found(node)})


def test_the_depth_rule_is_written_once() -> None:
    """"async => a batch queue of 2" is ``batch_queue_depth``'s alone: no ``2 if .. else
    1`` and no literal depth handed to a loop anywhere else in tuner/."""
    def depth_rule(node: ast.AST) -> bool:
        if isinstance(node, ast.IfExp):
            values = {getattr(node.body, "value", None), getattr(node.orelse, "value", None)}
            return values == {1, 2}
        return (isinstance(node, ast.keyword) and node.arg == "batch_queue_depth"
                and isinstance(node.value, (ast.IfExp, ast.Constant)))

    trees = _trees(".")
    rule = next(node for node in ast.walk(trees["tuner/sim/clock.py"])
                if isinstance(node, ast.FunctionDef) and node.name == "batch_queue_depth")
    line = next(node.lineno for node in ast.walk(rule) if depth_rule(node))
    assert _where(trees, depth_rule) == [f"tuner/sim/clock.py:{line}"]


def test_the_arrivals_clock_is_written_once() -> None:
    """Only tuner.sim.clock turns a trace arrival into replay time (``arrival_s /
    speedup``), reads a closed loop's ``concurrency`` or defines ``next_arrival_s``,
    among the replay loops (tuner/sim) and the vLLM-core drivers that run them."""
    def arrival_over_speedup(node: ast.AST) -> bool:
        return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
                and "arrival_s" in ast.unparse(node.left)
                and "speedup" in ast.unparse(node.right))

    def reads_concurrency(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "concurrency"
                and isinstance(node.ctx, ast.Load))

    def defines_next_arrival(node: ast.AST) -> bool:
        return isinstance(node, ast.FunctionDef) and node.name == "next_arrival_s"

    trees = _trees("sim", "vllm_core")
    del trees["tuner/sim/load.py"]  # where OpenLoop and ClosedLoop check their own fields
    for rule in (arrival_over_speedup, reads_concurrency, defines_next_arrival):
        places = _where(trees, rule)
        assert places and {p.split(":")[0] for p in places} == {"tuner/sim/clock.py"}, (
            rule.__name__, places)


def test_the_batch_launch_arithmetic_is_written_once() -> None:
    """``gpu_free_s`` (the GPU clock of a batch queue) is written only by BatchQueue."""
    def writes_gpu_clock(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "gpu_free_s"
                and isinstance(node.ctx, ast.Store))

    places = _where(_trees("sim", "vllm_core"), writes_gpu_clock)
    assert places and {p.split(":")[0] for p in places} == {"tuner/sim/clock.py"}, places
