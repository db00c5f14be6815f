"""Parity comparison, the vllm-core backend's guards and the driver's token derivation,
without a vLLM environment (these run everywhere)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.records import ReplayResult, StepRecord
from tuner.fidelity.parity import compare_steps, diff_step
from tuner.replay import create_backend
from vllm_env import ROOT


def _step(i: int, sched: dict[str, int], *, usage: float = 0.5, pre: tuple[str, ...] = (),
          hit: dict[str, int] | None = None, t: float | None = None,
          gauge: float | None = None) -> StepRecord:
    return StepRecord(step=i, start_s=float(i) if t is None else t, duration_s=1.0,
                      num_scheduled_tokens=sched, preempted=pre, num_running=len(sched),
                      num_waiting=0, kv_usage=usage, cached_tokens=hit or {},
                      kv_usage_at_update=gauge)


def _result(steps: list[StepRecord], wall: float = 1.0, **counters: float) -> ReplayResult:
    return ReplayResult(backend="x", requests=[], itl_samples=[], timeseries={},
                        counters={"num_steps": len(steps), **counters}, simulated_s=0.0,
                        wall_s=wall, steps=steps)


def test_identical_replays_are_100_percent() -> None:
    steps = [_step(0, {"a": 48}, hit={"a": 0}), _step(1, {"a": 1, "b": 16})]
    report = compare_steps(_result(steps, 0.5), _result(list(steps), 2.0))
    assert report.identical and report.identical_pct == 100.0
    assert report.num_compared == 2 and report.first_divergence is None
    assert report.speed_ratio == pytest.approx(4.0)
    assert "100% - every step identical" in report.format_text()


def test_first_divergence_with_context_and_order() -> None:
    twin = [_step(0, {"a": 48}), _step(1, {"a": 1, "b": 16}), _step(2, {"a": 1}),
            _step(3, {"a": 1})]
    vllm = [_step(0, {"a": 48}), _step(1, {"b": 16, "a": 1}), _step(2, {"a": 1}, usage=0.75),
            _step(3, {"a": 1})]
    report = compare_steps(_result(twin), _result(vllm), context=1)
    assert not report.identical
    assert report.first_divergence is not None and report.first_divergence.step == 1
    assert set(report.first_divergence.fields) == {"num_scheduled_tokens"}  # order matters
    assert report.num_identical == 2 and report.identical_pct == 50.0
    assert [a.step for a, _ in report.context] == [0, 1]
    text = report.format_text()
    assert "first divergence at step 1" in text and "twin step 0" in text


def test_step_count_and_counter_differences_break_parity() -> None:
    steps = [_step(0, {"a": 48})]
    report = compare_steps(_result(steps, preemptions=0), _result(steps + [_step(1, {"a": 1})],
                                                                  preemptions=2))
    assert not report.identical
    assert report.first_divergence.step == 1
    assert report.counter_diffs["preemptions"] == (0.0, 2.0)
    assert report.to_dict()["num_steps_vllm"] == 2


def test_diff_step_fields() -> None:
    a = _step(0, {"a": 1}, pre=("x",), hit={"a": 32})
    b = _step(0, {"a": 1}, pre=(), hit={"a": 16}, t=0.5)
    assert set(diff_step(a, b)) == {"preempted", "cached_tokens", "start_s"}
    assert diff_step(a, a) == {}


def test_gauge_at_update_is_compared_where_both_sides_record_it() -> None:
    twin = [_step(0, {"a": 48}, gauge=0.5), _step(1, {"a": 1}, gauge=0.25),
            _step(2, {"a": 1})]
    vllm = [_step(0, {"a": 48}, gauge=0.5), _step(1, {"a": 1}, gauge=0.5),
            _step(2, {"a": 1}, gauge=0.0)]
    report = compare_steps(_result(twin), _result(vllm))
    assert report.num_gauge_compared == 2  # step 2: the twin has no gauge
    assert report.first_divergence is not None and report.first_divergence.step == 1
    assert report.first_divergence.fields == {"kv_usage_at_update": (0.25, 0.5)}
    assert report.num_identical == 2
    assert "gauge at update compared on 2 of 3 steps" in report.format_text()
    assert report.to_dict()["num_gauge_compared"] == 2


def test_vllm_core_job_carries_the_scheduling_mode(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The mode prepare resolved from the target (whatever the options said) reaches the
    driver's job."""
    from tuner.perf.target import Target
    from tuner.replay._run import prepare
    from tuner.sim.settings import SimOptions
    from tuner.trace.request import TraceRequest

    (tmp_path / "config.json").write_text("{}")
    reqs = [TraceRequest("a", 0.0, 32, 2, (1, 2))]
    for mode in (False, True):
        backend = prepare(reqs, backend="vllm-core", target=Target(async_scheduling=mode),
                          options=SimOptions(async_scheduling=not mode), hash_block_size=16,
                          vllm_python=sys.executable, model_dir=str(tmp_path))
        assert backend.job["async_scheduling"] is mode
        backend.close()


def test_needs_steps() -> None:
    r = _result([])
    r.steps = None
    with pytest.raises(ValueError, match="record steps"):
        compare_steps(r, r)


def test_vllm_core_backend_needs_a_vllm_python(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TUNER_VLLM_PYTHON", "TUNER_VLLM033_PYTHON", "TUNER_VLLM032_PYTHON"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="--vllm-python"):
        create_backend("vllm-core")
    with pytest.raises(ConfigError, match="no config.json"):
        create_backend("vllm-core", vllm_python=sys.executable, model_dir=str(ROOT))


def test_cli_fidelity_errors(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    for var in ("TUNER_VLLM_PYTHON", "TUNER_VLLM033_PYTHON", "TUNER_VLLM032_PYTHON"):
        monkeypatch.delenv(var, raising=False)
    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    res = CliRunner().invoke(cli, ["fidelity", str(trace)])
    assert res.exit_code == 2
    assert res.output.startswith("Error: the vllm-core backend needs a Python with vLLM")
    res = CliRunner().invoke(cli, ["fidelity", str(trace), "--vllm-python", sys.executable])
    assert res.exit_code == 2
    assert "no vLLM installed there" in res.output


def _driver():  # type: ignore[no-untyped-def]
    path = ROOT / "tuner" / "vllm_core" / "driver.py"
    spec = importlib.util.spec_from_file_location("_vllm_core_driver_offline", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)  # stdlib only at module level: no vLLM needed
    return mod


def test_driver_loads_without_vllm_and_uses_the_shared_tokens() -> None:
    from tuner.vllm_core import tokens

    assert _driver().TokenFactory is tokens.TokenFactory


def test_tokens_follow_block_hashes() -> None:
    from tuner.vllm_core import tokens as drv
    tf = drv.TokenFactory(16)
    a = drv.DriverRequest("a", 0.0, 40, 20, (1, 2, 3))
    b = drv.DriverRequest("b", 0.0, 40, 20, (1, 2, 9))
    c = drv.DriverRequest("c", 0.0, 40, 20, (1, 2, 3), output_block_hashes=(77, 78))
    pa, pb, pc = tf.prompt(a), tf.prompt(b), tf.prompt(c)
    assert len(pa) == 40 and pa[:32] == pb[:32] == pc[:32]  # equal hashes, equal blocks
    assert pa[32:] != pb[32:]  # partial tails are unique per request
    assert pc[32:] == tf.block(77)[:8]  # ... unless the completed block is known
    out = tf.output_tokens(c)
    assert len(out) == 20 and out[:8] == tf.block(77)[8:] and out[8:] == tf.block(78)[:12]
    assert tf.output_tokens(a) != tf.output_tokens(b)
    assert tf.prompt(a) == drv.TokenFactory(16).prompt(a)  # deterministic across instances
    assert all(drv.VOCAB_LOW <= t <= drv.VOCAB_HIGH for t in pa + out)
