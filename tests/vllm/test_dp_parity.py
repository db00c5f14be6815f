"""Data parallelism against vLLM's own schedulers: each DP rank's steps identical.

The vllm-core backend runs one real vLLM 0.33.0 ``Scheduler`` per DP rank on the fleet
loop (tuner/vllm_core/dp_driver.py); the twin runs one scheduler twin per rank. Both
pick ranks by vLLM's internal load-balancer rule from the ranks' published counts, so a
divergence in any rank's scheduling would also move later assignments. Compared: every
rank's step records (engine by engine), the request records and the engine of each
request. Dense ranks are independent; MoE ranks (a MoE preset) step in lockstep with the
DP prefill cadence on the group's counter. Each case in the scheduling mode vLLM resolves
for the GPU, two also with ``--no-async-scheduling``.
"""

from __future__ import annotations

import pytest
from vllm_env import ParityRuns

from tuner.fidelity.parity import ParityCase, compare_steps
from tuner.perf.target import Target
from tuner.sim.settings import SchedulerSettings, SimOptions
from tuner.trace.synth import synthesize

pytestmark = pytest.mark.vllm

BS = 16


def _trace():
    return synthesize("agentic", duration_s=30, rate=10.0, seed=11, hash_block_size=BS,
                      system_prompt_tokens=(100, 300), task_tokens=100, output_tokens=80,
                      max_output_tokens=300, tool_output_tokens=80, max_tool_output_tokens=300,
                      max_context_tokens=1500, summary_tokens=200, tool_delay_s=0.3, turns=4,
                      think_time_s=1.0)


def _target(model: str, dp: int, async_scheduling: bool | None) -> Target:
    return Target(hardware="h200", model=model, dp=dp, block_size=BS, num_gpu_blocks=160,
                  max_model_len=8192, async_scheduling=async_scheduling)


_PLAIN = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=32)
#: name -> (model, dp, settings, Target.async_scheduling: None = as vLLM resolves it for
#: the GPU, False = --no-async-scheduling)
CASES = {
    "dense-dp2": ("llama-3.1-8b", 2, _PLAIN, None),
    "dense-dp3-interval": ("llama-3.1-8b", 3, _PLAIN.replace(prefill_schedule_interval=3),
                           None),
    "moe-dp2-lockstep": ("gpt-oss-120b", 2, _PLAIN, None),
    "moe-dp2-interval": ("gpt-oss-120b", 2, _PLAIN.replace(prefill_schedule_interval=4),
                         None),
    "dense-dp2-sync": ("llama-3.1-8b", 2, _PLAIN, False),
    "moe-dp2-interval-sync": ("gpt-oss-120b", 2,
                              _PLAIN.replace(prefill_schedule_interval=4), False),
}
def _cases(_version: str) -> list[ParityCase]:
    trace = _trace()
    return [ParityCase(name, trace, settings, _target(model, dp, mode),
                       options=SimOptions(prefill_interval_mode="local"))
            for name, (model, dp, settings, mode) in CASES.items()]


_results = ParityRuns(_cases)


@pytest.mark.parametrize("name", list(CASES))
def test_each_dp_rank_steps_as_vllms_scheduler(name: str) -> None:
    report, twin, vllm = _results()[name]
    assert report.identical, report.format_text()
    assert report.num_compared > 100
    assert not report.request_diffs, report.request_diffs
    assert list(twin.requests.engine) == list(vllm.requests.engine)
    dp = CASES[name][1]
    assert [e.num_steps for e in twin.engines] == [e.num_steps for e in vllm.engines]
    assert all(e.num_requests > 0 for e in vllm.engines) and len(vllm.engines) == dp
    # rank by rank (the concatenation above could hide a shift between ranks)
    at_t = at_v = 0
    for et, ev in zip(twin.engines, vllm.engines):
        part_t = twin.steps[at_t:at_t + et.num_steps]
        part_v = vllm.steps[at_v:at_v + ev.num_steps]
        at_t += et.num_steps
        at_v += ev.num_steps
        single = compare_steps(_Steps(twin, part_t), _Steps(vllm, part_v))
        assert single.identical, single.format_text()
    if name.startswith("moe"):
        assert twin.counters["dummy_steps"] == vllm.counters["dummy_steps"] > 0
    else:
        assert twin.counters["dummy_steps"] == vllm.counters["dummy_steps"] == 0


class _Steps:
    """A result seen through one rank's steps (for ``compare_steps``)."""

    def __init__(self, result, steps) -> None:
        self.steps = steps
        self.counters: dict = {}
        self.requests = []
        self.wall_s = result.wall_s
