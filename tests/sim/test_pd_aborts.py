"""A request aborted while its KV is in flight to the decoder (tuner.sim.disagg.engines
DecodeEngine.apply_aborts): out of WAITING_FOR_REMOTE_KVS at once, its decoder blocks held
until the read is reported, the prefill instance's held blocks released at the read's end
as for any read; an abort at another stage is not replayed."""

from __future__ import annotations

import pytest
from sim_helpers import Req, nonlinear_step, prompt_hashes

from tuner.sim.disagg import PDSettings
from tuner.sim.disagg.simulator import PDPool, PDSimulator
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

SETTINGS = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=16)
CACHE = CacheSettings(num_gpu_blocks=200)
#: a slow link: each 6-block read takes ~0.1 s, many decode steps
SLOW = dict(bytes_per_token_rank=131072, link_bytes_per_s=1.2e8, link_latency_s=50e-6)


def _reqs() -> list[Req]:
    return [Req(f"r{i}", 0.02 * i, 96, 6, prompt_hashes(i, 96, shared_blocks=0, unique=6))
            for i in range(5)]


def _run(aborts=None, async_scheduling=False):
    pd = PDSettings(num_prefill=1, num_decode=1, **SLOW)
    options = SimOptions(async_scheduling=async_scheduling, check_invariants=True,
                         record_steps=True, fast_forward=False)
    sim = PDSimulator(_reqs(), PDPool(SETTINGS, CACHE, nonlinear_step),
                      PDPool(SETTINGS, CACHE, nonlinear_step), pd, options=options,
                      aborts=aborts)
    return sim, sim.run()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_abort_during_the_read_frees_the_decoder_blocks_at_the_read_s_end(async_scheduling):
    base, _ = _run(async_scheduling=async_scheduling)
    start, end = base.reads[2]
    assert end - start > 0.05  # the read spans many steps
    when = (start + end) / 2
    sim, result = _run({2: when}, async_scheduling)
    status = [r.status for r in result.requests]
    assert status == ["finished", "finished", "aborted", "finished", "finished"]
    assert result.counters["pd_aborted_in_transfer"] == 1
    decoder = sim.decode[0]
    steps = decoder.steps
    # out of WAITING_FOR_REMOTE_KVS from the first steps after the abort (async: the
    # step in the batch queue was scheduled before it), long before the read's end
    waited = [s.start_s for s in steps if "r2" in s.waiting_for_kv]
    assert waited and max(waited) < (when + end) / 2
    # its blocks stay allocated until the read is reported (the first update at or
    # after its end), then come back
    freed = decoder.connector.aborted_freed_s["r2"]
    assert end <= freed < end + 0.05
    # the read went on: the prefill instance released its blocks at the read's end
    assert sim.reads[2] == base.reads[2]
    assert all(e.connector.num_held_blocks == 0 for e in sim.prefill)
    assert decoder.scheduler.kv_cache_manager.usage == 0.0
    assert not decoder.live and result.counters["num_finished"] == 4


def test_an_abort_before_the_read_started_is_not_replayed():
    base, _ = _run()
    start, _ = base.reads[4]
    sim, result = _run({4: start - 1e-4})
    assert [r.status for r in result.requests][4] == "finished"
    assert result.counters["pd_aborted_in_transfer"] == 0
