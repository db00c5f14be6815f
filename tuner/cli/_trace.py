"""``tuner ingest`` and the ``tuner trace`` group (stats, slice, synth): thin shells over
:mod:`tuner.trace`."""

from __future__ import annotations

from typing import Any

import click

from tuner.cli._common import echo_json, handle_errors
from tuner.durations import parse_duration
from tuner.errors import ConfigError


class Duration(click.ParamType):
    """A click type over :func:`tuner.durations.parse_duration` (the config files' grammar)."""

    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        try:
            return parse_duration(str(value), "duration", allow_zero=True)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()


@click.command("ingest")
@click.argument("sources", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Parquet trace to write (atomically).")
@click.option("--format", "fmt", default="auto", show_default=True,
              type=click.Choice(["auto", "mooncake", "bailian", "vllm-log", "openai-jsonl",
                                 "azure-csv", "burstgpt-csv"]),
              help="Input format; auto detects it from the content.")
@click.option("--hash-block-size", type=click.IntRange(min=1), default=None,
              help="Tokens per block hash (mooncake 512, bailian 16, others 16 by default).")
@click.option("--salt-file", type=click.Path(dir_okay=False), default=None,
              help="Secret salt file (created 0600 when missing); default $TUNER_SALT or "
                   "~/.config/tuner/salt.")
@click.option("--tokenizer", type=click.Path(exists=True), default=None,
              help="Hugging Face tokenizer directory or tokenizer.json (openai-jsonl).")
@click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail",
              show_default=True,
              help="fail: stop at the first bad record; skip: quarantine it beside the output.")
@click.option("--output-len", type=click.IntRange(min=1), default=None,
              help="vllm-log: output length of requests whose log holds no output "
                   "[default: their logged max_tokens, an upper bound].")
@click.option("--spec-metrics", "spec_metrics", multiple=True, type=click.Path(dir_okay=False),
              metavar="FILE",
              help="A vLLM server log (its 'SpecDecoding metrics' lines, summed) or one or "
                   "two /metrics scrapes (before, after): the measured speculative-decoding "
                   "acceptance, stored in the trace for replays without --spec-acceptance.")
@click.option("--json", "as_json", is_flag=True, help="Print the ingest report as JSON.")
@handle_errors
def ingest_cmd(sources: tuple[str, ...], output: str, fmt: str, hash_block_size: int | None,
               salt_file: str | None, tokenizer: str | None, on_error: str,
               output_len: int | None, spec_metrics: tuple[str, ...], as_json: bool) -> None:
    """Ingest request logs into a canonical Parquet trace (salted block hashes, no text).

    Formats: mooncake, bailian, vllm-log, openai-jsonl, azure-csv, burstgpt-csv; gzip and
    zstd files are read transparently. A bad record stops the run with exit code 2 and
    leaves no output (or, with --on-error skip, goes to OUTPUT.quarantine.jsonl).

    \b
    Example:
      tuner ingest traces/mooncake_synthetic.jsonl -o mooncake.parquet
      tuner ingest vllm-*.log.gz -o trace.parquet --salt-file ~/.tuner-salt --on-error skip
      tuner ingest requests.jsonl -o trace.parquet --spec-metrics vllm-server.log
    """
    from tuner.cli._progress import progress_display
    from tuner.trace import ingest

    with progress_display(False if as_json else None) as shown:
        report = ingest(list(sources), output, format=fmt, hash_block_size=hash_block_size,
                        salt=salt_file, tokenizer=tokenizer, on_error=on_error,  # type: ignore[arg-type]
                        progress=shown, output_len=output_len,
                        spec_metrics=list(spec_metrics) or None)
    for warning in report.warnings:
        click.echo(f"Warning: {warning}", err=True)
    if report.output_len_filled:
        # Said even under --json (on stderr): a trace of unknown output lengths must not
        # pass for a measured one.
        click.echo(f"Warning: {report.output_len_filled:,} of {report.requests:,} requests "
                   "have no output in the log (vLLM logs none for them without "
                   f"--enable-log-outputs, and 0.32 none for /v1/completions); their output "
                   f"length is {report.output_len_rule}", err=True)
    if as_json:
        echo_json(report.to_dict())
        return
    click.echo(f"Ingested {report.requests:,} requests ({report.format}, "
               f"{report.hash_block_size}-token blocks) -> {report.output}")
    click.echo(f"  span {report.duration_s:,.1f} s, {report.records_per_s:,.0f} records/s")
    if report.out_of_order:
        click.echo(f"  {report.out_of_order:,} records were out of order (sorted by arrival)")
    if report.skipped:
        click.echo(f"  skipped {report.skipped:,} bad records -> {report.quarantine}")


@click.group("trace")
def trace_group() -> None:
    """Inspect, cut and synthesize canonical traces.

    \b
    Example:
      tuner trace stats traces/agentic_1h.parquet
      tuner trace slice trace.parquet --last 1h -o recent.parquet
      tuner trace synth --kind chat --duration 30m --rate 5 -o chat.parquet
    """


@trace_group.command("stats")
@click.argument("trace", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
@handle_errors
def stats_cmd(trace: str, as_json: bool) -> None:
    """Print a trace's statistics: rates, lengths, sessions, ideal prefix-hit rate.

    The ideal prefix-hit rate assumes an unbounded KV cache: prompt tokens covered by the
    longest run of already-seen leading blocks, over all prompt tokens.

    \b
    Example:
      tuner trace stats traces/agentic_1h.parquet
      tuner trace stats trace.parquet --json | jq .ideal_prefix_hit_rate
    """
    from tuner.trace import format_trace_stats, read_trace, trace_stats

    stats = trace_stats(read_trace(trace))
    if as_json:
        echo_json(stats.to_dict())
        return
    click.echo(format_trace_stats(stats))


@trace_group.command("slice")
@click.argument("trace", type=click.Path())
@click.option("--start", type=DURATION, default=None, help="Window start (e.g. 600, 10m).")
@click.option("--end", type=DURATION, default=None, help="Window end (exclusive).")
@click.option("--last", type=DURATION, default=None, help="The final part of the trace (e.g. 2h).")
@click.option("--speedup", type=click.FloatRange(min=1e-6, max=1e6), default=1.0,
              show_default=True, help="Divide arrival times by this factor (1e-6 to 1e6).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@handle_errors
def slice_cmd(trace: str, start: float | None, end: float | None, last: float | None,
              speedup: float, output: str, as_json: bool) -> None:
    """Cut a time window out of a trace (re-based to 0) and optionally speed it up.

    \b
    Example:
      tuner trace slice trace.parquet --start 0 --end 45m -o train.parquet
      tuner trace slice trace.parquet --last 15m --speedup 2 -o holdout.parquet
    """
    from tuner.trace import read_trace, slice_trace

    if last is None and start is None and end is None:
        raise ConfigError("give --start/--end or --last")
    from tuner.outputs import check_output

    check_output(output, inputs=[trace])
    cut = slice_trace(read_trace(trace), start_s=start, end_s=end, last_s=last, speedup=speedup)
    cut.write(output, inputs=[trace])
    a, b = cut.time_range()
    if as_json:
        echo_json({"output": output, "requests": len(cut), "start_s": a, "end_s": b})
    else:
        click.echo(f"Wrote {len(cut):,} requests spanning {b - a:,.1f} s -> {output}")


@trace_group.command("synth")
@click.option("--kind", type=click.Choice(["agentic", "chat", "rag", "random"]), required=True)
@click.option("--duration", type=DURATION, default=None, help="Trace length (e.g. 1h, 30m).")
@click.option("--rate", type=float, default=None,
              help="Mean requests per second (random: Poisson rate; omit for all at t=0).")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True)
@click.option("--hash-block-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--isl", type=int, default=None, help="random: max input length.")
@click.option("--osl", type=int, default=None, help="random: max output length.")
@click.option("--range-ratio", type=float, default=None,
              help="random: lengths uniform in [ratio*L, L].")
@click.option("--num-prompts", type=int, default=None, help="random: number of requests.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A field of the kind's parameters (e.g. turns=30, max_context_tokens=65536).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@handle_errors
def synth_cmd(kind: str, duration: float | None, rate: float | None, seed: int,
              hash_block_size: int, isl: int | None, osl: int | None, range_ratio: float | None,
              num_prompts: int | None, params: tuple[str, ...], output: str, as_json: bool) -> None:
    """Generate a deterministic synthetic trace (same arguments, same bytes).

    agentic: shared system prompts, growing multi-turn contexts, tool-call loops;
    chat: short sessions with human think times; rag: shared system prompt + Zipf-popular
    documents; random: unique prompts of uniform random lengths (as vllm bench random).

    \b
    Example:
      tuner trace synth --kind agentic --duration 1h --rate 5 --seed 42 -o agentic.parquet
      tuner trace synth --kind random --isl 8192 --osl 1024 --range-ratio 0.8 \\
          --num-prompts 640 -o random.parquet
    """
    from tuner.trace import synthesize

    extra = _parse_params(params)
    for key, value in (("isl", isl), ("osl", osl), ("range_ratio", range_ratio),
                       ("num_prompts", num_prompts)):
        if value is not None:
            if kind != "random":
                raise ConfigError(f"--{key.replace('_', '-')} applies to --kind random only")
            extra[key] = value
    trace = synthesize(kind, duration_s=duration, rate=rate, seed=seed,  # type: ignore[arg-type]
                       hash_block_size=hash_block_size, **extra)
    trace.write(output)
    if as_json:
        echo_json({"output": output, "requests": len(trace), "kind": kind, "seed": seed})
    else:
        click.echo(f"Wrote {len(trace):,} {kind} requests -> {output}")


def _parse_params(params: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in params:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param {item!r}: expected KEY=VALUE")
        value: Any
        try:
            value = int(raw)
        except ValueError:
            try:
                value = float(raw)
            except ValueError:
                parts = raw.split(",")
                value = tuple(int(p) for p in parts) if len(parts) == 2 and all(
                    p.strip().isdigit() for p in parts) else raw
        out[key.strip().replace("-", "_")] = value
    return out


def register(cli: click.Group) -> None:
    """Add ``ingest`` and the ``trace`` group to ``cli``."""
    cli.add_command(ingest_cmd)
    cli.add_command(trace_group)
