"""``tuner replay``: replay a trace on a backend and print the summary metrics."""

from __future__ import annotations

import sys

import click

from tuner.cli._common import echo_json, handle_errors, make_console
from tuner.cli._progress import progress_display
from tuner.errors import ConfigError

P90_HELP = ("p90 interactivity = 1 / (90th percentile over requests of the per-request mean "
            "inter-token latency): the decode speed, in tokens/s, that the slowest 10% of "
            "users get (SemiAnalysis AgentX definition).")


def _stash_dtype(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """``--quantization``/``--kv-cache-dtype``/``--step-time-source`` go to ``ctx.meta``
    for :func:`make_target`, so every command that takes the target flags gets them
    without a new parameter."""
    if value is not None:
        ctx.meta[f"tuner.target.{param.name}"] = value.lower()


def _stash_value(ctx: click.Context, param: click.Parameter, value: object) -> None:
    """Like :func:`_stash_dtype` for flags whose value is kept as given (``--replicas``,
    ``--enable-expert-parallel``, ``--async-scheduling``, the router's flags)."""
    if value is not None:
        ctx.meta[f"tuner.target.{param.name}"] = value


ASYNC_HELP = ("As vLLM's --async-scheduling/--no-async-scheduling: replay the engine that "
              "overlaps scheduling with the GPU (batch queue of 2) or the synchronous one "
              "[default: what vLLM 0.33.0 resolves for the target: on for GPU targets].")


def target_options(func):  # type: ignore[no-untyped-def]
    """The deployment flags shared by replay-like commands (-> ``tuner.perf.target.Target``)."""
    from tuner.perf.dtypes import KV_CACHE_DTYPES, QUANTIZATION_CHOICES

    opts = [
        click.option("--hardware", default="mi355x", show_default=True,
                     help="Hardware preset (mi355x, mi300x, mi325x, h100, h200, b200) or a YAML file."),
        click.option("--model", default="llama-3.1-70b", show_default=True,
                     help="Model preset name, a Hugging Face config.json (or its folder), or a "
                          "Hugging Face id whose config ships with aiconfigurator-core "
                          "(pip install -e '.[aic]'); no model hub is contacted."),
        click.option("--tp", "--tensor-parallel-size", "tp", type=click.IntRange(min=1),
                     default=1, show_default=True, help="Tensor-parallel size (GPUs per engine)."),
        click.option("--quantization", type=click.Choice(QUANTIZATION_CHOICES, case_sensitive=False),
                     default=None, expose_value=False, callback=_stash_dtype,
                     help="As vLLM's --quantization (fp8, mxfp4, awq, ...) [default: the "
                          "checkpoint's quantization_config, else its dtype]."),
        click.option("--kv-cache-dtype", type=click.Choice(list(KV_CACHE_DTYPES), case_sensitive=False),
                     default=None, expose_value=False, callback=_stash_dtype,
                     help="As vLLM's --kv-cache-dtype [default: auto = the model dtype]."),
        click.option("--step-time-source", type=click.Choice(["auto", "analytic", "aic"],
                                                             case_sensitive=False),
                     default=None, expose_value=False, callback=_stash_dtype,
                     help="Step-time model: aic = NVIDIA's measured vLLM kernel tables from "
                          "aiconfigurator-core (H100/H200/B200, dense bf16/fp8 models), "
                          "analytic = the roofline model [default: auto = aic where installed "
                          "and covered and no --calibration is given, else analytic]."),
        click.option("--async-scheduling/--no-async-scheduling", "async_scheduling",
                     default=None, expose_value=False, callback=_stash_value, help=ASYNC_HELP),
        click.option("--dp", "--data-parallel-size", "dp", type=click.IntRange(min=1),
                     default=1, show_default=True,
                     help="vLLM data-parallel ranks in one deployment, each a TP group with "
                          "its own scheduler and KV cache behind vLLM's internal load "
                          "balancer (MoE ranks step in lockstep)."),
        click.option("--replicas", type=click.IntRange(min=1), default=None,
                     expose_value=False, callback=_stash_value,
                     help="Copies of the deployment (each TP x DP) behind --router "
                          "[default: 1]."),
        click.option("--enable-expert-parallel", is_flag=True, default=None,
                     expose_value=False, callback=_stash_value,
                     help="As vLLM's flag: shard a MoE model's experts over the TP x DP "
                          "ranks (MoE models only)."),
        click.option("--block-size", type=click.IntRange(min=1), default=None,
                     help="KV block size in tokens [default: the hardware's vLLM default]."),
        click.option("--num-gpu-blocks", type=click.IntRange(min=2), default=None,
                     help="KV capacity in blocks, as vLLM's --num-gpu-blocks-override "
                          "[default: computed from GPU memory]."),
        click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True),
                     default=0.92, show_default=True, help="As vLLM's flag."),
        click.option("--max-model-len", type=click.IntRange(min=1), default=None,
                     help="Longest sequence [default: the model's]."),
        click.option("--calibration", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="Calibration YAML from `tuner calibrate` (step-time coefficients)."),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def make_target(hardware: str, model: str, tp: int, dp: int, block_size: int | None,
                num_gpu_blocks: int | None, gpu_memory_utilization: float,
                max_model_len: int | None, calibration: str | None):  # type: ignore[no-untyped-def]
    from tuner.perf.target import Target

    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    return Target(hardware=hardware, model=model, tp=tp, dp=dp, block_size=block_size,
                  num_gpu_blocks=num_gpu_blocks, gpu_memory_utilization=gpu_memory_utilization,
                  max_model_len=max_model_len, calibration=calibration,
                  quantization=meta.get("tuner.target.quantization"),
                  kv_cache_dtype=meta.get("tuner.target.kv_cache_dtype"),
                  step_time_source=meta.get("tuner.target.step_time_source", "auto"),
                  replicas=int(meta.get("tuner.target.replicas") or 1),
                  enable_expert_parallel=bool(meta.get("tuner.target.enable_expert_parallel")),
                  async_scheduling=meta.get("tuner.target.async_scheduling"))


def router_options(func):  # type: ignore[no-untyped-def]
    """The router flags (-> ``tuner.sim.fleet.RouterSettings`` via :func:`make_router`)."""
    from tuner.sim.fleet.router import LOAD_METRICS, ROUTER_POLICIES

    opts = [
        click.option("--router", type=click.Choice(ROUTER_POLICIES), default=None,
                     expose_value=False, callback=_stash_value,
                     help="Router in front of --replicas: round-robin, least-loaded (fewest "
                          "in-flight requests or tokens), session (affinity by session id) "
                          "or prefix-aware (cached-prefix overlap against load, from KV "
                          "events; it also picks the DP rank) [default: round-robin]."),
        click.option("--router-load-metric", type=click.Choice(LOAD_METRICS), default=None,
                     expose_value=False, callback=_stash_value,
                     help="least-loaded/session fallback: count requests or prompt tokens "
                          "in flight [default: requests]."),
        click.option("--router-overlap-weight", type=click.FloatRange(min=0), default=None,
                     expose_value=False, callback=_stash_value,
                     help="prefix-aware: weight of the prefill blocks in the cost, as "
                          "Dynamo's --kv-overlap-score-weight [default: 1.0]."),
        click.option("--router-block-size", type=click.IntRange(min=1), default=None,
                     expose_value=False, callback=_stash_value,
                     help="prefix-aware: the router's block size in tokens, a multiple of "
                          "the KV block size [default: the KV block size]."),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


#: router flag -> (RouterSettings field, the policies that read it)
_ROUTER_FLAGS = {"router_load_metric": ("load_metric", ("least-loaded", "session")),
                 "router_overlap_weight": ("overlap_weight", ("prefix-aware",)),
                 "router_block_size": ("block_size", ("prefix-aware",))}


def make_router(target: object):  # type: ignore[no-untyped-def]
    """``RouterSettings`` from the router flags, checked against ``target`` (a router
    needs replicas, or DP ranks for prefix-aware; a parameter needs its policy)."""
    from tuner.sim.fleet import RouterSettings

    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    policy = meta.get("tuner.target.router")
    fields: dict[str, object] = {}
    for flag, (name, policies) in _ROUTER_FLAGS.items():
        value = meta.get(f"tuner.target.{flag}")
        if value is None:
            continue
        option = "--" + flag.replace("_", "-")
        if policy not in policies:
            raise ConfigError(f"{option} applies to --router {' or '.join(policies)} only")
        fields[name] = value
    replicas, dp = getattr(target, "replicas", 1), getattr(target, "dp", 1)
    if policy is not None and replicas == 1 and not (policy == "prefix-aware" and dp > 1):
        raise ConfigError(f"--router {policy} needs --replicas > 1 (one replica has nothing "
                          "to route; prefix-aware also routes over --dp ranks)")
    return RouterSettings(policy=policy or "round-robin", **fields)  # type: ignore[arg-type]


def make_load(speedup: float | None, concurrency: int | None):  # type: ignore[no-untyped-def]
    """``OpenLoop``/``ClosedLoop`` from the two mutually exclusive flags."""
    from tuner.sim.load import ClosedLoop, OpenLoop

    if speedup is not None and concurrency is not None:
        raise ConfigError("use just one of --speedup (open loop) or --concurrency (closed loop)")
    if concurrency is not None:
        return ClosedLoop(concurrency)
    return OpenLoop(speedup=1.0 if speedup is None else speedup)


@click.command(name="replay", epilog=P90_HELP)
@click.argument("trace", type=click.Path(exists=True))
@click.option("--backend", default="sim", show_default=True,
              help="Replay backend: sim (the CPU twin), vllm-core, vllm-serve.")
@target_options
@router_options
@click.option("--set", "assignments", multiple=True, metavar="FIELD=VALUE",
              help="Scheduler setting by its SchedulerConfig name (repeatable), e.g. "
                   "--set cache_aware_admission_window=16. Unset fields keep vLLM's defaults "
                   "for the GPU.")
@click.option("--speedup", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Open loop at the trace's arrival times divided by X [default: 1].")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Closed loop: keep N requests in flight, issued in trace order.")
@click.option("--measure-from", type=float, default=None, metavar="S",
              help="Count only requests arriving at or after S seconds (skip warm-up).")
@click.option("--measure-to", type=float, default=None, metavar="S",
              help="Count only requests arriving before S seconds (skip drain).")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write one row per request to this Parquet file.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar [default: on when stderr is a terminal].")
@handle_errors
def replay_command(trace: str, backend: str, hardware: str, model: str, tp: int, dp: int,
                   block_size: int | None, num_gpu_blocks: int | None,
                   gpu_memory_utilization: float, max_model_len: int | None,
                   calibration: str | None, assignments: tuple[str, ...],
                   speedup: float | None, concurrency: int | None,
                   measure_from: float | None, measure_to: float | None, out: str | None,
                   as_json: bool, progress: bool | None) -> None:
    """Replay TRACE under scheduler settings and print latency, interactivity and throughput.

    p90 interactivity is 1 / the p90 over requests of the per-request mean inter-token
    latency: the speed the slowest 10% of users get.

    \b
    Example:
      tuner replay traces/agentic_1h.parquet --hardware mi355x --model llama-3.1-70b \\
          --tp 8 --block-size 16 --set cache_aware_admission_window=16 \\
          --set cache_aware_admission_threshold=0.5 --measure-from 300 --out results.parquet
      tuner replay traces/agentic_1h.parquet --model llama-3.1-70b --tp 4 --dp 2 \\
          --replicas 2 --router prefix-aware --router-overlap-weight 2 --json
    """
    from tuner import replay
    from tuner.metrics import (engine_table, kv_capacity_tokens, rejection_warning, summarize,
                               summary_table, write_requests_parquet)
    from tuner.outputs import check_output
    from tuner.perf.presets import resolve_target

    if out is not None:
        check_output(out, inputs=[trace])

    if measure_from is not None and measure_to is not None and measure_to <= measure_from:
        raise ConfigError(f"--measure-to ({measure_to}) must be greater than --measure-from "
                          f"({measure_from})")
    target = make_target(hardware, model, tp, dp, block_size, num_gpu_blocks,
                         gpu_memory_utilization, max_model_len, calibration)
    load = make_load(speedup, concurrency)
    router = make_router(target)
    settings = replay.parse_settings(assignments, resolve_target(target).default_settings)
    resolved = resolve_target(target, scheduler_settings=settings)  # what run() will model
    if backend != "sim" and (target.replicas > 1 or router.policy != "round-robin"):
        raise ConfigError(f"--backend {backend} replays one deployment; --replicas and "
                          "--router run on the sim backend")
    fleet = {"router": router} if backend == "sim" and target.num_engines > 1 else {}
    with progress_display(progress) as shown:
        result = replay.run(trace, settings, backend=backend, target=target, load=load,
                            progress=shown, **fleet)
    summary = summarize(result, measure_from_s=measure_from, measure_to_s=measure_to)
    warning = rejection_warning(summary.to_dict(), resolved.cache.max_model_len,
                                kv_capacity_tokens=kv_capacity_tokens(resolved.cache))
    if summary.num_requests and summary.num_rejected >= summary.num_requests:
        raise ConfigError(str(warning).removeprefix("WARNING: "))  # no result to show
    if out is not None:
        write_requests_parquet(result, out, inputs=[trace])
    if as_json:
        echo_json({**summary.to_dict(), "settings": settings.to_dict(),
                   "target": resolved.description, "router": router.to_dict(),
                   "step_time_source": resolved.step_time_source, "notes": result.notes})
        return
    click.echo(resolved.description)
    if warning:
        click.echo(warning, err=True)
    # A pipe gets a fixed, wide table instead of rich's 80-column fallback.
    console = make_console()
    console.print(summary_table(summary))
    if len(summary.engines) > 1:
        console.print(engine_table(summary))
    click.echo(P90_HELP)
    if out is not None:
        click.echo(f"wrote {len(result.requests):,} request rows to {out}")


def register(cli: click.Group) -> None:
    """Add ``tuner replay`` to ``cli``."""
    cli.add_command(replay_command)
