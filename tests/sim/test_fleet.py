"""Many engines (tuner.sim.fleet): vLLM's DP load balancer, MoE lockstep, the routers,
and the fleet loop's contract that one engine replays exactly as the single-engine loop."""

from __future__ import annotations


import numpy as np
import pytest
from sim_helpers import Req, nonlinear_step, prompt_hashes, session_trace

from tuner.errors import ConfigError
from tuner.sim.engine import Simulator
from tuner.sim.fleet import RouterSettings, make_router
from tuner.sim.fleet.dp_balancer import DPLoadBalancer
from tuner.sim.fleet.engines import cached_prefix_blocks
from tuner.sim.fleet.simulator import FleetSimulator, merge_timeseries
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions


def _trace(n: int = 200, seed: int = 1, rate: float = 20.0) -> list[Req]:
    return session_trace(n, seed, rate)


SETTINGS = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=32)
CACHE = CacheSettings(num_gpu_blocks=400)


# ----------------------------------------------------------------- one engine = ReplayLoop


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("fast_forward", [True, False])
def test_one_engine_fleet_replays_as_the_single_engine_loop(seed: int, fast_forward: bool):
    """The fleet loop's event order reduces to ReplayLoop's with one engine: identical
    records on random traces (held on both twin paths)."""
    reqs = _trace(seed=seed)
    options = SimOptions(record_steps=True, fast_forward=fast_forward)
    a = Simulator(reqs, SETTINGS, CACHE, nonlinear_step, options=options).run()
    b = FleetSimulator(reqs, SETTINGS, CACHE, nonlinear_step, options=options).run()
    for name in ("requests", "steps", "itl_samples", "timeseries", "simulated_s"):
        assert repr(getattr(a, name)) == repr(getattr(b, name)), name
    assert {k: b.counters[k] for k in a.counters} == a.counters
    assert list(b.requests.engine) == [0] * len(reqs)


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("concurrency", [1, 8])
def test_one_engine_fleet_replays_a_closed_loop_as_the_single_engine_loop(
        async_scheduling: bool, concurrency: int):
    """The same under a closed loop: the fleet orders a replacement on its way after the
    schedules of its instant, the single-engine loop adds it before the next schedule
    (or at once to an idle engine); both give identical records."""
    from tuner.sim.load import ClosedLoop

    reqs = _trace(n=120, seed=4)
    options = SimOptions(record_steps=True, async_scheduling=async_scheduling)
    load = ClosedLoop(concurrency)
    a = Simulator(reqs, SETTINGS, CACHE, nonlinear_step, options=options, load=load).run()
    b = FleetSimulator(reqs, SETTINGS, CACHE, nonlinear_step, options=options,
                       load=load).run()
    for name in ("requests", "steps", "itl_samples", "timeseries", "simulated_s"):
        assert repr(getattr(a, name)) == repr(getattr(b, name)), name
    late = [r for r in a.requests if r.first_scheduled_s > r.arrival_s]
    assert late if concurrency > 1 else not late  # C = 1: the engine is idle each time


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("moe", [False, True])
def test_dp_closed_loop_replacement_misses_its_engines_next_step(async_scheduling: bool,
                                                                 moe: bool):
    """DP 2 (independent engines, or a MoE lockstep), 0.5 s steps on both ranks, a closed
    loop of 4: two long requests keep both ranks busy, so every replacement (sent when
    its predecessor finished, on either rank) is first scheduled one step later, by
    whichever rank the balancer gave it; the first 4 at once."""
    from tuner.sim.load import ClosedLoop

    reqs = ([Req(f"long{i}", 0.0, 16, 30, []) for i in range(2)]
            + [Req(f"r{i}", 0.0, 16, 2 + i % 3, []) for i in range(10)])
    result = FleetSimulator(reqs, SETTINGS, CACHE, lambda batch: 0.5, dp=2, moe=moe,
                            load=ClosedLoop(4),
                            options=SimOptions(async_scheduling=async_scheduling,
                                               check_invariants=True)).run()
    rows = list(result.requests)
    assert all(r.status == "finished" for r in rows)
    assert sorted(set(result.requests.engine)) == [0, 1]
    assert all(r.first_scheduled_s == 0.0 for r in rows[:4])
    busy_until = min(r.finish_s for r in rows[:2])
    replacements = [r for r in rows[4:] if r.arrival_s < busy_until]
    assert len(replacements) >= 6
    finishes = {r.finish_s for r in rows}
    for r in replacements:
        assert r.arrival_s in finishes
        assert r.first_scheduled_s == r.arrival_s + 0.5, r


# ----------------------------------------------------------------- vLLM's DP balancer


def test_dp_balancer_matches_a_hand_computed_assignment():
    """core_client.py:1751-1812 worked by hand: dp=2, one API server, snapshots every
    100 ms. Before any snapshot the scores are the local copies (exact in-flight count
    vs published waiting+running, whichever is larger) with the rotating scan start."""
    published = {0: (0, 0, 0.0), 1: (0, 0, 0.0)}
    lb = DPLoadBalancer(2, lambda rank: published[rank])
    # t=0: snapshot of zeros; scores [0, 0], scan from 0 -> rank 0; start -> 1
    assert lb.choose(0, 0.00) == 0
    # t=0.01: rank 0 max(inflight 1, local waiting 1) = 1, rank 1 = 0; scan from 1 -> 1
    assert lb.choose(1, 0.01) == 1
    # t=0.02: scores [1, 1], scan from 0, strict < keeps rank 0
    assert lb.choose(2, 0.02) == 0
    # t=0.03: scores [2, 1] -> rank 1
    assert lb.choose(3, 0.03) == 1
    assert lb.inflight == [2, 2]
    # the coordinator publishes at 0.1: rank 0 has 3 waiting at 90 % KV usage, rank 1
    # 2 running at 20 %: rank 0 = max(2, 3) + 3 * 6 * (0.9 - 0.5) = 10.2, rank 1 = 2
    published[0], published[1] = (3, 0, 0.9), (0, 2, 0.2)
    assert lb.scores() == [2.0, 2.0]  # not seen before the snapshot instant
    assert lb.choose(4, 0.15) == 1
    assert lb.scores()[0] == pytest.approx(10.2)
    # the snapshot replaced the local copies; rank 1's waiting got the local +1
    assert lb.lb_engines[1] == [1, 2, 0.2]
    lb.finished(4)
    lb.finished(1)
    assert lb.inflight == [2, 1]


def test_dp_balancer_spreads_a_burst_round_robin():
    """No snapshot between arrivals: the exact in-flight floor spreads a burst evenly
    (the comment at core_client.py:1780-1785)."""
    lb = DPLoadBalancer(4, lambda rank: (0, 0, 0.0))
    picks = [lb.choose(i, 0.001 * i) for i in range(12)]
    assert sorted(picks.count(r) for r in range(4)) == [3, 3, 3, 3]


# ----------------------------------------------------------------- MoE lockstep


def _linear_step(batch) -> float:
    return 0.01 + 1e-3 * batch.num_tokens


def _two_requests() -> list[Req]:
    return [Req("a", 0.0, 100, 3, prompt_hashes(1, 100)),
            Req("b", 0.005, 20, 2, prompt_hashes(2, 20))]


def _run(moe: bool):
    sim = FleetSimulator(_two_requests(), SchedulerSettings(max_num_batched_tokens=2048),
                         CacheSettings(num_gpu_blocks=200), _linear_step, dp=2, moe=moe,
                         options=SimOptions(check_invariants=True))
    return sim.run()


def test_moe_lockstep_matches_a_hand_computed_two_rank_case():
    """Step time 10 ms + 1 ms a token; a (100-token prompt, 3 tokens) at t=0 goes to
    rank 0, b (20, 2) at 5 ms to rank 1 (scores [1, 0] before any snapshot).

    step 1 [0, 110 ms]: rank 0 prefills a (110 ms), rank 1 runs a dummy batch (11 ms);
      the step takes the slowest rank's 110 ms; b, arrived during it, waits.
    step 2 [110, 140]: a decodes (11 ms), b prefills (30 ms) -> 30 ms.
    step 3 [140, 151]: both decode and finish.
    steps 4-16: all ranks idle, dummy batches (11 ms each) until the DP step counter
      reaches dp_sync_interval = 16 and the all-reduce ends the wave at 151 + 13 x 11.
    """
    result = _run(moe=True)
    a, b = result.requests[0], result.requests[1]
    assert (a.first_token_s, a.finish_s) == pytest.approx((0.110, 0.151))
    assert (b.first_token_s, b.finish_s) == pytest.approx((0.140, 0.151))
    assert [e.num_dummy_steps for e in result.engines] == [13, 14]
    assert [e.num_steps for e in result.engines] == [3, 2]
    assert result.simulated_s == pytest.approx(0.151 + 13 * 0.011)
    assert list(result.requests.engine) == [0, 1]


class _ExpertParallelStep:
    """10 ms + 1 ms a token of the rank's own batch, plus 1 ms a token of the whole DP
    group's (the experts each rank hosts serve every rank's tokens under EP)."""

    couples_ranks = True  # StepTimeModel's flag: ranks priced by rank_step_time_s

    def step_time_s(self, batch) -> float:
        return _linear_step(batch)

    def rank_step_time_s(self, batch, group_tokens: int) -> float:
        return _linear_step(batch) + 1e-3 * group_tokens


def test_expert_parallel_lockstep_prices_each_rank_by_the_group_tokens():
    """The two requests with expert parallelism: a rank's step also pays 1 ms per token
    of the whole group (rank_step_time_s), the lockstep takes the slowest rank.

    step 1: a prefills 100 on rank 0 (110 + 101 ms), rank 1 a dummy (11 + 101) -> 211 ms.
    step 2: a decodes (11 + 21), b prefills 20 (30 + 21) -> 51 ms, ends at 262 ms.
    step 3: both decode (11 + 2 each) -> 13 ms: both finish at 275 ms.
    13 idle dummy steps of 13 ms close the wave.
    """
    sim = FleetSimulator(_two_requests(), SchedulerSettings(max_num_batched_tokens=2048),
                         CacheSettings(num_gpu_blocks=200), _ExpertParallelStep(), dp=2,
                         moe=True, options=SimOptions(check_invariants=True))
    result = sim.run()
    a, b = result.requests[0], result.requests[1]
    assert (a.first_token_s, a.finish_s) == pytest.approx((0.211, 0.275))
    assert (b.first_token_s, b.finish_s) == pytest.approx((0.262, 0.275))
    assert result.simulated_s == pytest.approx(0.275 + 13 * 0.013)


def test_dense_ranks_are_independent_engines():
    """The same two requests on a dense model: rank 1 starts b at its arrival."""
    result = _run(moe=False)
    a, b = result.requests[0], result.requests[1]
    assert (a.first_token_s, a.finish_s) == pytest.approx((0.110, 0.132))
    assert (b.first_token_s, b.finish_s) == pytest.approx((0.035, 0.046))
    assert result.counters["dummy_steps"] == 0


def test_lockstep_hands_the_wave_counter_to_the_dp_prefill_cadence():
    """MoE ranks run prefill_schedule_interval on the DP clock: a rank that has a request
    decoding admits a new prefill only on a group step whose counter is a multiple of
    the interval, even a rank that ran dummy batches its own scheduler never counted."""
    reqs = [Req("a", 0.0, 64, 200, prompt_hashes(1, 64))] + [
        Req(f"r{i}", 0.05 + 0.037 * i, 64, 30, prompt_hashes(2 + i, 64)) for i in range(8)]
    sim = FleetSimulator(reqs, SchedulerSettings(max_num_batched_tokens=2048,
                                                 prefill_schedule_interval=4),
                         CacheSettings(num_gpu_blocks=400), _linear_step, dp=2, moe=True,
                         options=SimOptions(record_steps=True))
    result = sim.run()
    assert all(e.scheduler.dp_prefill_interval == 4 for e in sim.engines)
    # a runs through the whole test on rank 0, so rank 0's steps are the group's steps
    rank0 = [s for s in result.steps if "a" in s.num_scheduled_tokens]
    counter_of = {s.start_s: i for i, s in enumerate(rank0)}
    by_id = {r.request_id: (r, e) for r, e in zip(result.requests, result.requests.engine)}
    throttled = 0
    for step in result.steps:
        for rid in step.cached_tokens:
            if rid == "a":
                continue
            engine = by_id[rid][1]
            decoding = any(e == engine and other.request_id != rid
                           and other.first_token_s <= step.start_s < other.finish_s
                           for other, e in by_id.values())
            if decoding:
                throttled += 1
                assert counter_of[step.start_s] % 4 == 0, (rid, counter_of[step.start_s])
    assert throttled >= 4
    assert result.engines[1].num_dummy_steps > 0


# ----------------------------------------------------------------- routers


class _Src:
    def __init__(self, input_len: int, hashes=(), session_id=None):
        self.input_len = input_len
        self.block_hashes = np.asarray(hashes, dtype=np.int64)
        self.session_id = session_id


def test_round_robin_router():
    router = make_router(RouterSettings("round-robin"), 3, 1, kv_block_size=16)
    assert [router.route(i, _Src(10), 0.0) for i in range(5)] == [0, 1, 2, 0, 1]


def test_least_loaded_router_counts_what_it_sent():
    router = make_router(RouterSettings("least-loaded"), 3, 1, kv_block_size=16)
    assert [router.route(i, _Src(10), 0.0) for i in range(4)] == [0, 1, 2, 0]
    router.finished(1)  # replica 1 now has 0 in flight
    assert router.route(4, _Src(10), 0.0) == 1
    tokens = make_router(RouterSettings("least-loaded", load_metric="tokens"), 2, 1,
                         kv_block_size=16)
    assert tokens.route(0, _Src(1000), 0.0) == 0
    assert tokens.route(1, _Src(10), 0.0) == 1
    assert tokens.route(2, _Src(10), 0.0) == 1  # 10 tokens in flight < 1000
    assert tokens.route(3, _Src(10), 0.0) == 1


def test_session_router_keeps_sessions_and_hashes_consistently():
    sources = [_Src(10, session_id=f"s{i}") for i in range(400)]
    router = make_router(RouterSettings("session"), 4, 1, kv_block_size=16, sources=sources)
    first = [router.route(i, s, 0.0) for i, s in enumerate(sources)]
    again = [router.route(400 + i, s, 0.0) for i, s in enumerate(sources)]
    assert first == again  # affinity
    assert min(first.count(r) for r in range(4)) > 60  # spread over the ring
    bigger = make_router(RouterSettings("session"), 5, 1, kv_block_size=16)
    moved = sum(bigger.route(i, s, 0.0) != first[i] for i, s in enumerate(sources))
    assert moved < 0.35 * len(sources)  # consistent hashing: about 1/5 move
    # without a session id: the least-loaded replica (by in-flight requests)
    lone = make_router(RouterSettings("session"), 2, 1, kv_block_size=16)
    lone.route(0, _Src(10, session_id="x"), 0.0)
    owner = lone.owner("x")
    assert lone.route(1, _Src(10), 0.0) == 1 - owner


def test_session_router_refuses_a_trace_without_sessions():
    with pytest.raises(ConfigError, match="no session ids"):
        make_router(RouterSettings("session"), 2, 1, kv_block_size=16,
                    sources=[_Src(10), _Src(20)])


def test_prefix_aware_router_matches_a_hand_computed_case():
    """Dynamo's cost = w x (in-flight prefill + uncached tokens) / block + decode blocks
    (distinct in-flight blocks + this prompt's blocks they do not hold). KV block 4."""
    held = {0: 3, 1: 0}  # engine 0 caches the first 3 blocks of prompt [0, 1, 2, 3]
    first_token: dict[int, bool] = {}

    def cached(engine: int, source) -> int:
        return held[engine] if source.block_hashes[0] == 0 else 0

    router = make_router(RouterSettings("prefix-aware"), 2, 1, kv_block_size=4,
                         num_hash_ids=32, cached_blocks=cached,
                         first_token=lambda e, i: first_token.get(i, False))
    p = _Src(16, [0, 1, 2, 3])
    # engine 0: (0 + 16 - 12) / 4 + (0 + 4) = 5; engine 1: 16 / 4 + 4 = 8
    assert router.costs(p) == [5.0, 8.0]
    assert router.route(0, p, 0.0) == 0
    # the same prompt again: engine 0 (4 + 4) / 4 + (4 + 0 shared) = 6; engine 1 8
    assert router.costs(p) == [6.0, 8.0]
    assert router.route(1, p, 0.0) == 0
    q = _Src(16, [10, 11, 12, 13])
    # engine 0: (8 + 16) / 4 + (4 + 4) = 14; engine 1: 4 + 4 = 8
    assert router.costs(q) == [14.0, 8.0]
    assert router.route(2, q, 0.0) == 1
    # a's and b's first tokens seen (engine 0's prefill load goes), a finished (b still
    # holds the blocks): engine 0 (0 + 4) / 4 + (4 + 0) = 5; engine 1 still prefills q:
    # (16 + 16) / 4 + (4 + 4) = 16
    first_token[0] = first_token[1] = True
    router.finished(0)
    assert router.costs(p) == [5.0, 16.0]
    router.finished(1)  # nothing in flight on engine 0: all four blocks are new again
    assert router.costs(p) == [1.0 + 4.0, 16.0]
    load_only = make_router(RouterSettings("prefix-aware", overlap_weight=0.0), 2, 1,
                            kv_block_size=4, num_hash_ids=32, cached_blocks=cached,
                            first_token=lambda e, i: False)
    assert load_only.costs(p) == [4.0, 4.0]


def test_router_settings_round_trip_and_errors():
    r = RouterSettings("prefix-aware", overlap_weight=2.5, block_size=64)
    assert r.to_dict() == {"policy": "prefix-aware", "overlap_weight": 2.5, "block_size": 64}
    assert RouterSettings.from_dict(r.to_dict()) == r
    assert RouterSettings("least-loaded").to_dict() == {"policy": "least-loaded",
                                                        "load_metric": "requests"}
    with pytest.raises(ConfigError, match="policy"):
        RouterSettings.from_dict({"policy": "random"})
    with pytest.raises(ConfigError, match="unknown field 'weight'"):
        RouterSettings.from_dict({"policy": "prefix-aware", "weight": 1})
    with pytest.raises(ConfigError, match="multiple of the KV block size"):
        RouterSettings("prefix-aware", block_size=24).validate(kv_block_size=16)


def test_cached_prefix_blocks_is_the_leading_run():
    holder = np.array([5, 7, -1, 3, 2], dtype=np.int64)
    assert cached_prefix_blocks(holder, [0, 1, 3]) == 3
    assert cached_prefix_blocks(holder, [0, 2, 3]) == 1
    assert cached_prefix_blocks(holder, []) == 0


def test_merge_timeseries_sums_queues_and_averages_kv():
    a = {"t_s": [0.0, 2.0], "kv_usage": [0.2, 0.4], "num_running": [1, 2],
         "num_waiting": [3, 0], "num_scheduled_tokens": [10, 20]}
    b = {"t_s": [1.0], "kv_usage": [0.6], "num_running": [5], "num_waiting": [1],
         "num_scheduled_tokens": [7]}
    m = merge_timeseries([a, b])
    assert m["t_s"] == [0.0, 1.0, 2.0]
    assert m["kv_usage"] == pytest.approx([0.1, 0.4, 0.5])
    assert m["num_running"] == [1, 6, 7]
    assert m["num_waiting"] == [3, 4, 1]
    assert m["num_scheduled_tokens"] == [10, 7, 20]


@pytest.mark.parametrize("dp,replicas,moe,policy", [
    (2, 1, False, "round-robin"), (2, 1, True, "round-robin"), (1, 3, False, "session"),
    (2, 2, True, "prefix-aware"), (2, 2, False, "least-loaded")])
def test_fleets_finish_every_request_with_invariants(dp, replicas, moe, policy):
    reqs = _trace(n=150)
    for i, r in enumerate(reqs):
        r.session_id = f"s{i % 17}"
    result = FleetSimulator(reqs, SETTINGS, CACHE, nonlinear_step, dp=dp,
                            replicas=replicas, moe=moe, router=RouterSettings(policy),
                            options=SimOptions(check_invariants=True)).run()
    assert all(r.status == "finished" for r in result.requests)
    assert sum(e.num_requests for e in result.engines) == len(reqs)
    assert sorted(set(result.requests.engine)) == list(range(dp * replicas))
    assert sum(c for _, c in result.itl_samples) == sum(r.output_len - 1
                                                        for r in result.requests)


def test_front_end_refusals_and_closed_loop_in_a_fleet():
    """A request no engine could run is refused before routing (engine -1) and frees its
    closed-loop slot; the rest are spread and finish."""
    reqs = _trace(n=60)
    reqs[5] = Req("too-long", reqs[5].arrival_s, 5000, 10, prompt_hashes(9, 5000))
    from tuner.sim.load import ClosedLoop

    result = FleetSimulator(reqs, SETTINGS, CacheSettings(num_gpu_blocks=400,
                                                          max_model_len=4096),
                            nonlinear_step, dp=2, replicas=2,
                            router=RouterSettings("least-loaded"),
                            load=ClosedLoop(6)).run()
    assert result.requests[5].status == "rejected" and result.requests.engine[5] == -1
    assert result.counters["rejected"] == 1
    assert sum(r.status == "finished" for r in result.requests) == 59
    assert sum(e.num_requests for e in result.engines) == 59
