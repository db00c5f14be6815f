"""Disaggregated prefill/decode on the twin (tuner.sim.disagg): the proxy's flow, the NIXL
pull connector's waiting and held blocks, the TTFT split, and the fast path's contract."""

from __future__ import annotations


import numpy as np
import pytest
from sim_helpers import Req, nonlinear_step, prompt_hashes, session_trace

from tuner.errors import ConfigError
from tuner.sim.disagg import PDSettings
from tuner.sim.disagg.simulator import TTFT_PARTS, PDPool, PDSimulator
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

SETTINGS = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=32)
CACHE = CacheSettings(num_gpu_blocks=400)
LINK = dict(bytes_per_token_rank=131072, link_bytes_per_s=45e9, link_latency_s=50e-6)


def _trace(n: int = 120, seed: int = 1, rate: float = 20.0) -> list[Req]:
    return session_trace(n, seed, rate)


def _run(reqs, pd: PDSettings, *, decode_cache: CacheSettings = CACHE, **options):
    sim = PDSimulator(reqs, PDPool(SETTINGS, CACHE, nonlinear_step),
                      PDPool(SETTINGS, decode_cache, nonlinear_step), pd,
                      options=SimOptions(**options))
    return sim, sim.run()


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("shape", [(1, 2), (2, 1)])
def test_every_request_is_prefilled_once_read_once_and_decoded(async_scheduling, shape):
    reqs = _trace()
    pd = PDSettings(num_prefill=shape[0], num_decode=shape[1], **LINK)
    sim, result = _run(reqs, pd, async_scheduling=async_scheduling, check_invariants=True)
    assert result.counters["num_finished"] == len(reqs)
    assert result.counters["pd_reads"] == len(reqs)
    assert result.num_gpus == sum(shape)
    # the user's record is the decoder's: every output token, TTFT from the arrival
    assert [r.output_len for r in result.requests] == [r.output_len for r in reqs]
    assert set(result.requests.engine) <= set(range(shape[0], sum(shape)))
    # every prefill engine got requests (round robin) and handed every one off
    assert [e.num_finished for e in sim.prefill] == [e.num_added for e in sim.prefill]
    assert all(e.num_added > 0 for e in sim.engines)
    # the held blocks were all released
    assert all(e.connector.num_held_blocks == 0 for e in sim.prefill)


def test_the_ttft_split_adds_up_to_each_request_s_ttft():
    reqs = _trace()
    sim, result = _run(reqs, PDSettings(num_prefill=1, num_decode=2, **LINK))
    parts = sim.ttft_parts()
    ttft = np.array([r.first_token_s - r.arrival_s for r in result.requests])
    assert np.allclose(sum(parts[k] for k in TTFT_PARTS), ttft)
    for key in TTFT_PARTS:
        assert (parts[key] >= -1e-12).all(), key
    assert (parts["transfer"] > 0).all() and (parts["prefill"] > 0).all()
    assert (parts["first_decode"] > 0).all()  # the decoder recomputes the last token
    assert result.counters["pd_ttft_transfer_mean_s"] == pytest.approx(parts["transfer"].mean())


def test_the_read_is_the_prompt_beyond_the_decoder_s_local_hit():
    """Two requests with one 40-block prompt, far apart, to one decoder: the first reads
    all 40 blocks, the second only the last (partial-last-token rule: 39 hit)."""
    hashes = prompt_hashes(0, 640, shared_blocks=40, unique=0)
    reqs = [Req("a", 0.0, 640, 4, hashes), Req("b", 5.0, 640, 4, hashes)]
    pd = PDSettings(num_prefill=1, num_decode=1, **LINK)
    sim, result = _run(reqs, pd)
    assert result.counters["pd_read_blocks"] == 40 + 1
    assert result.counters["pd_decode_local_hit_tokens"] == 39 * 16
    start_a, end_a = sim.reads[0]
    start_b, end_b = sim.reads[1]
    assert end_a - start_a == pytest.approx(pd.transfer_s(40))
    assert end_b - start_b == pytest.approx(pd.transfer_s(1))


def test_prefill_blocks_are_held_until_the_decoder_has_read_them():
    """A slow link (1 s latency): the prefill instance's blocks stay referenced for the
    whole read, then return to the free queue."""
    reqs = [Req("a", 0.0, 640, 4, prompt_hashes(0, 640, shared_blocks=40, unique=0))]
    pd = PDSettings(num_prefill=1, num_decode=1, bytes_per_token_rank=131072,
                    link_bytes_per_s=45e9, link_latency_s=1.0)
    sim = PDSimulator(reqs, PDPool(SETTINGS, CACHE, nonlinear_step),
                      PDPool(SETTINGS, CACHE, nonlinear_step), pd)
    prefill = sim.prefill[0]
    pool = prefill.scheduler.kv_cache_manager.block_pool
    seen: list[tuple[float, int]] = []
    real = prefill.connector.release_until

    def spy(now_s: float) -> None:
        seen.append((now_s, prefill.connector.num_held_blocks))
        real(now_s)

    prefill.connector.release_until = spy
    sim.run()
    start, end = sim.reads[0]
    assert end - start > 1.0
    # held with 40 blocks referenced until the read ended, released at the end
    assert prefill.connector.num_held == 1
    assert prefill.connector.held_block_s == pytest.approx(
        40 * (end - sim.prefill_times[0][1]))
    assert pool.ref_cnt[1:].sum() == 0


def test_a_transfer_that_lands_while_the_decoder_is_kv_full_waits_and_finishes():
    reqs = _trace(n=80, rate=60.0)
    small = CacheSettings(num_gpu_blocks=120)
    sim, result = _run(reqs, PDSettings(num_prefill=2, num_decode=1, **LINK),
                       decode_cache=small, check_invariants=True)
    assert result.counters["num_finished"] == len(reqs)
    # the case exercised what it is named after: the decoder was full (it preempted)
    # and handed-off requests waited there for blocks before their reads could start
    assert sim.decode[0].scheduler.num_preemptions > 0
    assert result.counters["pd_ttft_decode_queue_p50_s"] > 0.1


def test_heterogeneous_tp_prices_the_busiest_nic():
    base = dict(bytes_per_token_rank=1000.0, link_bytes_per_s=1e6, link_latency_s=0.0,
                block_size=16)
    # 4 decode ranks reading from 1 prefill rank: each prefill NIC sends 4 shards
    assert PDSettings(1, 1, prefill_tp=1, decode_tp=4, **base).transfer_s(10) == \
        pytest.approx(4 * 10 * 16 * 1000 / 1e6)
    # 1 decode rank reading from 4 prefill ranks: its own NIC receives one shard
    assert PDSettings(1, 1, prefill_tp=4, decode_tp=1, **base).transfer_s(10) == \
        pytest.approx(10 * 16 * 1000 / 1e6)


def test_the_sync_fast_path_is_identical_to_the_plain_step():
    reqs = _trace()
    pd = PDSettings(num_prefill=1, num_decode=2, **LINK)
    _, a = _run(reqs, pd, async_scheduling=False, fast_forward=True, record_steps=True)
    _, b = _run(reqs, pd, async_scheduling=False, fast_forward=False, record_steps=True)
    for name in ("requests", "steps", "itl_samples", "timeseries", "simulated_s"):
        assert repr(getattr(a, name)) == repr(getattr(b, name)), name
    assert a.counters == b.counters


def test_a_request_the_decode_pool_can_never_hold_is_refused_at_the_handoff():
    reqs = [Req("big", 0.0, 900, 200, prompt_hashes(0, 900, unique=0)),
            Req("ok", 0.1, 64, 4, prompt_hashes(1, 64, unique=1))]
    _, result = _run(reqs, PDSettings(num_prefill=1, num_decode=1, **LINK),
                     decode_cache=CacheSettings(num_gpu_blocks=40))
    assert [r.status for r in result.requests] == ["rejected", "finished"]
    assert result.counters["pd_refused_at_decode"] == 1


def test_refused_requests_release_their_held_prefill_blocks():
    """Requests the decoder refuses are never read: their prefill blocks are freed at the
    refusal. Held for good, ten of them (57 blocks each) filled the 400-block prefill cache
    and later admissions waited behind them (a replay that ends up stepping empty steps
    without end is failed by the alarm)."""
    import signal

    def hung(*_):
        raise AssertionError("the P/D replay did not finish: held blocks never released")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    try:
        reqs = [Req(f"big{i}", 0.01 * i, 900, 200, prompt_hashes(0, 900, unique=i))
                for i in range(10)]
        reqs.append(Req("ok", 1.0, 64, 4, prompt_hashes(1, 64, unique=99)))
        sim, result = _run(reqs, PDSettings(num_prefill=1, num_decode=1, **LINK),
                           decode_cache=CacheSettings(num_gpu_blocks=40))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert [r.status for r in result.requests] == ["rejected"] * 10 + ["finished"]
    assert not list(sim.prefill[0].connector.held())


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="num_decode=0"):
        PDSettings(num_prefill=1, num_decode=0, **LINK).validate()
    PDSettings(num_prefill=1, num_decode=1, variant="push", **LINK).validate()
    with pytest.raises(ConfigError, match="--pd-transfer-mode 'write': use one of pull, push"):
        PDSettings(num_prefill=1, num_decode=1, variant="write", **LINK).validate()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_closed_loop_replacement_misses_a_busy_prefill_instance_s_next_step(
        async_scheduling):
    """1P1D, a closed loop of 3, prompts of 1,200 tokens (three 512-token chunks) and 200:
    a slot frees when the decoder finishes; the replacement goes to the prefill instance,
    which, when busy, has scheduled again before the client's new request exists
    (docs/step-time-model.md §1.4): its first prefill schedule is after the instant its
    slot freed; an idle prefill instance takes it at once. Without the missed step a busy
    instance takes some of them at that very instant."""
    from tuner.sim.load import ClosedLoop

    reqs = [Req(f"r{i}", 0.0, 1200 if i % 2 == 0 else 200, 3 + i % 4, [])
            for i in range(16)]
    pd = PDSettings(num_prefill=1, num_decode=1, **LINK)

    def replacements(misses: bool) -> list[tuple[float, float, bool]]:
        sim = PDSimulator(reqs, PDPool(SETTINGS, CACHE, lambda batch: 0.5),
                          PDPool(SETTINGS, CACHE, lambda batch: 0.5), pd,
                          options=SimOptions(async_scheduling=async_scheduling,
                                             check_invariants=True),
                          load=ClosedLoop(3, replacement_misses_step=misses))
        result = sim.run()
        assert result.counters["num_finished"] == len(reqs)
        times = sim.prefill_times  # index -> (first prefill schedule, prefill done, ..)
        out = []
        for i, r in enumerate(result.requests):
            busy = any(times[j][0] <= r.arrival_s < times[j][1] for j in times if j != i)
            out.append((r.arrival_s, times[i][0], busy))
        assert [arrival for arrival, _, _ in out[:3]] == [0.0] * 3  # the first C
        assert out[0][1] == 0.0
        return out[3:]

    missed = replacements(True)
    assert sum(busy for *_, busy in missed) >= 2
    for arrival, first, busy in missed:
        assert first > arrival if busy else first == arrival
    assert any(busy and first == arrival for arrival, first, busy in replacements(False))
