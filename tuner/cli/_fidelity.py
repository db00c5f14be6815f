"""``tuner fidelity``: replay a trace on the twin and on vLLM's own scheduler, step by step."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from tuner.cli._common import echo_json, handle_errors
from tuner.cli._pd import pd_options
from tuner.cli._replay import TargetFlags, make_load, target_options
from tuner.cli._spec import spec_options


@click.command(name="fidelity")
@click.argument("trace", type=click.Path(exists=True))
@click.option("--vllm-python", type=click.Path(exists=True, dir_okay=False), default=None,
              envvar="TUNER_VLLM_PYTHON", show_envvar=True,
              help="Python of an environment with vLLM 0.32/0.33 (.ci/setup-vllm.sh builds "
                   "one); the vllm-core side runs there.")
@target_options
@spec_options
@click.option("--set", "assignments", multiple=True, metavar="FIELD=VALUE",
              help="Scheduler setting, vLLM field name (repeatable), e.g. --set "
                   "cache_aware_admission_window=16.")
@click.option("--speedup", type=click.FloatRange(min=1e-6, max=1e6), default=None,
              help="Open loop: replay arrivals this many times faster.")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Closed loop: keep this many requests in flight.")
@click.option("--prefill-interval-mode", type=click.Choice(["local", "off"]), default=None,
              help="The twin's prefill_schedule_interval clock: 'local' is vLLM 0.33's "
                   "single-engine cadence, 'off' models 0.32 (no effect without DP) "
                   "[default: picked from the vLLM version].")
@click.option("--context", type=click.IntRange(min=0), default=3, show_default=True,
              help="Steps shown before the first divergence.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@pd_options
@handle_errors
def fidelity_command(trace: str, vllm_python: str | None, target_flags: TargetFlags,
                     spec_flags: Any, assignments: tuple[str, ...],
                     speedup: float | None, concurrency: int | None,
                     prefill_interval_mode: str | None, context: int, as_json: bool,
                     pd_flags: Any) -> None:
    """Check that the twin schedules TRACE exactly as vLLM's own Scheduler does.

    Replays TRACE on the twin and on vLLM's Scheduler class (in --vllm-python, with
    tuner.vllm_plugin for the cache-aware admission window), on the same clock, and
    compares every step: scheduled requests and token counts, preemptions, prefix-cache
    hits at admission, KV usage. Prints the first divergence with the steps before it,
    a summary and the twin's speed ratio over vllm-core. Exit code 1 when they differ.
    With --pd P:D every pool engine of the disaggregated replay is checked against vLLM's
    scheduler with its NIXL connector (vLLM 0.33.0), driven by that engine's calls.

    \b
    Example:
      tuner fidelity traces/agentic_1h.parquet --vllm-python /opt/tuner-vllm-envs/vllm-0.33.0/bin/python \\
          --hardware h200 --model llama-3.1-8b --block-size 16 --num-gpu-blocks 2000 \\
          --set cache_aware_admission_window=16 --set cache_aware_admission_threshold=0.5
      tuner fidelity traces/agentic_1h.parquet --vllm-python /opt/tuner-vllm-envs/vllm-0.33.0/bin/python \
          --hardware h200 --model llama-3.1-8b --num-gpu-blocks 2000 --pd 1:2 --prefill-tp 2
    """
    from tuner import replay
    from tuner import vllm_compat
    from tuner.fidelity.parity import run_parity
    from tuner.fidelity.runs import twin_options_for
    from tuner.perf.presets import resolve_target

    python = vllm_compat.find_vllm_python(vllm_python, "core")
    target = target_flags.target()
    speculative = spec_flags.build(trace)  # drafts fed to vLLM's scheduler from the same draw
    load = make_load(speedup, concurrency)
    resolved = resolve_target(target)
    settings = replay.parse_settings(assignments, resolved.default_settings)
    layout = pd_flags.layout()
    if layout is not None:
        _pd_fidelity(trace, settings, layout, python=python, target=target, load=load,
                     options=dataclasses.replace(
                         twin_options_for(python, prefill_interval_mode),
                         speculative=speculative),
                     context=context, as_json=as_json, pd_flags=pd_flags)
        return
    report, _, _ = run_parity(trace, settings, vllm_python=python, target=target, load=load,
                              options=dataclasses.replace(
                                  twin_options_for(python, prefill_interval_mode),
                                  speculative=speculative),
                              context=context)
    if as_json:
        echo_json({**report.to_dict(), "settings": settings.to_dict(),
                   "async_scheduling": resolved.async_scheduling})
    else:
        click.echo(f"async_scheduling: {str(resolved.async_scheduling).lower()}")
        click.echo(report.format_text())
    if not report.identical:
        raise SystemExit(1)


def _pd_fidelity(trace: str, settings: Any, layout: Any, *, python: str, target: Any,
                 load: Any, options: Any, context: int, as_json: bool,
                 pd_flags: Any) -> None:
    """``fidelity --pd``: every pool engine against vLLM's (``tuner.fidelity.pd_parity``)."""
    from tuner.errors import ConfigError
    from tuner.fidelity.pd_parity import run_pd_parity

    if pd_flags.serve or pd_flags.check_python:
        raise ConfigError("--pd-serve / --pd-check-vllm print serve commands: use them on "
                          "tuner replay")
    if options.speculative is not None:
        raise ConfigError("--pd with --speculative-config: the P/D replay does not model "
                          "speculative decoding yet; drop one of them")
    report = run_pd_parity(trace, settings, layout=layout, vllm_python=python,
                           target=target, load=load, options=options, context=context)
    if as_json:
        echo_json({**report.to_dict(), "settings": settings.to_dict()})
    else:
        click.echo(report.format_text())
    if not report.identical:
        raise SystemExit(1)


def register(cli: click.Group) -> None:
    """Add ``tuner fidelity`` to ``cli``."""
    cli.add_command(fidelity_command)
