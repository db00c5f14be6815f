"""``tuner calibrate`` and ``tuner validate``: ground truth from a real ``vllm serve``."""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import click

from tuner.cli._common import echo_json, handle_errors
from tuner.cli._replay import P90_HELP, TargetFlags, make_load, target_options
from tuner import vllm_compat
from tuner.errors import ConfigError


def server_options(func):  # type: ignore[no-untyped-def]
    """Flags that pick the server: ``--endpoint URL`` or ``--launch`` with its settings.

    Shared with ``tuner tune --backend vllm-serve / --confirm-top`` (see
    :func:`make_server_options`).
    """
    opts = [
        click.option("--endpoint", default=None, metavar="URL",
                     help="Attach to a running vLLM OpenAI server (e.g. http://10.0.0.5:8000)."),
        click.option("--launch", is_flag=True,
                     help="Start `vllm serve` (with --vllm-python and --serve-model) and stop "
                          "it afterwards, Ctrl-C included."),
        click.option("--vllm-python", default=None, metavar="PY",
                     help="Python of the vLLM environment to launch [default: "
                          "$TUNER_VLLM_PYTHON or $TUNER_VLLM032_PYTHON]."),
        click.option("--serve-model", default=None, metavar="PATH",
                     help="Model to serve (path or HF id; a config.json folder works with "
                          "--load-format dummy) [default: --model]."),
        click.option("--load-format", default=None,
                     help="vLLM --load-format (dummy = random weights of the real shape)."),
        click.option("--dtype", default=None, help="vLLM --dtype (float32 on CPU)."),
        click.option("--enforce-eager", is_flag=True, help="vLLM --enforce-eager."),
        click.option("--serve-arg", "serve_args", multiple=True, metavar="ARG",
                     help="Extra `vllm serve` argument, verbatim (repeatable)."),
        click.option("--serve-env", "serve_env", multiple=True, metavar="KEY=VALUE",
                     help="Environment for the server (repeatable), e.g. "
                          "VLLM_CPU_KVCACHE_SPACE=1."),
        click.option("--server-log", default=None, type=click.Path(dir_okay=False),
                     help="Server log file [default: a temp file, named on failure]."),
        click.option("--startup-timeout", default=600.0, show_default=True, type=float,
                     help="Seconds for the server to become ready."),
        click.option("--request-timeout", default=600.0, show_default=True, type=float,
                     help="Seconds for one streamed request before it counts as an error."),
    ]
    for opt in reversed(opts):
        func = opt(func)
    return func


def make_server_options(*, endpoint: str | None, launch: bool, vllm_python: str | None,
                        serve_model: str | None, model: str, tp: int, block_size: int | None,
                        num_gpu_blocks: int | None, max_model_len: int | None,
                        load_format: str | None, dtype: str | None, enforce_eager: bool,
                        serve_args: tuple[str, ...], serve_env: tuple[str, ...],
                        server_log: str | None, startup_timeout: float,
                        request_timeout: float) -> Any:
    """``ServerOptions`` from the :func:`server_options` flags (+ the target flags)."""
    from tuner.serve.server import ServerOptions

    if (endpoint is None) == (not launch):
        raise ConfigError("use exactly one of --endpoint URL (attach) or --launch (start "
                          "vllm serve)")
    env = []
    for item in serve_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--serve-env {item!r}: expected KEY=VALUE")
        env.append((key, value))
    if launch:
        vllm_python = vllm_python or vllm_compat.vllm_python_from_env("serve")
        options = ServerOptions(
            vllm_python=vllm_python, model=serve_model or model, load_format=load_format,
            tp=tp, block_size=block_size, num_gpu_blocks=num_gpu_blocks,
            max_model_len=max_model_len, dtype=dtype, enforce_eager=enforce_eager,
            extra_args=tuple(serve_args), env=tuple(env), log_path=server_log,
            startup_timeout_s=startup_timeout, request_timeout_s=request_timeout)
    else:
        options = ServerOptions(endpoint=endpoint, request_timeout_s=request_timeout)
    options.validate()
    return options


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise ConfigError(f"{flag} {text!r}: expected positive integers")
    return values


def _mixed(text: str) -> tuple[tuple[int, int, int], ...]:
    out = []
    for part in text.split(","):
        bits = part.strip().lower().split("x")
        if len(bits) != 3 or not all(b.isdigit() and int(b) > 0 for b in bits):
            raise ConfigError(f"--mixed {part!r}: expected NxLxP (decoders x context x prefill)")
        out.append((int(bits[0]), int(bits[1]), int(bits[2])))
    return tuple(out)


def _calibrate_from_benchmarks(csv_path: str, output: str, *, loso: bool, as_json: bool) -> None:
    """``tuner calibrate --from-benchmarks``: fit, write the presets file, print errors."""
    from tuner.perf.fit.to_benchmarks import fit_benchmarks, median_abs_error, save_document

    fit = fit_benchmarks(csv_path, loso=loso)
    doc = fit.document()
    path = save_document(output, doc, inputs=[csv_path])
    if as_json:
        echo_json({"output": str(path), **doc,
                   "predictions": [{"row": p.row.id, "figure": p.figure, "published": p.published,
                                    "predicted": p.predicted} for p in fit.in_sample]})
        return
    click.echo(f"wrote {path}: {len(fit.runs)} rows replayed, {len(fit.skipped)} skipped")
    for s in fit.skipped:
        click.echo(f"  skipped {s.id}: {s.reason}")
    click.echo(f"median |error| over {len(fit.in_sample)} figures: in sample "
               f"{100 * median_abs_error(fit.in_sample):.1f}%, priors only "
               f"{100 * median_abs_error(fit.at_priors):.1f}%"
               + (f", leave-one-series-out {100 * median_abs_error(fit.loso):.1f}%"
                  if fit.loso is not None else ""))


def _calibrate_from_metrics(files: tuple[str, ...], trace: str | None, flags: TargetFlags,
                            output: str, *, served_name: str | None, server_flags: str | None,
                            as_json: bool) -> None:
    """``tuner calibrate --from-metrics``: fit the clock to /metrics, write, report."""
    from tuner.fidelity.from_metrics import calibrate_from_metrics, read_window_metrics
    from tuner.outputs import check_output
    from tuner.perf.fit.calibration_file import save_calibration
    from tuner.perf.presets import resolve_target
    from tuner.tune.baseline import baseline_settings, parse_serve_flags

    if trace is None:
        raise ConfigError("--from-metrics needs --trace TRACE: the ingested logs of the window "
                          "the metrics cover")
    check_output(output, inputs=[*files, trace])
    target = flags.target()
    settings = None
    if server_flags:
        settings = baseline_settings(resolve_target(target).default_settings,
                                     flags=parse_serve_flags(server_flags))
    metrics = read_window_metrics(files)
    say = (lambda m: click.echo(f"  {m}", err=True)) if not as_json else None
    fit = calibrate_from_metrics(trace, target, metrics, settings=settings,
                                 served_model_name=served_name, progress=say)
    path = save_calibration(output, fit.calibration)
    if as_json:
        echo_json({"output": str(path), **fit.to_dict()})
        return
    f = fit.factors
    click.echo(f"clock fitted to {metrics.source} in {len(fit.rounds)} replays: prefill "
               f"x{f.prefill:.3f}, decode (and CPU, transfer) x{f.decode:.3f}")
    for h in fit.histograms:
        click.echo(_histogram_line(h))
    click.echo(f"wrote {path} (load it with --calibration)")


def _histogram_line(h: Any) -> str:
    """``vllm:... (fitted): 363 samples; mean 2.81 ms measured, twin 3.98 ms (+41.8 %),
    calibrated 2.83 ms (+0.9 %); p90 ...``."""
    from tuner.units import duration

    def show(x: Any) -> str:
        if x is None:
            return "-"
        return duration(x) if h.name.endswith("_seconds") else f"{x:,.1f}"

    def err(which: str) -> str:
        e = h.error_pct(which)
        return "" if e is None else f" ({e:+.1f} %)"

    m, n, c = h.measured, h.nominal, h.calibrated
    text = (f"{h.name}{' (fitted)' if h.fitted_to else ''}: {m['count']:,.0f} samples; mean "
            f"{show(m['mean'])} measured, twin {show(n['mean'])}{err('nominal')}, calibrated "
            f"{show(c.get('mean'))}{err('calibrated')}")
    for q in ("p50", "p90"):
        if m.get(q) is not None:
            text += f"; {q} {show(m[q])} / {show(n.get(q))} / {show(c.get(q))}"
    return text


@click.command(name="calibrate")
@target_options
@server_options
@click.option("--from-benchmarks", "from_benchmarks", type=click.Path(exists=True, dir_okay=False),
              default=None, help="Fit the per-GPU step-time coefficients to published (or your "
                                 "own `vllm bench serve`) results in this CSV instead of probing "
                                 "a server; -o gets the fitted-presets YAML "
                                 "(docs/step-time-model.md, layout of "
                                 "tuner/perf/data/benchmarks/published-train.csv).")
@click.option("--from-metrics", "from_metrics", multiple=True,
              type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="Fit the clock to a production server's /metrics over the window --trace "
                   "holds: one text dump, two scrapes (before, after; give the flag twice) "
                   "or a Prometheus range-query JSON export (docs/ground-truth.md).")
@click.option("--trace", "metrics_trace", type=click.Path(exists=True), default=None,
              help="With --from-metrics: the window's trace (ingested logs).")
@click.option("--served-model-name", default=None, metavar="NAME",
              help="With --from-metrics: the model_name the metrics carry [default: the "
                   "target model's names].")
@click.option("--server-flags", default=None, metavar="FLAGS",
              help="With --from-metrics: the server's scheduler flags as `vllm serve` takes "
                   "them [default: vLLM's defaults for the GPU].")
@click.option("--leave-one-series-out", "loso", is_flag=True,
              help="With --from-benchmarks: also refit without each series and report how "
                   "well it is predicted.")
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=2048,
              show_default=True, help="Token budget of the launched server (probes stay "
                                      "inside it so no prefill is chunked).")
@click.option("--prefill-lens", default="64,512,1536", show_default=True,
              help="Lone-prefill probe lengths (tokens).")
@click.option("--decode-batch-sizes", default="1,8,24", show_default=True,
              help="Concurrent decoders per decode probe.")
@click.option("--decode-ctx-lens", default="64,512", show_default=True,
              help="Prompt lengths of the decode probes.")
@click.option("--mixed", "mixed", default="8x128x512,8x128x1536", show_default=True,
              help="Mixed-step probes as NxLxP: N decoders at context L plus a P-token prefill.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Runs per probe (the median is kept).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Calibration YAML to write (load it with --calibration).")
@click.option("--json", "as_json", is_flag=True, help="Print probes and errors as JSON.")
@handle_errors
def calibrate_command(target_flags: TargetFlags, **kw: Any) -> None:
    """Fit the twin's step-time model to a real vLLM server and write a calibration file.

    With --from-metrics FILE --trace TRACE it probes nothing: it fits the clock so the
    replay of TRACE reproduces the server's /metrics histograms over the same window and
    prints the fit per histogram (measured / twin / calibrated). Otherwise it
    runs controlled probes (lone prefills, decode batches of several sizes and contexts,
    mixed steps), derives per-step times from client-side token timing, fits the
    per-kernel model's physical coefficients (bounded, with weak priors) and prints the fit error per
    probe class. --hardware and --model name what the twin will run with. The probes
    need whole synchronous steps: a launched server runs --no-async-scheduling and
    --async-scheduling is refused (the fitted model prices both modes).

    \b
    Example (the CPU CI server):
      tuner calibrate --launch --vllm-python $TUNER_VLLM032_PYTHON \\
          --model tests/data/tiny-llama --hardware tests/data/serve/cpu-epyc-2core.yaml \\
          --load-format dummy --dtype float32 --enforce-eager --block-size 32 \\
          --num-gpu-blocks 512 --max-model-len 2048 \\
          --serve-env VLLM_CPU_KVCACHE_SPACE=1 --serve-env VLLM_CPU_OMP_THREADS_BIND=nobind \\
          -o calib.yaml
      tuner replay trace.parquet --hardware ... --model ... --calibration calib.yaml
      tuner calibrate --from-metrics before.txt --from-metrics after.txt \\
          --trace window.parquet --hardware mi355x --model llama-3.1-70b --tp 8 -o calib.yaml
      tuner calibrate --from-metrics range-export.json --trace window.parquet \\
          --hardware mi355x --model llama-3.1-70b --tp 8 -o calib.yaml --json
    """
    flags = target_flags
    if flags.async_scheduling:
        raise ConfigError("--async-scheduling: calibrate times whole steps (CPU + GPU), which "
                          "async scheduling overlaps; it probes a --no-async-scheduling server, "
                          "and the fitted model prices both modes (docs/step-time-model.md §1.3)")
    from_benchmarks, loso = kw.pop("from_benchmarks"), kw.pop("loso")
    from_metrics, metrics_trace = kw.pop("from_metrics"), kw.pop("metrics_trace")
    served_name, server_flags = kw.pop("served_model_name"), kw.pop("server_flags")
    if from_metrics:
        _calibrate_from_metrics(from_metrics, metrics_trace, flags, kw["output"],
                                served_name=served_name, server_flags=server_flags,
                                as_json=kw["as_json"])
        return
    if metrics_trace or served_name or server_flags:
        raise ConfigError("--trace, --served-model-name and --server-flags go with "
                          "--from-metrics FILE")
    if from_benchmarks:
        _calibrate_from_benchmarks(from_benchmarks, kw["output"], loso=loso,
                                   as_json=kw["as_json"])
        return
    from tuner.fidelity.calibrate import ProbePlan
    from tuner.fidelity.runs import calibrate_server
    from tuner.perf.fit.calibration_file import save_calibration

    from tuner.outputs import check_output

    as_json = kw.pop("as_json")
    output = kw.pop("output")
    check_output(output, inputs=[flags.calibration] if flags.calibration else [])
    plan = ProbePlan(prefill_lens=_ints(kw.pop("prefill_lens"), "--prefill-lens"),
                     decode_batch_sizes=_ints(kw.pop("decode_batch_sizes"), "--decode-batch-sizes"),
                     decode_ctx_lens=_ints(kw.pop("decode_ctx_lens"), "--decode-ctx-lens"),
                     mixed=_mixed(kw.pop("mixed")), repeats=kw.pop("repeats"))
    budget = kw.pop("max_num_batched_tokens")
    options = make_server_options(model=flags.model, tp=flags.tp, block_size=flags.block_size,
                                  num_gpu_blocks=flags.num_gpu_blocks,
                                  max_model_len=flags.max_model_len, **kw)
    say = (lambda m: click.echo(f"  {m}", err=True)) if not as_json else None
    result = calibrate_server(options, hardware=flags.hardware, model=flags.model, tp=flags.tp,
                              plan=plan, max_num_batched_tokens=budget,
                              max_model_len=flags.max_model_len, progress=say,
                              quantization=flags.quantization,
                              kv_cache_dtype=flags.kv_cache_dtype)
    path = save_calibration(output, result.calibration)
    if as_json:
        echo_json({"output": str(path), "async_scheduling": False, "probes": result.table(),
                   "errors_by_kind": result.errors_by_kind,
                   "rms_rel_error_pct": 100 * result.fit.rms_rel_error,
                   "coefficients": result.calibration.coefficients.to_dict()})
        return
    click.echo("async_scheduling: false (probes time whole synchronous steps)")
    for row in result.table():
        click.echo(f"{row['kind']:<8} {row['probe']:<24} measured {row['measured_ms']:9.2f} ms"
                   f"  predicted {row['predicted_ms']:9.2f} ms  {row['error_pct']:+7.1f} %")
    for kind, err in result.errors_by_kind.items():
        click.echo(f"{kind}: mean |error| {err['mean_abs_pct']:.1f} %, max "
                   f"{err['max_abs_pct']:.1f} % over {err['num_probes']} probes")
    click.echo(f"wrote {path}")


@click.command(name="validate", epilog=P90_HELP)
@click.argument("profile_path", metavar="PROFILE", type=click.Path(exists=True, dir_okay=False))
@click.argument("trace", type=click.Path(exists=True))
@target_options
@server_options
@click.option("--baseline-endpoint", default=None, metavar="URL",
              help="With --endpoint: a second running server with the baseline settings.")
@click.option("--speedup", type=click.FloatRange(min=1e-6, max=1e6), default=None,
              help="Open loop at the trace's arrival times divided by X [default: 1].")
@click.option("--concurrency", type=click.IntRange(min=1), default=None,
              help="Closed loop: keep N requests in flight.")
@click.option("--thread-outputs", is_flag=True,
              help="Feed each turn's real output into the next turn of its session.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@handle_errors
def validate_command(profile_path: str, trace: str, target_flags: TargetFlags,
                     **kw: Any) -> None:
    """Replay baseline and PROFILE on a real server and on the twin; print both, with errors.

    The twin models --hardware/--model (pass --calibration from `tuner calibrate` on the
    same server); the error is (predicted - measured) / measured. Both sides run the
    profile's scheduling mode (its target.async_scheduling) unless --async-scheduling or
    --no-async-scheduling says otherwise. p90 interactivity is 1 / the p90 over requests
    of the per-request mean inter-token latency.

    \b
    Example:
      tuner validate profiles/agentic.yaml trace.parquet --launch \\
          --vllm-python /opt/vllm/bin/python --model llama-3.1-70b \\
          --serve-model /models/llama-3.1-70b --tp 8 --calibration calib.yaml --concurrency 64
    """
    from tuner.metrics import summarize
    from tuner.profile import load_profile
    from tuner.fidelity.validate import validate

    as_json = kw.pop("as_json")
    baseline_endpoint = kw.pop("baseline_endpoint")
    load = make_load(kw.pop("speedup"), kw.pop("concurrency"))
    thread_outputs = kw.pop("thread_outputs")
    profile = load_profile(profile_path)
    flags = target_flags
    target = flags.target()
    # The engine the profile deploys, unless the flag says otherwise: twin and server alike.
    mode = (profile.target.async_scheduling if target.async_scheduling is None
            else target.async_scheduling)
    target = dataclasses.replace(target, async_scheduling=mode)
    options = make_server_options(model=flags.model, tp=flags.tp, block_size=flags.block_size,
                                  num_gpu_blocks=flags.num_gpu_blocks,
                                  max_model_len=flags.max_model_len, **kw)
    if options.launches:
        options = options.replace(async_scheduling=mode)
    endpoints = None
    if not options.launches:
        endpoints = {"profile": str(options.endpoint)}
        if baseline_endpoint:
            endpoints["baseline"] = baseline_endpoint
    elif baseline_endpoint:
        raise ConfigError("--baseline-endpoint goes with --endpoint, not --launch")
    say = None if as_json else (lambda m: click.echo(f"  {m}", err=True))
    rows = validate(profile, trace, server=options, target=target, summarize=summarize,
                    load=load, endpoints=endpoints, thread_outputs=thread_outputs, progress=say)
    if as_json:
        echo_json([{**r.to_dict(), "async_scheduling": mode} for r in rows])
    else:
        click.echo(f"async_scheduling: {str(mode).lower()}")
        _print_comparison(rows)
    failed = [r.name for r in rows if r.status == "error"]
    if failed:
        click.echo(f"Error: the server side failed for {', '.join(failed)}; no measurement "
                   "to compare", err=True)
        sys.exit(1)


def _print_comparison(rows: list[Any]) -> None:
    from tuner.fidelity.validate import COMPARED

    for r in rows:
        click.echo(f"{r.name} ({r.status})")
        click.echo(f"  {'metric':<28}{'predicted':>14}{'measured':>14}{'error':>10}")
        for key in COMPARED:
            p, m, e = r.predicted.get(key, math.nan), r.measured.get(key, math.nan), \
                r.error_pct.get(key, math.nan)
            err = f"{e:+.1f} %" if math.isfinite(e) else "-"
            click.echo(f"  {key:<28}{p:>14.4g}{m:>14.4g}{err:>10}")
        for note in r.notes:
            click.echo(f"  note: {note}")
    click.echo(P90_HELP)


def register(cli: click.Group) -> None:
    """Add ``tuner calibrate`` and ``tuner validate`` to ``cli``."""
    cli.add_command(calibrate_command)
    cli.add_command(validate_command)
