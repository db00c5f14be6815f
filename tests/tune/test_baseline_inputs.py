"""Issue 17 items 4-5: --set / --baseline / goodput, and degenerate inputs."""

from __future__ import annotations

import json
import pathlib

import pytest
from click.testing import CliRunner

from tests.tune.fake import FakeEvaluator
from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.metrics import good_requests, parse_slo
from tuner.sim.settings import SchedulerSettings
from tuner.records import RequestResult
from tuner.tune import SearchOptions, TuneInputs, tune
from tuner.tune.baseline import parse_assignments, parse_serve_flags
from tuner.metrics import rejection_warning

TARGET = ["--hardware", "mi355x", "--model", "llama-3.1-70b", "--tp", "8",
          "--num-gpu-blocks", "1500"]


# ----------------------------------------------------------------------- item 4


def test_unmodelled_scheduler_config_fields_are_refused_by_name() -> None:
    for field in ("max_num_scheduled_tokens", "max_num_active_seqs", "max_num_queued_reqs",
                  "stream_interval"):
        with pytest.raises(ConfigError, match=f"{field} .*does not model"):
            parse_assignments([f"{field}=4"])
    with pytest.raises(ConfigError, match="max_num_active_seqs"):
        parse_serve_flags("vllm serve m --max-num-active-seqs 64")
    assert parse_assignments(["max-num-seqs=256", "max_num_batched_tokens=8K"]) == {
        "max_num_seqs": 256, "max_num_batched_tokens": 8192}


def test_serve_flags_parse_with_export_rules() -> None:
    flags = parse_serve_flags("vllm serve meta-llama/Llama-3.1-70B-Instruct --tp 8 "
                              "--max-num-seqs 256 --no-enable-chunked-prefill "
                              "--scheduling-policy priority --port 8000 --async-scheduling")
    assert flags.model == "meta-llama/Llama-3.1-70B-Instruct"
    assert flags.scheduler == {"max_num_seqs": 256, "enable_chunked_prefill": False,
                               "policy": "priority"}
    assert flags.target == {"async_scheduling": True}
    assert flags.ignored == ["--tp 8", "--port 8000"]


def test_baseline_and_fixed_settings_are_trial_zero_and_out_of_the_space() -> None:
    fake = FakeEvaluator()
    base = fake.default_settings.replace(max_num_seqs=256, cache_aware_admission_window=4)
    result = tune(TuneInputs(evaluator=fake, baseline=base,
                             fixed={"max_num_batched_tokens": 4096}),
                  SearchOptions(n_trials=8, seed=1, space="scheduler"))
    first = fake.calls[0][0]
    assert first["max_num_seqs"] == 256 and first["cache_aware_admission_window"] == 4
    assert first["max_num_batched_tokens"] == 4096
    assert all(s["max_num_batched_tokens"] == 4096 for s, _ in fake.calls)
    assert "max_num_batched_tokens" not in result.space.names
    assert result.baseline.settings["max_num_seqs"] == 256


def test_cli_baseline_flags_and_unknown_set(small_trace: pathlib.Path,
                                            tmp_path: pathlib.Path) -> None:
    res = CliRunner().invoke(cli, ["tune", str(small_trace), *TARGET, "--trials", "3",
                                   "--set", "max_num_active_seqs=8", "-o",
                                   str(tmp_path / "x.yaml")])
    assert res.exit_code == 2 and "max_num_active_seqs (--max-num-active-seqs)" in res.output
    res = CliRunner().invoke(cli, ["tune", str(small_trace), *TARGET, "--trials", "3", "--json",
                                   "--baseline", "--max-num-seqs 128 --tensor-parallel-size 8",
                                   "-o", str(tmp_path / "b.yaml")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["baseline"]["settings"]["max_num_seqs"] == 128
    res = CliRunner().invoke(cli, ["tune", str(small_trace), *TARGET, "--trials", "3",
                                   "--baseline", "--tensor-parallel-size 4",
                                   "-o", str(tmp_path / "c.yaml")])
    assert res.exit_code == 2 and "tp=4" in res.output and "tp=8" in res.output


def test_goodput_has_vllm_bench_semantics() -> None:
    assert parse_slo("ttft:2000,tpot:50") == {"ttft": 2000.0, "tpot": 50.0}
    assert parse_slo("ttft:2000 e2el:9000") == {"ttft": 2000.0, "e2el": 9000.0}
    with pytest.raises(ConfigError, match="use ttft, tpot, e2el"):
        parse_slo("itl:5")

    def r(rid: str, ttft: float, finish: float, out: int, status: str = "finished"):
        return RequestResult(request_id=rid, arrival_s=0.0, input_len=10, output_len=out,
                             first_scheduled_s=0.0, first_token_s=ttft, finish_s=finish,
                             num_cached_tokens=0, num_preemptions=0, status=status)

    reqs = [r("a", 1.0, 2.0, 21),  # tpot 50 ms: meets tpot<=50 exactly
            r("b", 2.5, 3.0, 11),  # ttft 2.5 s: misses ttft<=2000
            r("c", 0.5, 0.5, 1),  # one token: tpot counts as 0
            r("d", 0.1, 9.0, 2, status="aborted")]  # not finished: never good
    assert good_requests(reqs, {"ttft": 2000, "tpot": 50}) == 2


def test_goodput_objective_needs_slo(small_trace: pathlib.Path, tmp_path: pathlib.Path) -> None:
    res = CliRunner().invoke(cli, ["tune", str(small_trace), *TARGET, "--trials", "2",
                                   "--objective", "goodput,output_throughput_per_gpu",
                                   "-o", str(tmp_path / "g.yaml")])
    assert res.exit_code == 2 and "goodput needs --slo" in res.output
    res = CliRunner().invoke(cli, ["tune", str(small_trace), *TARGET, "--trials", "3",
                                   "--objective", "goodput,output_throughput_per_gpu",
                                   "--slo", "ttft:2000,tpot:50", "--json",
                                   "-o", str(tmp_path / "g.yaml")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    good = json.loads(res.output)["train"]["baseline"]
    assert json.loads(res.output)["objectives"][0] == "goodput:max"
    assert "goodput" not in good or good["goodput"] is None or good["goodput"] >= 0


# ----------------------------------------------------------------------- item 5


def test_tiny_trace_is_refused_before_any_trial(tmp_path: pathlib.Path) -> None:
    from tests.tune.tracegen import write_small_trace

    tiny = write_small_trace(tmp_path / "tiny.parquet", duration_s=4.0, sessions=2)
    res = CliRunner().invoke(cli, ["tune", str(tiny), *TARGET, "--trials", "200",
                                   "-o", str(tmp_path / "t.yaml")])
    assert res.exit_code == 2 and "ranking settings needs at least" in res.output
    assert not (tmp_path / "t.optuna-journal").exists()


def test_rejected_requests_are_said() -> None:
    text = rejection_warning({"num_requests": 100, "num_rejected": 53}, 8192)
    assert text is not None and "53 of 100 requests (53%)" in text and "8,192" in text
    assert rejection_warning({"num_requests": 100, "num_rejected": 1}, 8192) is None


def test_tune_says_first_when_requests_are_rejected(small_trace: pathlib.Path,
                                                    tmp_path: pathlib.Path) -> None:
    res = CliRunner().invoke(cli, ["tune", str(small_trace), *TARGET, "--trials", "2",
                                   "--max-model-len", "1500", "--holdout", "0",
                                   "--no-progress", "-o", str(tmp_path / "r.yaml")],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    first = res.output.splitlines()[0]
    assert first.startswith("WARNING: ") and "are rejected (longer than max_model_len=1,500)" \
        in first


def test_the_same_log_twice_is_refused(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "a.jsonl"
    log.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 5,
                               "hash_ids": [1]}) + "\n")
    res = CliRunner().invoke(cli, ["tune-log", str(log), str(log), *TARGET,
                                   "-o", str(tmp_path / "p.yaml")])
    assert res.exit_code == 2 and "given twice" in res.output


def test_tune_log_on_a_four_request_log_is_refused(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "four.jsonl"
    log.write_text("".join(json.dumps({"timestamp": i * 1000, "input_length": 600,
                                       "output_length": 20, "hash_ids": [i, i + 1]}) + "\n"
                           for i in range(4)))
    res = CliRunner().invoke(cli, ["tune-log", str(log), *TARGET, "--no-progress",
                                   "-o", str(tmp_path / "p.yaml")])
    assert res.exit_code == 2, res.output
    assert "the trace has 4 request(s)" in res.output and "at least 30" in res.output
    assert not (tmp_path / "p.yaml").exists()


def test_replay_says_when_requests_are_rejected(small_trace: pathlib.Path) -> None:
    res = CliRunner().invoke(
        cli, ["replay", str(small_trace), *TARGET, "--max-model-len", "1500", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "are rejected (longer than max_model_len=1,500)" in res.output


@pytest.mark.vllm
@pytest.mark.parametrize("var", ["TUNER_VLLM033_PYTHON", "TUNER_VLLM032_PYTHON"])
def test_every_scheduler_config_field_of_vllm_is_settable_or_refused_by_name(var: str) -> None:
    """Read SchedulerConfig's fields from the installed vLLM's source (no vLLM import):
    each one the twin models is accepted by --set, each other one is refused naming it."""
    import ast
    import subprocess

    from tests.envs import env_python
    from tuner.tune.baseline import UNMODELLED_FIELDS

    python = env_python(var, 'run eval "$(.ci/setup-vllm.sh)" first')
    root = subprocess.run([python, "-c", "import importlib.util; print(importlib.util."
                           "find_spec('vllm').submodule_search_locations[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    tree = ast.parse((pathlib.Path(root) / "config" / "scheduler.py").read_text())
    cls = next(n for n in ast.walk(tree)
               if isinstance(n, ast.ClassDef) and n.name == "SchedulerConfig")
    names = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)
             and isinstance(n.target, ast.Name) and not n.target.id.isupper()
             and not any(w in ast.unparse(n.annotation) for w in ("InitVar", "ClassVar"))]
    assert "max_num_seqs" in names and "stream_interval" in names
    modelled = {f.name for f in __import__("dataclasses").fields(SchedulerSettings)}
    for name in names:
        if name == "async_scheduling":  # a deployment flag: the profile target carries it
            assert parse_serve_flags(["--no-async-scheduling"]).target == {
                "async_scheduling": False}
            continue
        if name in modelled:
            assert name in parse_assignments([f"{name}={_example(name)}"])
        else:
            assert name in UNMODELLED_FIELDS, f"{name}: new SchedulerConfig field, classify it"
            with pytest.raises(ConfigError, match=f"{name} .*does not model"):
                parse_assignments([f"{name}=1"])


def _example(name: str) -> str:
    value = getattr(SchedulerSettings(), name)
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_baseline_from_a_profile_or_flags(tmp_path: pathlib.Path) -> None:
    from tests.profile.test_export import make_profile
    from tuner.profile import save_profile
    from tuner.profile.recommend import resolve_baseline
    from tuner.perf.target import Target

    path = save_profile(make_profile(window=8), tmp_path / "today.yaml")
    settings, flags, notes = resolve_baseline(str(path), Target(tp=8))
    assert settings is not None and settings.cache_aware_admission_window == 8 and flags is None
    with pytest.raises(ConfigError, match="no such profile file"):
        resolve_baseline(str(tmp_path / "missing.yaml"), Target(tp=8))
    settings, flags, notes = resolve_baseline("--max-num-seqs 64 --port 8000", Target(tp=8))
    assert settings is None and flags is not None and flags.scheduler == {"max_num_seqs": 64}
    assert notes == ["--baseline: ignored (no bearing on the replay): --port 8000"]
