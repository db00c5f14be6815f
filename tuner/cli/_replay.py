"""``tuner replay``: replay a trace on a backend and print the summary metrics."""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable

import click

from tuner.cli._common import echo_json, handle_errors, make_console
from tuner.cli._pd import pd_options
from tuner.cli._progress import progress_display
from tuner.cli._spec import spec_lines, spec_options
from tuner.errors import ConfigError

if TYPE_CHECKING:
    from tuner.perf.target import Target
    from tuner.sim.fleet import RouterSettings

P90_HELP = ("p90 interactivity = 1 / (90th percentile over requests of the per-request mean "
            "inter-token latency): the decode speed, in tokens/s, that the slowest 10% of "
            "users get (SemiAnalysis AgentX definition).")


@dataclass(frozen=True)
class TargetFlags:
    """The deployment flags of a command that models one (:func:`target_options`), as
    typed values: the command gets this one object and builds its ``Target`` from it."""

    hardware: str = "mi355x"  # preset name or YAML file
    model: str = "llama-3.1-70b"  # preset, config.json (or its folder) or a HF id
    tp: int = 1  # --tensor-parallel-size
    dp: int = 1  # --data-parallel-size
    block_size: int | None = None  # None: the hardware's vLLM default
    num_gpu_blocks: int | None = None  # None: computed from GPU memory
    gpu_memory_utilization: float = 0.92
    max_model_len: int | None = None  # None: the model's
    calibration: str | None = None  # a `tuner calibrate` YAML
    quantization: str | None = None  # lower case, vLLM's names; None: the checkpoint's
    kv_cache_dtype: str | None = None  # lower case; None: auto
    step_time_source: str = "auto"  # auto | analytic | aic
    replicas: int = 1  # copies behind the router
    enable_expert_parallel: bool = False
    async_scheduling: bool | None = None  # None: what vLLM 0.33.0 resolves for the target
    kv_offloading_size: float | None = None  # GiB of host memory for the CPU KV tier; None: off
    kv_offloading_backend: str = "native"  # native | lmcache (a modelled tier)
    kv_offloading_eviction_policy: str = "lru"  # lru | arc
    kv_offloading_blocks_per_chunk: int = 1  # GPU blocks per CPU chunk
    api_server_count: int | None = None  # vLLM --api-server-count; None: the DP size, 0: none

    @classmethod
    def from_click(cls, values: dict[str, Any]) -> "TargetFlags":
        """From Click's values (flags not given are None: their defaults here)."""
        given = {k: v for k, v in values.items() if v is not None}
        for name in ("quantization", "kv_cache_dtype", "step_time_source"):
            if name in given:
                given[name] = given[name].lower()
        return cls(**given)

    def target(self) -> "Target":
        from tuner.perf.target import Target

        return Target(**{f.name: getattr(self, f.name) for f in fields(self)})


@dataclass(frozen=True)
class RouterFlags:
    """The router flags (:func:`router_options`); None: not given."""

    policy: str | None = None  # --router
    load_metric: str | None = None  # --router-load-metric
    overlap_weight: float | None = None  # --router-overlap-weight
    block_size: int | None = None  # --router-block-size

    def settings(self, target: Any) -> "RouterSettings":
        """``RouterSettings``, checked against ``target`` (a router needs replicas, or DP
        ranks for prefix-aware; a parameter needs its policy)."""
        from tuner.sim.fleet import RouterSettings

        values: dict[str, object] = {}
        for name, policies in _ROUTER_PARAMS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if self.policy not in policies:
                raise ConfigError(f"--router-{name.replace('_', '-')} applies to --router "
                                  f"{' or '.join(policies)} only")
            values[name] = value
        policy = self.policy
        replicas, dp = getattr(target, "replicas", 1), getattr(target, "dp", 1)
        if policy is not None and replicas == 1 and not (policy == "prefix-aware" and dp > 1):
            raise ConfigError(f"--router {policy} needs --replicas > 1 (one replica has "
                              "nothing to route; prefix-aware also routes over --dp ranks)")
        return RouterSettings(policy=policy or "round-robin", **values)  # type: ignore[arg-type]


#: router parameter -> the policies that read it
_ROUTER_PARAMS = {"load_metric": ("least-loaded", "session"),
                  "overlap_weight": ("prefix-aware",), "block_size": ("prefix-aware",)}


def _collect(func: Callable[..., Any], names: dict[str, str], into: str,
             build: Callable[[dict[str, Any]], Any]) -> Callable[..., Any]:
    """``func`` taking one object ``into`` (``build`` of the Click values ``names`` lists,
    Click parameter -> field) instead of one parameter per flag."""
    @functools.wraps(func)
    def with_object(*args: Any, **kwargs: Any) -> Any:
        values = {field: kwargs.pop(param) for param, field in names.items()}
        return func(*args, **{into: build(values)}, **kwargs)

    return with_object


ASYNC_HELP = ("As vLLM's --async-scheduling/--no-async-scheduling: replay the engine that "
              "overlaps scheduling with the GPU (batch queue of 2) or the synchronous one "
              "[default: what vLLM 0.33.0 resolves for the target: on for GPU targets].")


def kv_offloading_options() -> list[Any]:
    """The CPU KV tier's flags (vLLM 0.33.0's names; docs/kv-offloading.md)."""
    return [
        click.option("--kv-offloading-size", type=click.FloatRange(min=0, min_open=True),
                     default=None,
                     help="As vLLM's flag: GiB of host memory for the CPU KV tier (vLLM's "
                          "OffloadingConnector; over all TP ranks) [default: no tier]."),
        click.option("--kv-offloading-backend", type=click.Choice(["native", "lmcache"]),
                     default=None,
                     help="As vLLM's flag: native = vLLM's OffloadingConnector, replayed "
                          "exactly; lmcache = modelled as the same capacity tier, not "
                          "LMCache's own code [default: native]."),
        click.option("--kv-offloading-eviction-policy", type=click.Choice(["lru", "arc"]),
                     default=None,
                     help="The CPU pool's eviction_policy (kv_connector_extra_config) "
                          "[default: lru]."),
        click.option("--kv-offloading-blocks-per-chunk", type=click.IntRange(min=1),
                     default=None,
                     help="GPU blocks per CPU chunk (kv_connector_extra_config "
                          "blocks_per_chunk) [default: 1]."),
    ]


def target_options(func):  # type: ignore[no-untyped-def]
    """The deployment flags shared by replay-like commands: the command gets them as one
    :class:`TargetFlags`, parameter ``target_flags`` (``.target()`` is the ``Target``)."""
    from tuner.perf.dtypes import KV_CACHE_DTYPES, QUANTIZATION_CHOICES

    opts = [
        click.option("--hardware", default=TargetFlags.hardware, show_default=True,
                     help="Hardware preset (mi355x, mi300x, mi325x, h100, h200, b200) or a YAML file."),
        click.option("--model", default=TargetFlags.model, show_default=True,
                     help="Model preset name, a Hugging Face config.json (or its folder), or a "
                          "Hugging Face id: a preset's or bundled config's id works as is, "
                          "others need aiconfigurator-core (pip install -e '.[aic]'); no "
                          "model hub is contacted."),
        click.option("--tp", "--tensor-parallel-size", "tp", type=click.IntRange(min=1),
                     default=TargetFlags.tp, show_default=True,
                     help="Tensor-parallel size (GPUs per engine)."),
        click.option("--quantization", type=click.Choice(QUANTIZATION_CHOICES, case_sensitive=False),
                     default=None,
                     help="As vLLM's --quantization (fp8, mxfp4, awq, ...) [default: the "
                          "checkpoint's quantization_config, else its dtype]."),
        click.option("--kv-cache-dtype", type=click.Choice(list(KV_CACHE_DTYPES), case_sensitive=False),
                     default=None,
                     help="As vLLM's --kv-cache-dtype [default: auto = the model dtype]."),
        click.option("--step-time-source", type=click.Choice(["auto", "analytic", "aic"],
                                                             case_sensitive=False),
                     default=None,
                     help="Step-time model: aic = NVIDIA's measured vLLM kernel tables from "
                          "aiconfigurator-core (H100/H200/B200, dense bf16/fp8 models), "
                          "analytic = the roofline model [default: auto = aic where installed "
                          "and covered and no --calibration is given, else analytic]."),
        click.option("--async-scheduling/--no-async-scheduling", "async_scheduling",
                     default=None, help=ASYNC_HELP),
        click.option("--dp", "--data-parallel-size", "dp", type=click.IntRange(min=1),
                     default=TargetFlags.dp, show_default=True,
                     help="vLLM data-parallel ranks in one deployment, each a TP group with "
                          "its own scheduler and KV cache behind vLLM's internal load "
                          "balancer (MoE ranks step in lockstep)."),
        click.option("--replicas", type=click.IntRange(min=1), default=None,
                     help="Copies of the deployment (each TP x DP) behind --router "
                          "[default: 1]."),
        click.option("--enable-expert-parallel", is_flag=True, default=None,
                     help="As vLLM's flag: shard a MoE model's experts over the TP x DP "
                          "ranks (MoE models only)."),
        click.option("--block-size", type=click.IntRange(min=1), default=None,
                     help="KV block size in tokens [default: the hardware's vLLM default]."),
        click.option("--num-gpu-blocks", type=click.IntRange(min=2), default=None,
                     help="KV capacity in blocks, as vLLM's --num-gpu-blocks-override "
                          "[default: computed from GPU memory]."),
        click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True),
                     default=TargetFlags.gpu_memory_utilization, show_default=True,
                     help="As vLLM's flag."),
        click.option("--max-model-len", type=click.IntRange(min=1), default=None,
                     help="Longest sequence [default: the model's]."),
        click.option("--calibration", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="Calibration YAML from `tuner calibrate` (step-time coefficients)."),
        click.option("--api-server-count", type=click.IntRange(min=0), default=None,
                     help="As vLLM's flag: API server processes per replica (tokenise, "
                          "detokenise, stream; one core each). Replays on the twin price "
                          "them on the client side of the summary (queue wait, "
                          "utilisation); 0 leaves them out [default: the --dp size, as "
                          "vLLM]."),
        *kv_offloading_options(),
    ]
    names = {f.name: f.name for f in fields(TargetFlags)}
    func = _collect(func, names, "target_flags", TargetFlags.from_click)
    for opt in reversed(opts):
        func = opt(func)
    return func


def router_options(func):  # type: ignore[no-untyped-def]
    """The router flags: the command gets them as one :class:`RouterFlags`, parameter
    ``router_flags`` (``.settings(target)`` is the ``RouterSettings``)."""
    from tuner.sim.fleet.router import LOAD_METRICS, ROUTER_POLICIES

    opts = [
        click.option("--router", type=click.Choice(ROUTER_POLICIES), default=None,
                     help="Router in front of --replicas: round-robin, least-loaded (fewest "
                          "in-flight requests or tokens), session (affinity by session id) "
                          "or prefix-aware (cached-prefix overlap against load, from KV "
                          "events; it also picks the DP rank) [default: round-robin]."),
        click.option("--router-load-metric", type=click.Choice(LOAD_METRICS), default=None,
                     help="least-loaded/session fallback: count requests or prompt tokens "
                          "in flight [default: requests]."),
        click.option("--router-overlap-weight", type=click.FloatRange(min=0), default=None,
                     help="prefix-aware: weight of the prefill blocks in the cost, as "
                          "Dynamo's --kv-overlap-score-weight [default: 1.0]."),
        click.option("--router-block-size", type=click.IntRange(min=1), default=None,
                     help="prefix-aware: the router's block size in tokens, a multiple of "
                          "the KV block size [default: the KV block size]."),
    ]
    names = {"router": "policy", "router_load_metric": "load_metric",
             "router_overlap_weight": "overlap_weight", "router_block_size": "block_size"}
    func = _collect(func, names, "router_flags", lambda values: RouterFlags(**values))
    for opt in reversed(opts):
        func = opt(func)
    return func


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
@spec_options
@router_options
@pd_options
@click.option("--set", "assignments", multiple=True, metavar="FIELD=VALUE",
              help="Scheduler setting by its SchedulerConfig name (repeatable), e.g. "
                   "--set cache_aware_admission_window=16. Unset fields keep vLLM's defaults "
                   "for the GPU.")
@click.option("--speedup", type=click.FloatRange(min=1e-6, max=1e6), default=None,
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
def replay_command(trace: str, backend: str, target_flags: TargetFlags,
                   spec_flags: Any, router_flags: RouterFlags, pd_flags: Any,
                   assignments: tuple[str, ...],
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
                               summary_table, with_bands, write_requests_parquet)
    from tuner.outputs import check_output
    from tuner.perf.presets import resolve_target
    from tuner.sim.settings import SimOptions
    from tuner.sim.spec_decode import spec_summary

    if out is not None:
        check_output(out, inputs=[trace])

    if measure_from is not None and measure_to is not None and measure_to <= measure_from:
        raise ConfigError(f"--measure-to ({measure_to}) must be greater than --measure-from "
                          f"({measure_from})")
    target = target_flags.target()
    speculative = spec_flags.build(trace)
    load = make_load(speedup, concurrency)
    router = router_flags.settings(target)
    settings = replay.parse_settings(assignments, resolve_target(target).default_settings)
    resolved = resolve_target(target, scheduler_settings=settings)  # what run() will model
    if backend != "sim" and (target.replicas > 1 or router.policy != "round-robin"):
        raise ConfigError(f"--backend {backend} replays one deployment; --replicas and "
                          "--router run on the sim backend")
    fleet = {"router": router} if backend == "sim" and target.num_engines > 1 else {}
    layout = pd_flags.layout()
    if layout is not None:  # disaggregated pools (docs/disaggregation.md)
        if backend != "sim" or speculative is not None or router.policy != "round-robin":
            raise ConfigError("--pd replays on the sim backend, without --router and "
                              "speculative decoding")
        from tuner.replay import pd_pools

        pd_pools(layout, resolved, settings)  # refuse a bad layout before the replay
        fleet = {"pd": layout}
    spec_kw = {} if speculative is None else {"options": SimOptions(speculative=speculative)}
    with progress_display(progress) as shown:
        result = replay.run(trace, settings, backend=backend, target=target, load=load,
                            progress=shown, **fleet, **spec_kw)
    num_out = sum(int(r.output_len) for r in result.requests if r.status == "finished")
    from tuner.perf.api_server import api_server_line, replay_api_server

    summary = with_bands(summarize(result, measure_from_s=measure_from, measure_to_s=measure_to,
                                   api_server=replay_api_server(target, backend)),
                         result, resolved)
    warning = rejection_warning(summary.to_dict(), resolved.cache.max_model_len,
                                kv_capacity_tokens=kv_capacity_tokens(resolved.cache))
    if summary.num_requests and summary.num_rejected >= summary.num_requests:
        raise ConfigError(str(warning).removeprefix("WARNING: "))  # no result to show
    if out is not None:
        write_requests_parquet(result, out, inputs=[trace])
    from tuner.metrics.pd import pd_lines, pd_summary

    pd_block = pd_summary(result.counters, summary.api_server)
    if as_json:
        extra = {}
        if pd_block is not None:
            extra["disaggregation"] = {**layout.to_dict(), **pd_block}  # type: ignore[union-attr]
        if speculative is not None:
            extra = {"speculative": {**speculative.to_dict(),
                                     **spec_summary(result.counters, num_out)}}
        echo_json({**summary.to_dict(), "settings": settings.to_dict(),
                   "target": resolved.description, "router": router.to_dict(),
                   "step_time_source": resolved.step_time_source, "notes": result.notes,
                   **extra})
        return
    click.echo(resolved.description)
    if warning:
        click.echo(warning, err=True)
    # A pipe gets a fixed, wide table instead of rich's 80-column fallback.
    console = make_console()
    console.print(summary_table(summary))
    if len(summary.engines) > 1:
        console.print(engine_table(summary))
    if summary.api_server is not None:
        click.echo(api_server_line(summary.api_server))
    if pd_block is not None:
        for line in pd_lines(pd_block):
            click.echo(line)
    if speculative is not None:
        click.echo(f"speculative decoding: {speculative.describe()}")
        for line in spec_lines(result.counters, num_out):
            click.echo(line)
    click.echo(P90_HELP)
    if out is not None:
        click.echo(f"wrote {len(result.requests):,} request rows to {out}")
    if layout is not None and (pd_flags.serve or pd_flags.check_python):
        from tuner.cli._pd import pd_serve_lines

        lines, ok = pd_serve_lines(pd_flags, layout, resolved, settings)
        for line in lines:
            click.echo(line)
        if not ok:
            raise SystemExit(1)


def register(cli: click.Group) -> None:
    """Add ``tuner replay`` to ``cli``."""
    cli.add_command(replay_command)
