"""``tuner report``, ``tuner trace report`` and ``tuner dashboard``: reports people look at.

Thin shells over :mod:`tuner.report` (the HTML pages) and optuna-dashboard (an optional
extra, ``pip install 'vllm-sched-tuner[report]'``).
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import click

from tuner.cli._common import echo_json, handle_errors

DASHBOARD_MISSING = ("optuna-dashboard is not installed; install it with "
                     "pip install 'vllm-sched-tuner[report]'")


def _is_profile(target: str) -> bool:
    p = pathlib.Path(target)
    return p.suffix in (".yaml", ".yml") or p.is_file()


def _write(page: Any, output: str, as_json: bool, inputs: list[str],
           **extra: Any) -> None:
    """Write ``page`` and say what was written (a line, or JSON with ``extra`` fields)."""
    from tuner.report import write_page

    out = write_page(page, output, inputs=inputs)
    summary = {"output": str(out), **extra,
               "charts": _count_charts(out.read_text(encoding="utf-8")),
               "bytes": out.stat().st_size}
    if as_json:
        echo_json(summary)
    else:
        click.echo(f"wrote {out} ({summary['charts']} charts, {summary['bytes']:,} bytes)")


def _count_charts(html: str) -> int:
    return html.count('<svg xmlns="http://www.w3.org/2000/svg"')


@click.command("report")
@click.argument("target", metavar="(STUDY | PROFILE | REPLAY.parquet)")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="HTML file to write (self-contained: no script, nothing fetched).")
@click.option("--storage", default=None,
              help="Study storage: journal file or database URL (default: the profile's, or "
                   "the journal next to it). Required with a STUDY name.")
@click.option("--trace", "trace_path", type=click.Path(), default=None,
              help="The study's trace, if it moved (default: the path stored in the study).")
@click.option("--no-replay", is_flag=True,
              help="Do not replay baseline and tuned; show the stored metrics only.")
@click.option("--no-trace-section", is_flag=True, help="Leave out the trace's charts.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@handle_errors
def report_cmd(target: str, output: str, storage: str | None, trace_path: str | None,
               no_replay: bool, no_trace_section: bool, as_json: bool) -> None:
    """Write an HTML report of a tuning study or profile, or of one replay's records
    (`tuner replay --out FILE.parquet`: the deployment's figures and, for --dp/--replicas,
    the per-engine balance).

    It shows the Pareto front (p90 interactivity against output throughput per GPU) with
    the baseline and the recommended point, trial history, parameter importance, baseline
    against tuned on the training and held-out windows (TTFT and ITL CDFs, prefix-hit rate,
    preemptions), replay time series and the trace's character. p90 interactivity is
    1 / the 90th percentile of per-request mean inter-token latency: the speed the slowest
    10% of users get.

    \b
    Example:
      tuner report profiles/agentic-mi355x.yaml -o report.html
      tuner report agentic --storage postgresql://tuner@db/tuner -o report.html
      tuner replay trace.parquet --tp 2 --replicas 4 --router prefix-aware --out r.parquet
      tuner report r.parquet -o replay.html
    """
    from tuner.errors import ConfigError
    from tuner.outputs import check_output
    from tuner.report import study_report

    inputs = [target] + ([trace_path] if trace_path else [])
    check_output(output, inputs=inputs)  # before the replays, not after
    if target.endswith(".parquet"):
        from tuner.report.replay_report import replay_report

        page = replay_report(target)
        _write(page, output, as_json, inputs, title=page.title,
               sections=[s.title for s in page.sections])
        return
    if _is_profile(target):
        kwargs: dict[str, Any] = {"profile": target, "storage": storage}
    else:
        if storage is None:
            raise ConfigError(f"{target!r} is not a profile file; to report a study by name, "
                              "pass --storage (journal file or database URL)")
        kwargs = {"study": target, "storage": storage}

    def say(msg: str) -> None:
        if not as_json:
            click.echo(msg, err=True)

    page = study_report(**kwargs, trace=trace_path, replay=not no_replay,
                        include_trace=not no_trace_section, on_step=say)
    for warning in page.warnings:
        click.echo(f"Warning: {warning}", err=True)
    _write(page, output, as_json, inputs, title=page.title,
           sections=[s.title for s in page.sections])


@click.command("report")
@click.argument("trace", type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="HTML file to write.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@handle_errors
def trace_report_cmd(trace: str, output: str, as_json: bool) -> None:
    """Write an HTML report of a trace: arrivals over time, prompt and output length
    distributions, prefix reuse (ideal hit rate over time and per request).

    \b
    Example:
      tuner trace report traces/agentic_1h.parquet -o trace.html
    """
    from tuner.outputs import check_output
    from tuner.report import trace_report

    check_output(output, inputs=[trace])
    _write(trace_report(trace), output, as_json, [trace])


@click.command("dashboard")
@click.argument("profile", required=False, type=click.Path())
@click.option("--storage", default=None,
              help="Study storage (journal file or database URL); default: the journal next "
                   "to PROFILE.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=int, help="Port to listen on.")
@handle_errors
def dashboard_cmd(profile: str | None, storage: str | None, host: str, port: int) -> None:
    """Serve optuna-dashboard on a study's storage (live trial plots in a browser).

    Needs the optional extra: pip install 'vllm-sched-tuner[report]'. For a file to share
    instead of a server, use `tuner report`.

    \b
    Example:
      tuner dashboard profiles/agentic-mi355x.yaml
      tuner dashboard --storage postgresql://tuner@db/tuner --port 8081
    """
    from tuner.errors import ConfigError

    try:
        import optuna_dashboard  # type: ignore[import-not-found]
    except ImportError:
        click.echo(f"Error: {DASHBOARD_MISSING}", err=True)
        sys.exit(2)
    if storage is None:
        if profile is None:
            raise ConfigError("give a PROFILE or --storage (journal file or database URL)")
        from tuner.profile import load_profile
        from tuner.report import find_study_storage

        storage = find_study_storage(pathlib.Path(profile), load_profile(profile), None)
        if storage is None:
            raise ConfigError(f"{profile}: no study journal found next to it; pass --storage")
    from tuner.tune import open_storage, redact_url

    click.echo(f"optuna-dashboard on http://{host}:{port} for {redact_url(storage)} "
               "(Ctrl-C to stop)", err=True)
    optuna_dashboard.run_server(open_storage(storage), host=host, port=port)


def register(cli: click.Group) -> None:
    """Add ``report`` and ``dashboard``, and ``report`` under the ``trace`` group."""
    cli.add_command(report_cmd)
    cli.add_command(dashboard_cmd)
    trace_group = cli.commands.get("trace")
    if isinstance(trace_group, click.Group):
        trace_group.add_command(trace_report_cmd)
