"""`tuner tune`, `tuner tune --join` and `tuner export` through Click."""

from __future__ import annotations

import json
import pathlib

from click.testing import CliRunner

from tests.profile.test_export import make_profile
from tuner.cli import cli
from tuner.profile import save_profile

TARGET = ["--hardware", "mi355x", "--model", "llama-3.1-70b", "--tp", "8",
          "--num-gpu-blocks", "1500"]


def test_tune_json_and_export(small_trace: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "p.yaml"
    res = CliRunner().invoke(cli, ["tune", str(small_trace), *TARGET, "--trials", "4", "--json",
                                   "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["profile"] == str(out) and out.exists()
    assert data["trials"]["complete"] == 4
    assert "--max-num-batched-tokens" in data["flags"]
    res = CliRunner().invoke(cli, ["export", str(out), "--format", "yaml"])
    assert res.exit_code == 0 and "max-num-seqs:" in res.output
    # same study name resumes: 2 more trials
    res = CliRunner().invoke(cli, ["tune", str(small_trace), *TARGET, "--trials", "6", "--json",
                                   "-o", str(out)], catch_exceptions=False)
    assert json.loads(res.stdout)["trials"]["complete"] == 6


def test_tune_text_output_shows_front_and_flags(small_trace: pathlib.Path,
                                                tmp_path: pathlib.Path) -> None:
    res = CliRunner().invoke(cli, ["tune", str(small_trace), *TARGET, "--trials", "3",
                                   "-o", str(tmp_path / "t.yaml")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "Pareto front of t" in res.output and "recommended: " in res.output
    assert ("held-out confirms" in res.output
            or "the baseline is recommended: keep the current settings" in res.output)
    assert "--scheduling-policy fcfs" in res.output
    # TTFT beside the objectives, with units; the serve command printed once
    assert "TTFT p50" in res.output and "tok/s/user" in res.output and "tok/s/GPU" in res.output
    assert res.output.count("--max-num-seqs") == 1 and "vllm serve " in res.output


def test_cli_errors_are_one_line() -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["tune", "--join", "s"])
    assert res.exit_code == 2
    assert res.output.strip() == "Error: --join needs --storage URL (the study's database or journal)"
    res = runner.invoke(cli, ["tune"])
    assert res.output.strip() == "Error: missing TRACE (or use --join STUDY --storage URL)"


def test_profile_that_is_its_own_journal_is_refused(small_trace: pathlib.Path,
                                                    tmp_path: pathlib.Path) -> None:
    """-o NAME.optuna-journal made the profile and its study one file (the profile replaced
    the study); the same for --storage X -o X. Refused before any trial runs."""
    for extra, name in (([], "x.optuna-journal"), (["--storage", "j.journal"], "j.journal")):
        out = tmp_path / name
        res = CliRunner().invoke(cli, ["tune", str(small_trace), *TARGET, "--trials", "2",
                                       *[a if a != "j.journal" else str(out) for a in extra],
                                       "-o", str(out)])
        assert res.exit_code == 2, res.output
        assert res.output.startswith("Error: -o ") and "journal" in res.output
        assert res.output.count("\n") == 1 and not out.exists()


def test_export_errors(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nscheduler: {max_num_seqs: 0}\ntarget: {hardware: a, model: b}\n")
    res = CliRunner().invoke(cli, ["export", str(bad)])
    assert res.exit_code == 2
    assert res.output.strip() == f"Error: {bad}: scheduler: max_num_seqs=0 must be >= 1"
    good = save_profile(make_profile(), tmp_path / "g.yaml")
    res = CliRunner().invoke(cli, ["export", str(good), "--vllm-version", "0.33.0",
                                   "--native-admission"])
    assert res.exit_code == 2 and "no cache-aware admission fields" in res.output
    res = CliRunner().invoke(cli, ["export", str(good), "--format", "plugin",
                                   "--no-async-scheduling"])
    assert "tuner.vllm_plugin.CacheAwareScheduler" in res.output
    assert "--no-async-scheduling" in res.output


def test_help_defines_the_metrics() -> None:
    for cmd in ("tune", "tune-log"):
        res = CliRunner().invoke(cli, [cmd, "--help"])
        assert "the speed the slowest 10% of users get" in res.output
        assert "Throughput per GPU" in res.output and "Example:" in res.output


def test_tune_log_ingests_tunes_and_exports(tmp_path: pathlib.Path) -> None:
    """A tiny Mooncake-format log (made up here): shared 512-token prefix blocks."""
    import random

    rng = random.Random(0)
    lines = []
    for i in range(120):
        shared = [0, 1, 2] if i % 2 else [10, 11]
        own = [1000 + i * 10 + k for k in range(rng.randint(1, 4))]
        ids = shared + own
        lines.append(json.dumps({"timestamp": i * 500, "input_length": len(ids) * 512 - 100,
                                 "output_length": rng.randint(20, 80), "hash_ids": ids}))
    log = tmp_path / "requests.jsonl"
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "from-log.yaml"
    res = CliRunner().invoke(cli, ["tune-log", str(log), *TARGET, "--trials", "3", "--json",
                                   "--no-progress", "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert (tmp_path / "from-log.trace.parquet").exists() and out.exists()
    assert data["trials"]["complete"] == 3 and "--scheduling-policy" in data["flags"]


def test_the_tune_flow_is_a_library_call(small_trace: pathlib.Path,
                                         tmp_path: pathlib.Path) -> None:
    """Issue 13 item 6: notebooks get what `tuner tune` does without Click."""
    from tuner.profile import load_profile
    from tuner.profile.recommend import summary_lines, tune_to_profile
    from tuner.perf.target import Target
    from tuner.tune import SearchOptions, TuneInputs

    run = tune_to_profile(tmp_path / "lib.yaml",
                          TuneInputs(str(small_trace), target=Target(tp=8, num_gpu_blocks=1500)),
                          SearchOptions(n_trials=3), fixed=["max_num_seqs=256"])
    saved = load_profile(run.path)
    assert saved.scheduler.max_num_seqs == 256 and saved.target.max_model_len == 131072
    assert saved.target.gpu_memory_utilization == 0.92 and saved.target.num_gpu_blocks == 1500
    assert run.command.splitlines()[-1].strip() != "" and "vllm serve " in run.command
    lines = summary_lines(run)
    assert any(ln.startswith("recommended: ") for ln in lines)
    assert any(ln.startswith("training window: ") and "tok/s/GPU" in ln for ln in lines)


def test_tune_over_a_gpu_budget_shows_and_exports_the_deployment(
        small_trace: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """The twin replays every sampled split (fleets included); --json names the split and
    router, the profile records them and exports them."""
    from tuner.profile import load_profile
    from tuner.perf.deployment import Deployment, Split

    out = tmp_path / "fleet.yaml"
    res = CliRunner().invoke(cli, ["tune", str(small_trace), *TARGET, "--gpu-budget", "8",
                                   "--routers", "round-robin,prefix-aware", "--trials", "10",
                                   "--survivors", "4", "--stage1-fraction", "0.5", "--json",
                                   "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["space"] == "admission+gpu8"
    rec, base = data["recommended"], data["baseline"]
    assert base["deployment"] == Deployment(Split(8)).to_dict()
    assert "gpu_split" in rec["params"] and "deployment" not in rec["settings"]
    split = Split.parse(rec["params"]["gpu_split"])
    assert Deployment.from_dict(rec["deployment"]).split == split
    assert all("gpu_split" in p["params"] for p in data["front"])
    profile = load_profile(out)
    assert (profile.target.tp, profile.target.dp, profile.target.replicas) == (
        split.tp, split.dp, split.replicas)
    assert f"--tensor-parallel-size {split.tp}" in data["flags"]


def test_tune_with_fixed_replicas_searches_the_routers_weight(
        small_trace: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "four.yaml"
    res = CliRunner().invoke(cli, ["tune", str(small_trace), "--hardware", "mi355x",
                                   "--model", "llama-3.1-70b", "--tp", "2", "--replicas", "4",
                                   "--num-gpu-blocks", "400", "--router", "prefix-aware",
                                   "--routers", "prefix-aware", "--trials", "6",
                                   "--survivors", "3", "--json", "-o", str(out)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert list(data["recommended"]["params"])[-1] == "router.overlap_weight"
    assert data["baseline"]["deployment"]["router"]["policy"] == "prefix-aware"
    res = CliRunner().invoke(cli, ["export", str(out), "--format", "router"])
    assert res.exit_code == 0 and "python -m dynamo.frontend" in res.output
    flags = CliRunner().invoke(cli, ["export", str(out)]).output
    assert flags.count("vllm serve meta-llama") == 4 and "--port 8003 &" in flags
    one = CliRunner().invoke(cli, ["export", str(out).replace("four", "none"), "--format",
                                   "router"])
    assert one.exit_code != 0
