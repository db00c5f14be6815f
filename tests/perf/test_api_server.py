"""The TTFT path of a served benchmark: vLLM's API server in front of the engine
(tuner/perf/api_server.py), the async overlap of the benchmark clock, and how rows say
which engine they ran (tuner/perf/fit/benchmark_rows.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tuner.perf.api_server import (MAX_WAIT_UTILISATION, ApiServerCost, client_ttft_s,
                                   server_load)
from tuner.perf.fit.benchmark_rows import (_async_scheduling, _quantization, load_rows,
                                           missed_step_s, record)
from tuner.perf.step_time import RooflineStepTimeModel

COST = ApiServerCost(request_s=1e-3, prompt_token_s=1e-6, output_token_s=40e-6)


def test_server_load_is_work_over_span_with_an_md1_wait():
    isl, osl = np.full(100, 1000.0), np.full(100, 500.0)
    work = 100 * (1e-3 + 1e-3 + 500 * 40e-6)  # 2.2 s of server CPU
    load = server_load(COST, isl, osl, span_s=4.4, num_steps=900)
    assert load.utilisation == pytest.approx(0.5)
    service = work / (100 + 900)
    assert load.wait_s == pytest.approx(0.5 * service / (2 * 0.5))
    assert load.stretch == 1.0


def test_a_saturated_server_stretches_the_run_and_caps_the_wait():
    isl, osl = np.full(100, 1000.0), np.full(100, 500.0)
    load = server_load(COST, isl, osl, span_s=1.1, num_steps=900)
    assert load.utilisation == pytest.approx(2.0)
    assert load.stretch == pytest.approx(2.0)
    r = MAX_WAIT_UTILISATION
    assert load.wait_s == pytest.approx(r * (2.2 / 1000) / (2 * (1 - r)))
    # two API server processes share the work
    two = server_load(dataclasses.replace(COST, servers=2), isl, osl, span_s=1.1,
                      num_steps=900)
    assert two.utilisation == pytest.approx(1.0)


def test_client_ttft_adds_intake_first_token_and_both_queues():
    isl = np.array([8000.0, 1000.0])
    load = server_load(COST, isl, np.array([1000.0, 1000.0]), span_s=100.0, num_steps=2000)
    got = client_ttft_s(COST, load, np.array([0.3, 0.1]), isl)
    want = np.array([0.3 + 1e-3 + 8e-3, 0.1 + 1e-3 + 1e-3]) + 40e-6 + 2 * load.wait_s
    assert got == pytest.approx(want)


def test_client_ttft_runs_the_intake_during_the_missed_step():
    """A closed loop's replacement waits for the longer of its intake and the engine step
    it missed, not for both (the server tokenises while the engine runs that step)."""
    isl = np.array([8000.0, 1000.0, 1000.0])
    load = server_load(COST, isl, np.full(3, 1000.0), span_s=100.0, num_steps=2000)
    got = client_ttft_s(COST, load, np.array([0.3, 0.1, 0.1]), isl,
                        np.array([0.0, 0.03, 1e-4]))
    out = 40e-6 + 2 * load.wait_s
    assert got == pytest.approx(np.array([0.3 + 9e-3, 0.1 + 0.03, 0.1 + 2e-3]) + out)


def test_missed_step_is_the_period_of_the_step_that_freed_the_slot():
    periods = np.array([0.5, 0.02, 0.03, 0.04])
    got = missed_step_s(periods, np.array([0, 0, 1, 3, 4]))
    assert got == pytest.approx([0.0, 0.0, 0.5, 0.03, 0.04])


def test_rows_run_async_scheduling_from_vllm_014_or_in_2026():
    assert _async_scheduling({"engine": "vLLM", "engine_ver": "0.18.0"})
    assert _async_scheduling({"engine": "vLLM", "engine_ver": "0.20.1rc1.dev365"})
    assert not _async_scheduling({"engine": "vLLM", "engine_ver": "0.10.2 (ROCm 7.0.0)"})
    assert not _async_scheduling({"engine": "vLLM", "engine_ver": "", "measured": "2025-10-29"})
    assert _async_scheduling({"engine": "vLLM", "engine_ver": "", "measured": "2026-03-27"})
    assert _async_scheduling({"engine_ver": "", "source": "https://x (blog.mdx, 2026-04-06)"})
    assert not _async_scheduling({"engine_ver": "", "source": "https://x"})
    rows, _ = load_rows()
    by_id = {r.id: r for r in rows}
    assert by_id["K18-TP8-c4"].async_scheduling
    assert not by_id["ORA-L405-MI300X-bs8"].async_scheduling


def test_nvfp4_rows_run_the_checkpoints_fp8_kv_cache():
    """vLLM resolves --kv-cache-dtype auto to a ModelOpt checkpoint's kv_cache_quant_algo
    (FP8 in NVIDIA's NVFP4 checkpoints); MXFP4 and FP8 rows keep the model dtype."""
    assert _quantization("NVFP4") == ("nvfp4", "fp8")
    assert _quantization("MXFP4") == ("mxfp4", "auto")
    assert _quantization("FP8") == ("fp8", "auto")


@pytest.fixture(scope="module")
def small_run():
    rows, _ = load_rows()
    row = next(r for r in rows if r.id == "IX-M3-H200-1k1k-c4")
    small = type(row)(**{**{f: getattr(row, f) for f in row.__dataclass_fields__},
                         "num_prompts": 48, "concurrency": 16})
    run = record(small)
    res = run.resolved
    return run, RooflineStepTimeModel(res.hardware, res.model, small.tp,
                                      res.step_time.coefficients)


def test_served_rows_price_the_api_server_and_the_async_overlap(small_run):
    """Fails if figures() drops the API server or prices async rows as synchronous."""
    run, model = small_run
    engine = run.figures(model, api=None)
    client = run.figures(model)
    intake = 1e3 * float(np.median(ApiServerCost().intake_s(run.input_len)))
    assert client["ttft_med"] - engine["ttft_med"] >= intake
    # replacements (issued after the first C) wait out the step that freed their slot
    periods = run.step_periods(model)
    later = run.arrival > 0
    assert later.any() and not later.all()
    missed = missed_step_s(periods, run.arrival)
    assert (missed[later] > 0).all() and (missed[~later] == 0).all()
    assert client["ttft_mean"] - engine["ttft_mean"] >= 1e3 * float(missed.mean())
    assert run.row.async_scheduling
    sync = run.figures(model, api=None, async_scheduling=False)
    assert sync["tpot_med"] > engine["tpot_med"]  # the CPU part is no longer overlapped
    periods = run.step_periods(model)
    parts = model.terms(*run.arrays, maximum=np.maximum, minimum=np.minimum)
    total = sum(parts.values())
    live = run.arrays[1] + run.arrays[2] > 0
    assert periods[live] == pytest.approx(np.maximum(parts["cpu"], total - parts["cpu"])[live])
