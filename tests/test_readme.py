"""The README's fresh-machine commands stay the contract that .ci/run and the CLI honour.

Blocks: 0 = the main job (ingest the bundled Mooncake log, tune it, export), 1 = the
overload example, 2 = the test command (.ci/run runs it verbatim).
"""

from __future__ import annotations

import json
import pathlib
import re
import shlex

import click
import pytest
from click.testing import CliRunner

from tuner.cli import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _bash_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    test_command = _bash_blocks()[1]
    assert "pytest" in test_command and "[test]" in test_command
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci_lines, ".ci/run must run the README's test command verbatim"


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_readme_commands_use_real_options(index: int) -> None:
    """Every `tuner ...` step of the four commands parses with the real CLI (--help stops it)."""
    for step in _bash_blocks()[index].split("&&"):
        words = shlex.split(step.strip())
        if not words or not words[0].endswith("/tuner"):
            continue
        args = words[1:]
        cmd_path = [a for a in args[:2] if not a.startswith("-")][:2]
        group = cli
        for name in cmd_path:
            sub = getattr(group, "commands", {}).get(name)
            if sub is None:
                break
            group = sub
        try:
            group.make_context(group.name or "tuner", args[len(cmd_path):])
        except click.BadParameter:
            pass  # a file the command's earlier steps create (e.g. /tmp/mooncake.parquet)
        except click.UsageError as exc:  # unknown option, missing argument, bad choice
            pytest.fail(f"README step `{step.strip()}`: {exc}")
        result = CliRunner().invoke(cli, [*cmd_path, "--help"])
        assert result.exit_code == 0


def _tuner_steps(block: str) -> list[list[str]]:
    """The `tuner ...` steps of one README block, as argument lists without the program."""
    steps = [shlex.split(step.strip()) for step in block.split("&&")]
    return [words[1:] for words in steps if words and words[0].endswith("/tuner")]


def test_main_job_tunes_the_log_it_ingests_and_exports_the_result() -> None:
    ingest, stats, tune, export = _tuner_steps(_bash_blocks()[0])
    assert ingest[:2] == ["ingest", "traces/mooncake_synthetic.jsonl"]
    ingested = ingest[ingest.index("-o") + 1]
    assert stats == ["trace", "stats", ingested]
    assert tune[:2] == ["tune", ingested]
    assert export[:2] == ["export", tune[tune.index("-o") + 1]]
    overload = _tuner_steps(_bash_blocks()[3])
    assert len(overload) == 1 and overload[0][:2] == ["tune", "traces/agentic_1h.parquet"]


@pytest.mark.slow
def test_main_job_keeps_up_and_the_held_out_window_confirms_a_gain(tmp_path) -> None:
    """The README's main job on the twin: not overloaded, a pick that beats vLLM's defaults
    on the held-out window, keeping their throughput (within 1 %) and their TTFT p90 within
    the tune rule's guard (at most 25 % + 0.1 s above; about 2 minutes)."""
    ingest, _stats, tune, _export = _tuner_steps(_bash_blocks()[0])
    trace = tmp_path / "trace.parquet"
    result = CliRunner().invoke(cli, ["ingest", ingest[1], "-o", str(trace)])
    assert result.exit_code == 0, result.output
    args = [str(trace) if a == tune[1] else a for a in tune[1:]]
    args[args.index("-o") + 1] = str(tmp_path / "profile.yaml")
    result = CliRunner().invoke(cli, ["tune", *args, "--json", "--no-progress"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["overload"] is None, report["overload"]
    assert not report["recommended"]["is_baseline"]
    assert report["confirms"]["holdout"] is True, report["confirms"]
    base, pick = report["holdout"]["baseline"], report["holdout"]["tuned"]
    assert pick["p90_interactivity"] > base["p90_interactivity"]
    assert pick["output_throughput_per_gpu"] >= 0.99 * base["output_throughput_per_gpu"]
    assert pick["ttft_p90_s"] <= 1.25 * base["ttft_p90_s"] + 0.1
