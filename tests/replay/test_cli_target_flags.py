"""The deployment and router flags reach a command as typed objects (TargetFlags,
RouterFlags), not through Click's ``ctx.meta``."""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import click
from click.testing import CliRunner

from tuner.cli._replay import RouterFlags, TargetFlags, router_options, target_options
from tuner.errors import ConfigError

CLI = pathlib.Path(__file__).resolve().parents[2] / "tuner" / "cli"


def _probe() -> tuple[click.Command, list[Any]]:
    seen: list[Any] = []

    @click.command()
    @click.option("--other", default="x")
    @target_options
    @router_options
    def probe(other: str, target_flags: TargetFlags, router_flags: RouterFlags) -> None:
        seen.append((other, target_flags, router_flags))

    return probe, seen


def test_a_command_gets_one_target_and_one_router_object() -> None:
    probe, seen = _probe()
    res = CliRunner().invoke(probe, [
        "--model", "llama-3.1-8b", "--tensor-parallel-size", "2", "--quantization", "MXFP4",
        "--kv-cache-dtype", "FP8", "--replicas", "3", "--no-async-scheduling",
        "--router", "least-loaded", "--router-load-metric", "tokens"])
    assert res.exit_code == 0, res.output
    other, flags, router = seen[0]
    assert other == "x"
    assert flags == TargetFlags(model="llama-3.1-8b", tp=2, quantization="mxfp4",
                                kv_cache_dtype="fp8", replicas=3, async_scheduling=False)
    target = flags.target()
    assert (target.tp, target.replicas, target.quantization, target.async_scheduling) == (
        2, 3, "mxfp4", False)
    settings = router.settings(target)
    assert (settings.policy, settings.load_metric) == ("least-loaded", "tokens")


def test_defaults_are_the_flags_defaults() -> None:
    probe, seen = _probe()
    assert CliRunner().invoke(probe, []).exit_code == 0
    _, flags, router = seen[0]
    assert flags == TargetFlags() and router == RouterFlags()
    assert flags.target().step_time_source == "auto" and flags.target().replicas == 1


def test_router_flags_are_checked_against_the_target() -> None:
    one = TargetFlags().target()
    for flags, message in ((RouterFlags(policy="session"), "needs --replicas > 1"),
                           (RouterFlags(policy="session", overlap_weight=2.0),
                            "--router-overlap-weight applies to --router prefix-aware")):
        try:
            flags.settings(one)
        except ConfigError as exc:
            assert message in str(exc)
        else:
            raise AssertionError(f"{flags} accepted")


def test_no_cli_module_passes_values_through_ctx_meta() -> None:
    uses = [f"{path.name}:{node.lineno}" for path in sorted(CLI.glob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and node.attr == "meta"]
    assert uses == [], f"typed flag objects, not ctx.meta: {uses}"
