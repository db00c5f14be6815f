"""``tuner retune``, ``tuner schedule`` and ``tuner profile history|diff``."""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import click

from tuner.cli._common import echo_json, handle_errors, make_console
from tuner.cli._progress import progress_display
from tuner.errors import ConfigError
from tuner.units import DIFF, cell


@click.command(name="retune")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="The job's retune.yaml (keys in docs/retune.md).")
@click.option("--on-publish", default=None, metavar="CMD",
              help="Shell command run after a new version is published (env: "
                   "TUNER_PROFILE_PATH, TUNER_PROFILE_VERSION, ...); overrides the config.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bars [default: on when stderr is a terminal].")
@handle_errors
def retune_command(config_path: str, on_publish: str | None, as_json: bool,
                   progress: bool | None) -> None:
    """Run the periodic re-tune once: ingest new log lines, tune on the recent window,
    publish a new profile version only if it is better with confidence.

    Exit codes: 0 published, 3 kept, 4 another run holds the lock, 5 published but the
    --on-publish hook failed, 2 bad config, 1 failed (previous profile stays current).

    \b
    Example:
      tuner retune --config /etc/tuner/retune.yaml --on-publish 'systemctl restart vllm'
    """
    from tuner.errors import TunerError
    from tuner.jobs import (EXIT_CONFIG, EXIT_FAILED, EXIT_LOCKED, JobLocked, load_config,
                            run_retune)

    try:
        config = load_config(config_path)
        with progress_display(progress) as shown:
            outcome = run_retune(config, on_publish=on_publish, progress=shown)
    except JobLocked as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(EXIT_LOCKED)
    except ConfigError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    except TunerError as exc:
        click.echo(f"Error: retune failed: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    if as_json:
        echo_json(outcome.to_dict())
    else:
        for note in outcome.notes:
            click.echo(f"note: {note}")
        drift = (outcome.entry.get("drift") or {}).get("score")
        click.echo(f"{outcome.decision}: {outcome.reason}")
        click.echo(f"new requests: {outcome.entry.get('new_requests')}; drift score: {drift}; "
                   f"search: {outcome.entry.get('search', '-')}")
        if outcome.profile_path:
            click.echo(f"current profile: {outcome.profile_path}")
        if outcome.hook is not None:
            error = outcome.hook.get("error")
            click.echo(f"on-publish hook exited {outcome.hook.get('returncode')}"
                       f"{': ' + error if error else ''}",
                       err=outcome.hook.get("returncode") != 0)
    sys.exit(outcome.exit_code)


@click.command(name="schedule")
@click.option("--every", default=None, metavar="N[m|h|d]", help="Period, e.g. 30m, 6h, 1d.")
@click.option("--cron", "cron_expr", default=None, metavar="EXPR",
              help='5-field cron expression, e.g. "15 */6 * * *".')
@click.option("--config", "config_path", required=True, type=click.Path(exists=True,
                                                                         dir_okay=False),
              help="The retune.yaml the job runs with.")
@click.option("--target", "target", type=click.Choice(["cron", "systemd", "kubernetes"]),
              required=True, help="What to generate.")
@click.option("-o", "--output-dir", default=None, type=click.Path(file_okay=False),
              help="Write the files here [default: print them].")
@click.option("--install", is_flag=True,
              help="Install: merge the crontab entry, or write and enable user units.")
@click.option("--name", default="tuner-retune", show_default=True, help="Unit/job name.")
@click.option("--image", default="tuner:latest", show_default=True,
              help="Container image (kubernetes).")
@click.option("--state-claim", default="tuner-state", show_default=True,
              help="PersistentVolumeClaim for state and profiles (kubernetes).")
@click.option("--tuner-bin", default=None,
              help="tuner executable for cron/systemd [default: this one].")
@handle_errors
def schedule_command(every: str | None, cron_expr: str | None, config_path: str, target: str,
                     output_dir: str | None, install: bool, name: str, image: str,
                     state_claim: str, tuner_bin: str | None) -> None:
    """Write (and optionally install) a periodic `tuner retune` job.

    \b
    Example:
      tuner schedule --every 6h --config retune.yaml --target systemd --install
      tuner schedule --cron "15 3 * * *" --config retune.yaml --target kubernetes -o k8s/
    """
    from tuner.jobs.schedule import install as do_install
    from tuner.jobs.schedule import make_spec, render

    exe = tuner_bin or str(pathlib.Path(sys.argv[0]).resolve()
                           if pathlib.Path(sys.argv[0]).name == "tuner" else "tuner")
    spec = make_spec(every=every, cron=cron_expr, config=config_path, tuner=exe, name=name,
                     image=image, state_claim=state_claim)
    # A config the job cannot load would fail on every run: refuse it before writing.
    from tuner.jobs.config import check_runnable, load_config

    check_runnable(load_config(config_path))
    files = render(spec, target)  # type: ignore[arg-type]
    if output_dir is not None:
        from tuner.outputs import write_text

        for fname, text in files.items():
            path = write_text(pathlib.Path(output_dir) / fname, text, inputs=[config_path])
            click.echo(f"wrote {path}")
    elif not install:
        for fname, text in files.items():
            click.echo(f"# {fname}\n{text}", nl=False)
    if install:
        result = do_install(spec, target, files,  # type: ignore[arg-type]
                            manifest_dir=None if output_dir is None else pathlib.Path(output_dir))
        for msg in result.messages:
            click.echo(msg, err=not result.ok)
        if not result.ok:
            click.echo(f"Error: --install did not schedule {spec.name}; see above", err=True)
            sys.exit(1)


@click.group(name="profile")
def profile_group() -> None:
    """Profile versions kept by `tuner retune`: history and differences.

    \b
    Example:
      tuner profile history prod --profiles-dir /var/lib/tuner/profiles
      tuner profile diff prod@1 prod@current --profiles-dir /var/lib/tuner/profiles
    """


@profile_group.command(name="history")
@click.argument("name")
@click.option("--profiles-dir", default="profiles", show_default=True,
              type=click.Path(file_okay=False), help="Folder holding NAME/.")
@click.option("--json", "as_json", is_flag=True, help="Print the changelog as JSON.")
@handle_errors
def history_command(name: str, profiles_dir: str, as_json: bool) -> None:
    """One line per retune run of profile NAME: date, window, drift, decision, deltas.

    \b
    Example:
      tuner profile history prod --profiles-dir /var/lib/tuner/profiles --json
    """
    from tuner.jobs.history import ProfileHistory

    history = ProfileHistory(profiles_dir, name)
    if not history.root.is_dir():
        folder = pathlib.Path(profiles_dir)
        have = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        raise ConfigError(f"{history.root}: no profile history named {name!r}"
                          + (f" (found: {', '.join(have)})" if have else
                             f"; is --profiles-dir {profiles_dir} right?"))
    entries = history.changelog()
    if as_json:
        echo_json({"profile": name, "current_version": history.current_version(),
                   "versions": history.versions(), "runs": entries})
        return
    cur = history.current_version()
    click.echo(f"{name}: current v{cur:04d}" if cur else f"{name}: no version published")
    for e in entries:
        win = e.get("window") or {}
        deltas = _deltas(e)
        ver = f" v{e['version']:04d}" if e.get("version") else ""
        click.echo(f"{e.get('date')} {e.get('decision')}{ver} requests={win.get('requests', 0)} "
                   f"new={e.get('new_requests')} drift={(e.get('drift') or {}).get('score')} "
                   f"{deltas} ({e.get('reason')})")


def _deltas(entry: dict[str, Any]) -> str:
    ev = (entry.get("evaluation") or {}).get("holdout") or {}
    return " ".join(f"{k}={v['improvement']:+.1%}[>={v['lower']:+.1%}]" for k, v in ev.items()
                    if isinstance(v, dict) and v.get("improvement") is not None)


@profile_group.command(name="diff")
@click.argument("a")
@click.argument("b")
@click.option("--name", default=None, help="Profile name for bare version numbers (3, v3).")
@click.option("--profiles-dir", default="profiles", show_default=True,
              type=click.Path(file_okay=False), help="Folder holding NAME/.")
@click.option("--all", "show_all", is_flag=True, help="Also show rows that did not change.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@handle_errors
def diff_command(a: str, b: str, name: str | None, profiles_dir: str, show_all: bool,
                 as_json: bool) -> None:
    """Settings and predicted metrics of two profiles side by side.

    A and B are paths, NAME@N / NAME@current, or bare numbers with --name.

    \b
    Example:
      tuner profile diff 3 current --name prod --profiles-dir /var/lib/tuner/profiles
    """
    from rich.table import Table

    from tuner.jobs.diff import diff_profiles, resolve_profile_ref
    from tuner.profile import load_profile

    pa = resolve_profile_ref(a, profiles_dir=profiles_dir, name=name)
    pb = resolve_profile_ref(b, profiles_dir=profiles_dir, name=name)
    rows = diff_profiles(load_profile(pa), load_profile(pb))
    if as_json:
        echo_json({"a": pa, "b": pb, **rows})
        return
    console = make_console()
    if not show_all and not any(r["changed"] for items in rows.values() for r in items):
        click.echo(f"no differences between {pa} and {pb} (--all shows every row)")
        return
    for section, items in rows.items():
        table = Table(title=section)
        for col in ("key", pathlib.Path(pa).name, pathlib.Path(pb).name):
            table.add_column(col)
        for r in items:
            if r["changed"] or show_all:
                table.add_row(r["key"], _fmt(r["a"]), _fmt(r["b"]))
        console.print(table)


def _fmt(value: Any) -> str:
    return cell(value, DIFF)


@click.group(name="cluster")
def cluster_group() -> None:
    """Distributed tuning on Kubernetes: N pods sharing one PostgreSQL-backed study.

    \b
    Example:
      tuner cluster job --name agentic --pods 8 --trials 400 \\
          --storage postgresql://tuner@postgres/tuner --trace traces/agentic.parquet \\
          --image registry.example.com/tuner:0.1.0 -o k8s/ -- \\
          --hardware mi355x --model llama-3.1-70b --tp 8 --space scheduler
      kubectl apply -f k8s/agentic.tune-job.yaml
    """


@cluster_group.command(name="job", context_settings={"ignore_unknown_options": True})
@click.option("--name", required=True, help="Job and study name (lowercase, digits, '-').")
@click.option("--pods", type=click.IntRange(min=1), required=True,
              help="Pods: one lead (tunes and writes the profile) plus workers that join.")
@click.option("--trials", type=click.IntRange(min=1), default=200, show_default=True,
              help="Stage-1 trials of the study, all pods together.")
@click.option("--storage", required=True, metavar="URL",
              help="postgresql://USER@HOST[:PORT]/DB (no password: see --password-secret).")
@click.option("--password-secret", default="tuner-postgres", show_default=True,
              help="Secret whose key 'password' becomes PGPASSWORD ('' for none).")
@click.option("--trace", required=True,
              help="The trace on the volume (relative to its root, or absolute in the pod).")
@click.option("--image", default="tuner:latest", show_default=True,
              help="The tuner image (Dockerfile at the repository root).")
@click.option("--state-claim", default="tuner-state", show_default=True,
              help="PersistentVolumeClaim with the trace; the profile is written there.")
@click.option("--cpu", default="2", show_default=True, help="CPU request per pod.")
@click.option("--memory", default="4Gi", show_default=True, help="Memory request per pod.")
@click.option("-o", "--output-dir", default=None, type=click.Path(file_okay=False),
              help="Write NAME.tune-job.yaml here [default: print it].")
@click.argument("tune_args", nargs=-1, type=click.UNPROCESSED)
@handle_errors
def cluster_job_command(name: str, pods: int, trials: int, storage: str,
                        password_secret: str, trace: str, image: str, state_claim: str,
                        cpu: str, memory: str, output_dir: str | None,
                        tune_args: tuple[str, ...]) -> None:
    """Write a Kubernetes Job that tunes TRACE with --pods pods on one study.

    TUNE_ARGS (after --) are the target and search flags of `tuner tune`. Pod 0 tunes and
    writes the profile to the volume; the others wait for the study and join it.

    \b
    Example:
      tuner cluster job --name agentic --pods 8 --trials 400 \\
          --storage postgresql://tuner@postgres/tuner --trace traces/agentic.parquet \\
          -o k8s/ -- --hardware mi355x --model llama-3.1-70b --tp 8
    """
    import yaml

    from tuner.jobs.cluster import ClusterTuneSpec, tune_job_manifest

    spec = ClusterTuneSpec(name=name, trace=trace, storage=storage, pods=pods, trials=trials,
                           tune_args=tuple(tune_args), image=image, state_claim=state_claim,
                           password_secret=password_secret or None, cpu=cpu, memory=memory)
    check_tune_args(spec.tune_args, trials)
    text = yaml.safe_dump(tune_job_manifest(spec), sort_keys=False)
    if output_dir is None:
        click.echo(text, nl=False)
        return
    from tuner.outputs import write_text

    path = write_text(pathlib.Path(output_dir) / f"{name}.tune-job.yaml", text)
    click.echo(f"wrote {path}; start it with `kubectl apply -f {path}`; the profile lands "
               f"at {spec.profile_in_pod} on {state_claim}")


def check_tune_args(tune_args: tuple[str, ...], trials: int) -> None:
    """Parse the lead's ``tuner tune`` arguments with tune's own Click parser and build its
    target, as the pod will: ``-- --bogus-flag`` or ``--tp 3`` used to be written into the
    manifest and fail only in the cluster.

    Paths are the pod's (its volume), so options that must name an existing file are
    checked for their form only; a model or hardware given as a path is not resolved.
    """
    import dataclasses
    import os

    from tuner.cli._replay import TargetFlags
    from tuner.cli._tune import tune_command

    args = list(tune_args)
    pod_paths = {opt for param in tune_command.params if isinstance(param, click.Option)
                 and isinstance(param.type, click.Path) and param.type.exists
                 for opt in param.opts}
    for i, arg in enumerate(args):
        name, eq, _ = arg.partition("=")
        if name in pod_paths:
            if eq:
                args[i] = f"{name}={os.devnull}"
            elif i + 1 < len(args):
                args[i + 1] = os.devnull
    argv = [os.devnull, *args, "--trials", str(trials), "-o", "profile.yaml"]
    try:
        ctx = tune_command.make_context("tune", argv)
    except click.ClickException as exc:
        raise ConfigError(f"the tune arguments after --: {exc.format_message()}") from None
    names = {f.name for f in dataclasses.fields(TargetFlags)}
    flags = TargetFlags.from_click({k: v for k, v in ctx.params.items() if k in names})
    flags = dataclasses.replace(flags, calibration=None)  # the pod's file, not ours
    if any("/" in value or value.endswith((".yaml", ".json"))
           for value in (flags.hardware, flags.model)):
        return  # a file in the pod: not here to resolve
    from tuner.perf.presets import resolve_target

    with ctx:
        try:
            resolve_target(flags.target())
        except ConfigError as exc:
            raise ConfigError(f"the tune arguments after --: {exc}") from None


@cluster_group.command(name="wait")
@click.argument("study")
@click.option("--storage", required=True, metavar="URL", help="The study's database URL.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=900.0,
              show_default=True, help="Seconds to wait before giving up.")
@handle_errors
def cluster_wait_command(study: str, storage: str, timeout_s: float) -> None:
    """Wait until STUDY exists (a worker pod runs this before `tune --join`).

    \b
    Example:
      tuner cluster wait agentic --storage postgresql://tuner@postgres/tuner --timeout 600
    """
    from tuner.jobs.cluster import wait_for_study

    waited = wait_for_study(storage, study, timeout_s=timeout_s)
    click.echo(f"study {study!r} is ready (waited {waited:.0f} s)", err=True)


def register(cli: click.Group) -> None:
    """Add ``retune``, ``schedule``, the ``profile`` group and the ``cluster`` group."""
    cli.add_command(retune_command)
    cli.add_command(schedule_command)
    cli.add_command(profile_group)
    cli.add_command(cluster_group)
