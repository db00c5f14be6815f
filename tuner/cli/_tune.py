"""``tuner tune``, ``tuner tune-log`` and ``tuner export``: search, and deployable output."""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Any

import click

from tuner.cli._common import echo_json, handle_errors
from tuner.cli._progress import progress_display
from tuner.cli._serve import server_options
from tuner.cli._replay import RouterFlags, TargetFlags, router_options, target_options
from tuner.cli._spec import spec_options
from tuner.errors import ConfigError

METRICS_HELP = (
    "p90 interactivity = 1 / (90th percentile over requests of the per-request mean "
    "inter-token latency), in tokens/s: the speed the slowest 10% of users get (SemiAnalysis "
    "AgentX definition). Throughput per GPU = output tokens/s of the deployment / its GPUs "
    "(total_throughput_per_gpu counts input + output tokens).")


def search_options(func):  # type: ignore[no-untyped-def]
    """The search flags shared by ``tune`` and ``tune-log``."""
    from tuner.tune.select import PREFER_CHOICES

    opts = [
        click.option("--trials", type=click.IntRange(min=1), default=200, show_default=True,
                     help="Stage-1 trials in total (all workers), baseline included."),
        click.option("--space", default="admission", show_default=True,
                     help="admission (PR #54625's window and threshold), scheduler (adds "
                          "prefill cadence, batch caps, watermark, ...) or a YAML space file."),
        click.option("--objective", "objectives", multiple=True, metavar="KEY[:max|min]",
                     help="Replay metric to optimise (repeatable or comma-separated) "
                          "[default: p90_interactivity,output_throughput_per_gpu]."),
        click.option("--constraint", "constraints", multiple=True, metavar="KEY<=X|KEY>=X",
                     help='Bound on a metric, e.g. "ttft_p90_s<=2.0" (repeatable).'),
        click.option("--backend", default="sim", show_default=True,
                     help="Replay backend for the trials."),
        click.option("--storage", default=None, metavar="URL",
                     help="postgresql://... (parallel/multi-machine) or a journal file "
                          "[default: OUTPUT's folder, NAME.optuna-journal]. Give the password "
                          "through PGPASSWORD or ~/.pgpass, not in the URL."),
        click.option("--study", "study_name", default=None,
                     help="Study name; the same name resumes [default: OUTPUT's stem]."),
        click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Processes on this machine sharing the study."),
        click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True,
                     help="Sampler seed."),
        click.option("--warm-start", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="Profile whose settings and Pareto set start the search."),
        click.option("--prefer", type=click.Choice(PREFER_CHOICES), default="throughput",
                     show_default=True,
                     help="Pick from the Pareto front: within --throughput-tolerance of the "
                          "best throughput the interactivity knee (never below the baseline's "
                          "interactivity), the reverse, or the best product of gains."),
        click.option("--holdout", type=click.FloatRange(0, 1, max_open=True), default=0.25,
                     show_default=True, help="Fraction at the end of the trace kept out of "
                                             "the search and used to confirm the result."),
        click.option("--stage1-fraction", type=click.FloatRange(0, 1, min_open=True),
                     default=0.25, show_default=True,
                     help="Stage 1 replays this leading part of the training window; the "
                          "survivors are replayed on all of it (1 = no staging)."),
        click.option("--survivors", type=click.IntRange(min=1), default=None,
                     help="Points promoted to stage 2 [default: trials/10, 8..32]."),
        click.option("--early-stop/--no-early-stop", "early_stop", default=True,
                     show_default=True,
                     help="Stop a stage-1 replay once it proves a TTFT or end-to-end "
                          "percentile constraint violated (the trial is pruned, never a "
                          "survivor); off: replay every trial whole."),
        click.option("--vllm-version", default="0.33.0", show_default=True,
                     help="vLLM version for the flags printed at the end."),
        click.option("--throughput-tolerance", type=click.FloatRange(0, 100, max_open=True),
                     default=10.0, show_default=True, metavar="PCT",
                     help="The pick may give up this much of the best throughput (percent) "
                          "for the interactivity knee (--prefer interactivity: this much of "
                          "the best interactivity for throughput)."),
        click.option("--ttft-tolerance", default="25", show_default=True, metavar="PCT|off",
                     help="The pick's mean and p90 TTFT may exceed the baseline's by this much "
                          "(percent, +0.1 s); off, or a TTFT objective/constraint, disables it."),
        click.option("--set", "assignments", multiple=True, metavar="FIELD=VALUE",
                     help="Hold a scheduler setting fixed (SchedulerConfig name, repeatable): "
                          "in the baseline and every trial, out of the search space."),
        click.option("--baseline", default=None, metavar="PROFILE|FLAGS",
                     help="What you run today, as a profile or your `vllm serve` flags "
                          "(e.g. \"--max-num-seqs 256 --no-enable-chunked-prefill\"): the "
                          "baseline and trial 0 instead of vLLM's defaults."),
        click.option("--slo", default=None, metavar="KEY:MS,...",
                     help="SLOs for the goodput metric, as vllm bench serve --goodput "
                          "(ttft, tpot, e2el in ms), e.g. --slo ttft:2000,tpot:50 with "
                          "--objective goodput or --constraint goodput>=X."),
        click.option("--gpu-budget", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Also search how N GPUs are laid out: every TP x DP x replicas "
                          "split vLLM would start (TP dividing the attention heads, the "
                          "model fitting), e.g. 8 = TP8, TP4 x DP2, TP4 x 2 replicas, ... "
                          "The --tp/--dp/--replicas given are the baseline split."),
        click.option("--routers", "routers", multiple=True, metavar="POLICY[,POLICY]",
                     help="Router policies searched where a split has replicas "
                          "(round-robin, least-loaded, session, prefix-aware) with their "
                          "parameters [default: all four; one = held fixed]."),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
        click.option("--progress/--no-progress", default=None,
                     help="Progress bars [default: on when stderr is a terminal]."),
    ] + robust_flags() + spec_search_flags() + kv_tier_search_flags() + pd_search_flags()
    for opt in reversed(opts):
        func = opt(func)
    return func


def robust_flags() -> list[Any]:
    """The robust check's flags (``tuner.tune.robust``), in their own group."""
    from tuner.tune.robust import DEFAULT_SHARE, DEFAULT_VARIANTS

    return [
        click.option("--robust", "robust", type=click.Choice(["on", "off"]), default="on",
                     show_default=True,
                     help="Before recommending, replay the pick and the baseline under clock "
                          "variants drawn from the error bands; recommend a point whose "
                          "advantage holds in --robust-share of them."),
        click.option("--clock-variants", "clock_variants", type=click.IntRange(1, 64),
                     default=DEFAULT_VARIANTS, show_default=True, metavar="N",
                     help="Clock variants the robust check replays (prefill, decode, CPU "
                          "and transfer times each at the low or high end of their band)."),
        click.option("--robust-share", "robust_share",
                     type=click.FloatRange(0, 1, min_open=True), default=DEFAULT_SHARE,
                     show_default=True,
                     help="Share of the clock variants in which the advantage must hold."),
    ]


def spec_search_flags() -> list[Any]:
    """Speculative decoding in the search (``tuner.tune.spec_space``); the config itself is
    ``--speculative-config`` (``tuner.cli._spec.spec_options``)."""
    return [
        click.option("--spec-tokens", "spec_tokens", default=None, metavar="K[,K...]",
                     help="Search num_speculative_tokens over these values (0 = speculative "
                          "decoding off), e.g. 0,1,2,3; needs --speculative-config (the "
                          "drafter and its acceptance; its k is the baseline's) "
                          "[default: k held at the config's]."),
    ]


def kv_tier_search_flags() -> list[Any]:
    """The CPU KV tier in the search (``tuner.tune.kv_tier_space``; docs/kv-offloading.md)."""
    return [
        click.option("--kv-offloading-sizes", "kv_offloading_sizes", default=None,
                     metavar="GIB[,GIB...]",
                     help="Search the CPU KV tier's size over these GiB per engine (vLLM's "
                          "--kv-offloading-size unit; 0 = no tier), e.g. 0,128,512 "
                          "[default: the --kv-offloading-size given, or none]."),
        click.option("--kv-offloading-policies", "kv_offloading_policies", default=None,
                     metavar="POLICY[,POLICY]",
                     help="Search the tier's eviction policy over these (lru, arc) "
                          "[default: --kv-offloading-eviction-policy]."),
        click.option("--host-memory-gb", "host_memory_gb",
                     type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Host memory per node the searched tier sizes must fit (size x "
                          "engines per node) [default: the preset's reference node where a "
                          "vendor states one (DGX H100/H200/B200: 2 TB); required otherwise]."),
    ]


def pd_search_flags() -> list[Any]:
    """Disaggregated prefill/decode layouts in the search (``tuner.tune.pd_space``;
    docs/disaggregation.md), in their own group."""
    return [
        click.option("--disaggregated", "disaggregated",
                     type=click.Choice(["off", "on", "auto"]), default="off",
                     show_default=True,
                     help="With --gpu-budget N: also search disaggregated prefill/decode "
                          "layouts (P prefill x TP p and D decode x TP d, P*p + D*d <= N, "
                          "behind vLLM's example proxy): on = only those, auto = those and "
                          "the aggregated splits in one study; the recommendation says "
                          "whether disaggregation wins and the knee P:D ratio."),
        click.option("--pd-tp", "pd_tps", default=None, metavar="T[,T...]",
                     help="With --disaggregated: the TP sizes a pool instance may have, "
                          "e.g. 4,8 [default: every TP that starts]."),
        click.option("--pd-routers", "pd_routers", default=None, metavar="R[,R...]",
                     help="With --disaggregated: the P/D routers searched, of vllm-proxy "
                          "(vLLM's example proxy, round robin), llm-d (its P/D scheduler) "
                          "and dynamo (its KV router) [default: all three]."),
        click.option("--pd-gpus", "pd_gpus", type=click.Choice(["full", "up-to"]),
                     default="full", show_default=True,
                     help="With --disaggregated: P/D layouts of exactly --gpu-budget GPUs "
                          "(as every aggregated split), or of up to that many."),
        click.option("--pd-prefill-hardware", "pd_prefill_hardware", default=None,
                     metavar="HW[,HW...]",
                     help="With --disaggregated: the hardware the prefill pool may run on "
                          "(mixed pools; the decode pool is --hardware), e.g. mi355x,mi300x "
                          "[default: --hardware]. Every GPU counts one in the budget."),
        click.option("--pd-transfer-modes", "pd_transfer_modes", default=None,
                     metavar="M[,M]",
                     help="With --disaggregated: search who moves the KV (vLLM's "
                          "transfer_mode), e.g. pull,push: pull = the decoder reads "
                          "(NixlConnector; MoRIIO READ), push = the prefill instance "
                          "writes (NixlPushConnector; MoRIIO WRITE) [default: pull only]."),
    ]


def robust_options(kw: dict[str, Any]) -> Any:
    """``RobustOptions`` from the flags (the variants are seeded by --seed)."""
    from tuner.tune.robust import RobustOptions

    return RobustOptions(enabled=kw.get("robust", "on") == "on",
                         variants=kw.get("clock_variants") or RobustOptions().variants,
                         share=kw.get("robust_share") or RobustOptions().share,
                         seed=kw.get("seed") or 0)


#: The flags of ``tuner.cli._serve.server_options`` (used by --confirm-top).
SERVER_KEYS = ("endpoint", "launch", "vllm_python", "serve_model", "load_format", "dtype",
               "enforce_eager", "serve_args", "serve_env", "server_log", "startup_timeout",
               "request_timeout")


def _split(values: tuple[str, ...]) -> list[str] | None:
    items = [v.strip() for value in values for v in value.split(",") if v.strip()]
    return items or None


def _run_tune(trace: str, output: str, kw: dict[str, Any], flags: TargetFlags,
              router_flags: RouterFlags) -> Any:
    """Tune, write the profile, report (shared by ``tune`` and ``tune-log``); the profile."""
    from rich.console import Console

    from tuner.profile.recommend import summary_lines, tune_to_profile
    from tuner.tune.options import DeploymentSearch, SearchOptions, StudyOutput, TuneInputs
    from tuner.tune.select import PickRule
    from tuner.tune.kv_tier_space import parse_kv_policies, parse_kv_sizes
    from tuner.tune.spec_space import parse_spec_tokens

    ttft = kw["ttft_tolerance"]
    rule = PickRule(prefer=kw["prefer"], tolerance=kw["throughput_tolerance"] / 100.0,
                    ttft_tolerance=None if ttft.lower() == "off" else _percent(ttft))
    _check_journal_is_not_output(output, kw["storage"])
    target = flags.target()
    inputs = TuneInputs(trace, target=target, backend=kw["backend"], holdout=kw["holdout"],
                        stage1_fraction=kw["stage1_fraction"], slo=kw["slo"],
                        speculative=kw["spec_flags"].build(trace))
    search = SearchOptions(space=kw["space"], objectives=_split(kw["objectives"]),
                           constraints=_split(kw["constraints"]) or (), n_trials=kw["trials"],
                           n_survivors=kw["survivors"], prefer=rule, seed=kw["seed"],
                           robust=robust_options(kw),
                           spec_tokens=parse_spec_tokens(kw["spec_tokens"]),
                           kv_offloading_sizes=parse_kv_sizes(kw["kv_offloading_sizes"]),
                           kv_offloading_policies=parse_kv_policies(
                               kw["kv_offloading_policies"]),
                           host_memory_gb=kw["host_memory_gb"],
                           early_stop=kw.get("early_stop", True))
    # the baseline's router (--router and its parameters), as the replay takes it
    from tuner.tune.pd_space import parse_pool_tps, parse_prefill_hardware

    deployment = DeploymentSearch(router=router_flags.settings(target),
                                  gpu_budget=kw["gpu_budget"], routers=_split(kw["routers"]),
                                  disaggregated=kw["disaggregated"],
                                  pd_tps=parse_pool_tps(kw["pd_tps"]), pd_gpus=kw["pd_gpus"],
                                  pd_routers=_split((kw["pd_routers"] or "",)),
                                  pd_prefill_hardware=parse_prefill_hardware(
                                      kw["pd_prefill_hardware"]),
                                  pd_transfer_modes=None if kw["pd_transfer_modes"] is None else
                                  [m.strip() for m in kw["pd_transfer_modes"].split(",")])
    with progress_display(kw["progress"]) as shown:
        study = StudyOutput(storage=kw["storage"], study_name=kw["study_name"],
                            workers=kw["workers"], progress=shown)
        run = tune_to_profile(output, inputs, search, deployment, study,
                              vllm_version=kw["vllm_version"], baseline=kw["baseline"],
                              fixed=kw["assignments"], warm_start=kw["warm_start"])
    if kw["as_json"]:
        echo_json({**run.result.to_dict(), "profile": str(run.path), "flags": run.command,
                   "async_scheduling": run.profile.target.async_scheduling})
        return run.profile
    console = Console() if sys.stdout.isatty() else Console(width=160)
    lines = summary_lines(run)
    while lines and lines[0].startswith(("OVERLOADED", "WARNING")):  # before anything else
        click.echo(lines.pop(0))
    console.print(run.result.front_table())
    for line in lines:
        click.echo(line)
    click.echo(run.command, nl=False)
    return run.profile


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise ConfigError(f"--ttft-tolerance {text!r}: a percentage (e.g. 25) or off") from None
    if value < 0:
        raise ConfigError(f"--ttft-tolerance {text!r}: must be >= 0")
    return value / 100.0


def _confirm_top(profile: Any, trace: str, top_k: int, server_kw: dict[str, Any],
                 flags: TargetFlags, as_json: bool) -> None:
    """Re-run the profile's Pareto finalists on a real server: predicted against measured."""
    from rich.console import Console
    from rich.table import Table

    from tuner.cli._serve import make_server_options
    from tuner.metrics import summarize
    from tuner.fidelity.validate import confirm_on_server

    options = make_server_options(model=flags.model, tp=flags.tp, block_size=flags.block_size,
                                  num_gpu_blocks=flags.num_gpu_blocks,
                                  max_model_len=flags.max_model_len, **server_kw)
    # The engine the profile was tuned on and deploys: the twin and every server run it.
    mode = profile.target.async_scheduling
    options = options.replace(async_scheduling=mode)
    target = dataclasses.replace(flags.target(), async_scheduling=mode)
    rows = confirm_on_server(profile, trace, options, target=target,
                             summarize=summarize, top_k=top_k,
                             progress=lambda msg: click.echo(msg, err=True))
    if as_json:
        echo_json({"confirmed": rows})
        return
    table = Table(title=f"Pareto finalists on the real server (top {top_k})")
    for col in ("finalist", "metric", "predicted", "measured", "error %"):
        table.add_column(col)
    for row in rows:
        for key, err in row.get("error_pct", {}).items():
            table.add_row(row["name"], key, f"{row['predicted'].get(key, float('nan')):.4g}",
                          f"{row['measured'].get(key, float('nan')):.4g}",
                          "" if err is None else f"{err:+.1f}")
    Console().print(table)


@click.command(name="tune", epilog=METRICS_HELP)
@click.argument("trace", type=click.Path(exists=True), required=False)
@target_options
@spec_options
@router_options
@search_options
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Profile to write (profiles/NAME.yaml); NAME names the study and profile.")
@click.option("--join", "join_study", default=None, metavar="STUDY",
              help="Work on an existing study (needs --storage); TRACE overrides its path.")
@click.option("--confirm-top", "confirm_top", type=click.IntRange(min=1), default=None,
              metavar="K", help="After tuning, re-run the K best Pareto finalists on a real "
              "vLLM server (--launch ...) and print predicted against measured.")
@server_options
@handle_errors
def tune_command(trace: str | None, output: str | None, join_study: str | None,
                 confirm_top: int | None, **kw: Any) -> None:
    """Search scheduler settings for TRACE and write a deployable profile.

    Stage 1 screens --trials points on a short slice of the training window, stage 2
    replays the best on the whole training window, and the Pareto front is checked on the
    held-out window. vLLM's defaults (or --baseline) are trial 0. The pick: within
    --throughput-tolerance of the best throughput, the interactivity knee, never below the
    baseline's interactivity, mean and p90 TTFT within --ttft-tolerance of the baseline's, and
    every constraint met on the held-out window too (docs/tuning.md). Then the pick and the
    baseline are replayed under --clock-variants clocks drawn from the error bands, and the
    recommendation is a point whose advantage holds in --robust-share of them (--robust
    off skips it). An overloaded deployment is reported first, with the TP/replica count
    at which the twin keeps up.

    \b
    Example:
      tuner tune traces/agentic_1h.parquet --hardware mi355x --model llama-3.1-70b \\
          --tp 8 --trials 200 --constraint "ttft_p90_s<=2.0" -o profiles/agentic.yaml
      tuner tune traces/agentic_1h.parquet --tp 8 --workers 4 \\
          --storage postgresql://tuner@db/tuner --study agentic -o profiles/agentic.yaml
      tuner tune --join agentic --storage postgresql://tuner@db/tuner --trials 50
      tuner tune trace.parquet --tp 8 -o p.yaml --set max_num_seqs=256 \\
          --baseline "--max-num-batched-tokens 8192 --no-enable-chunked-prefill"
      tuner tune trace.parquet --tp 8 -o p.yaml --objective goodput,output_throughput_per_gpu \\
          --slo ttft:2000,tpot:50
      tuner tune trace.parquet --tp 8 -o p.yaml --clock-variants 8 --robust-share 1
      tuner tune trace.parquet --model llama-3.1-70b --tp 8 --gpu-budget 8 \\
          --routers round-robin,prefix-aware -o profiles/fleet.yaml
      tuner tune trace.parquet --hardware mi355x --model llama-3.1-70b --tp 8 \\
          --replicas 2 --gpu-budget 16 --disaggregated auto -o profiles/pd.yaml
      tuner tune trace.parquet --model /models/llama --tp 1 -o p.yaml \\
          --confirm-top 3 --launch --vllm-python /opt/vllm/bin/python --load-format dummy
    """
    server_kw = {k: kw.pop(k) for k in SERVER_KEYS}
    flags, router_flags = kw.pop("target_flags"), kw.pop("router_flags")
    if join_study is not None:
        from tuner.tune import join

        if kw["storage"] is None:
            raise ConfigError("--join needs --storage URL (the study's database or journal)")
        with progress_display(kw["progress"]) as shown:
            out = join(join_study, kw["storage"], kw["trials"], trace=trace, progress=shown)
        if kw["as_json"]:
            echo_json(out)
        else:
            click.echo(f"joined {out['study']}: ran {out['trials_run']} trial(s); the study "
                       f"has {out['study_trials']} of {out['n_trials']}")
        return
    if trace is None:
        raise ConfigError("missing TRACE (or use --join STUDY --storage URL)")
    if output is None:
        raise ConfigError("missing -o/--output profiles/NAME.yaml")
    if confirm_top is not None and not server_kw["launch"]:
        raise ConfigError("--confirm-top needs --launch (one fresh server per finalist); "
                          "an --endpoint runs only its own settings")
    profile = _run_tune(trace, output, kw, flags, router_flags)
    if confirm_top is not None:
        _confirm_top(profile, trace, confirm_top, server_kw, flags, kw["as_json"])


def _check_journal_is_not_output(output: str, storage: str | None) -> None:
    """The study's journal (``--storage``, or NAME.optuna-journal beside the profile) must
    not be the profile: ``-o x.optuna-journal`` made both the same file, and the profile
    written last replaced the study."""
    from tuner.tune.storage import default_journal_path, journal_path

    journal = journal_path(storage) if storage else default_journal_path(output)
    if journal is not None and journal.resolve() == pathlib.Path(output).resolve():
        raise ConfigError(f"-o {output}: that is the study's journal file too; name the "
                          f"profile NAME.yaml (the journal goes beside it) or give --storage")


@click.command(name="tune-log", epilog=METRICS_HELP)
@click.argument("logfiles", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--format", "log_format", default="auto", show_default=True,
              help="Log format (as `tuner ingest --format`).")
@target_options
@spec_options
@router_options
@search_options
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="Profile to write; the trace goes beside it as NAME.trace.parquet.")
@handle_errors
def tune_log_command(logfiles: tuple[str, ...], log_format: str, output: str,
                     **kw: Any) -> None:
    """Tune straight from request logs: ingest, tune and export in one command.

    \b
    Example:
      tuner tune-log /var/log/vllm/requests-*.jsonl.zst --hardware mi355x \\
          --model llama-3.1-70b --tp 8 -o profiles/prod.yaml
    """
    from tuner.outputs import check_output
    from tuner.trace import ingest

    flags, router_flags = kw.pop("target_flags"), kw.pop("router_flags")
    out = pathlib.Path(output)
    trace = out.with_name(out.stem + ".trace.parquet")
    check_output(output, inputs=logfiles)
    with progress_display(kw["progress"]) as shown:
        ingest(list(logfiles), trace, format=log_format, progress=shown)
    _run_tune(str(trace), output, kw, flags, router_flags)


@click.command(name="export")
@click.argument("profile", type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["flags", "yaml", "json", "python", "env",
                                                    "plugin", "router"]),
              default="flags", show_default=True,
              help="What to print; router = a fleet profile's router configuration alone.")
@click.option("--vllm-version", default="0.33.0", show_default=True,
              help="Target vLLM release; decides flag spelling and the plugin form.")
@click.option("--native-admission", is_flag=True,
              help="The target vLLM has PR #54625's --cache-aware-admission-* flags (no "
                   "release up to 0.33.0 does); emit them instead of the plugin.")
@click.option("--async-scheduling/--no-async-scheduling", "async_scheduling", default=None,
              help="Override the profile's async scheduling (picks the plugin class; a mode "
                   "other than the one the profile was predicted in is flagged).")
@click.option("--scheduler-cls", "scheduler_cls", default=None, metavar="CLS",
              type=click.Choice(["tuner.vllm_plugin.CacheAwareAsyncScheduler",
                                 "tuner.vllm_plugin.CacheAwareScheduler"]),
              help="As vLLM's --scheduler-cls: which of tuner's plugin classes to deploy "
                   "(implies the plugin form) [default: the class of the mode]. The "
                   "synchronous CacheAwareScheduler is refused with async scheduling on.")
@click.option("--check-vllm", "check_python", default=None, metavar="PYTHON",
              help="Also validate with vLLM: build SchedulerConfig and parse the flags with "
                   "vLLM's parser, using this vLLM environment's interpreter.")
@click.option("-o", "--output", type=click.Path(), default=None,
              help="Write to this file instead of printing; with --format plugin, a folder "
                   "that gets a self-contained plugin (needs only vLLM) and its serve lines.")
@handle_errors
def export_command(profile: str, fmt: str, vllm_version: str, native_admission: bool,
                   async_scheduling: bool | None, scheduler_cls: str | None,
                   check_python: str | None, output: str | None) -> None:
    """Print PROFILE as vLLM configuration: a paste-ready `vllm serve MODEL ...` command
    (flags), a --config YAML, SchedulerConfig kwargs, JSON, a shell snippet, or the
    scheduler-plugin form.

    \b
    Example:
      tuner export profiles/agentic.yaml --format flags --vllm-version 0.33.0
      tuner export profiles/agentic.yaml --format yaml > vllm-config.yaml
      vllm serve meta-llama/Llama-3.1-70B-Instruct --config vllm-config.yaml
      tuner export profiles/agentic.yaml --format plugin -o /srv/vllm-plugin
      tuner export profiles/fleet.yaml --format router > router.sh
    """
    from tuner.cli._plugin import write_export
    from tuner.profile import check_with_vllm, load_profile

    prof = load_profile(profile)
    check = None
    if check_python is not None:  # before anything is written: a failed check writes nothing
        check = check_with_vllm(prof, vllm_version=vllm_version,
                                native_admission=native_admission, python=check_python)
        if check.status == "failed":
            _echo_check(check)
            sys.exit(1)
        if prof.target.disaggregation is not None:  # every pool server's flags, too
            pd_check = _check_pd_profile(prof, vllm_version, native_admission, check_python)
            click.echo(f"vLLM P/D check: {pd_check.status} {pd_check.vllm_version or ''} "
                       + ("; ".join(pd_check.errors) or ", ".join(pd_check.checked)
                          or pd_check.note), err=True)
            if pd_check.status == "failed":
                sys.exit(1)
    write_export(prof, profile, fmt, output, vllm_version=vllm_version,
                 native_admission=native_admission, async_scheduling=async_scheduling,
                 scheduler_cls=scheduler_cls)
    if check is not None:
        _echo_check(check)


def _check_pd_profile(prof: Any, vllm_version: str, native_admission: bool,
                      python: str) -> Any:
    """A P/D profile's pool servers parsed by that vLLM (``tuner.profile.pd_profile``)."""
    from tuner.profile.export import plan_export, serve_command
    from tuner.profile.pd_profile import pd_commands
    from tuner.profile.vllm_check import check_pd_with_vllm

    plan = plan_export(prof, vllm_version=vllm_version, native_admission=native_admission)
    args = serve_command(prof, plan, use_async=prof.target.async_scheduling)
    return check_pd_with_vllm(pd_commands(prof, args[3:]), python=python)


def _echo_check(check: Any) -> None:
    """The ``--check-vllm`` verdict, one line on stderr."""
    click.echo(f"vLLM check: {check.status} {check.vllm_version or ''} "
               f"{'; '.join(check.errors) or check.note}", err=True)


def register(cli: click.Group) -> None:
    """Add ``tune``, ``tune-log`` and ``export``."""
    cli.add_command(tune_command)
    cli.add_command(tune_log_command)
    cli.add_command(export_command)
