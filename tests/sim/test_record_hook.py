"""The twin engine's record hook (``TwinEngine.on_record``): called once per request,
right after its row is written, on every step path (plain, decode group, async,
speculative) and for rejections and the replay's unfinished requests; an observer that
raises ends the replay. ``tuner.tune.early_stop`` relies on all of it."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.sim.engine import Simulator
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions
from tuner.sim.spec_decode import from_vllm_config

from sim_helpers import Req, assert_identical, nonlinear_step, random_trace

SETTINGS = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=16)
CACHE = CacheSettings(num_gpu_blocks=1000, block_size=16)
PATHS = {
    "plain": SimOptions(fast_forward=False),
    "decode group": SimOptions(fast_forward=True),
    "async": SimOptions(fast_forward=True, async_scheduling=True),
    "speculative": SimOptions(speculative=from_vllm_config(
        {"method": "ngram", "num_speculative_tokens": 2}, "0.5")),
}


def _trace() -> list[Req]:
    """Long decoders (group steps), plus one prompt no pool of CACHE can hold: rejected."""
    reqs = random_trace(3, 12, max_input=64, max_output=400, rate=100.0)
    return reqs + [Req("too-big", reqs[-1].arrival_s + 0.01, 16 * 1000 + 16, 2, [])]


def _observed(sim: Simulator) -> list[tuple[int, str, bool]]:
    """Hook ``sim``: each call's (index, the row's status then, whether still live)."""
    calls: list[tuple[int, Any, bool]] = []
    engine = sim.engine

    def observer(index: int) -> None:
        calls.append((index, engine.table[index], index in engine.live))

    engine.on_record = observer
    return calls  # type: ignore[return-value]


@pytest.mark.parametrize("path", PATHS)
def test_every_path_calls_the_hook_once_per_request_after_its_row(path: str) -> None:
    reqs = _trace()
    options = PATHS[path]
    sim = Simulator(reqs, SETTINGS, CACHE, nonlinear_step, options=options)
    calls = _observed(sim)
    group_finishes: list[int] = []  # requests finished by a decode-group step
    update = sim.scheduler.update_from_output

    def spy(out: Any, *args: Any) -> Any:
        finished = update(out, *args)
        if out.group is not None:
            group_finishes.extend(r.index for r in finished)
        return finished

    sim.scheduler.update_from_output = spy  # type: ignore[method-assign]
    result = sim.run()

    assert sorted(index for index, _, _ in calls) == list(range(len(reqs)))
    for index, row, live in calls:
        assert repr(row) == repr(result.requests[index])  # written before the call
        assert live == (row.status == "finished")  # a finishing request is still live
    assert [row.status for _, row, _ in calls].count("rejected") == 1
    if path == "decode group":
        assert group_finishes, "the premise: requests finish inside group steps"
    # The hook observes only: the same records as a replay without it.
    assert_identical(result, Simulator(reqs, SETTINGS, CACHE, nonlinear_step,
                                       options=options).run())


def test_an_observer_that_raises_ends_the_replay() -> None:
    reqs = _trace()
    sim = Simulator(reqs, SETTINGS, CACHE, nonlinear_step, options=SimOptions())
    calls = _observed(sim)
    observe = sim.engine.on_record
    assert observe is not None

    class Enough(Exception):
        pass

    def stop_at_third(index: int) -> None:
        observe(index)
        if len(calls) == 3:
            raise Enough

    sim.engine.on_record = stop_at_third
    with pytest.raises(Enough):
        sim.run()
    assert len(calls) == 3
    _, row, live = calls[-1]
    assert live and row.status == "finished"  # raised while recording that request


def test_the_replays_end_records_live_requests_unfinished_through_the_hook() -> None:
    reqs = [Req(f"r{i}", 0.0, 32, 4, []) for i in range(3)]
    sim = Simulator(reqs, SETTINGS, CACHE, nonlinear_step, options=SimOptions())
    calls = _observed(sim)
    for i, request in enumerate(reqs[:2]):
        sim.engine.add_request(i, request, request.arrival_s)
    sim.engine.finish()
    assert [(i, row.status, live) for i, row, live in calls] == [
        (0, "unfinished", True), (1, "unfinished", True)]
