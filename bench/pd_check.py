#!/usr/bin/env python3
"""The P/D replay (step-time model, KV transfer, proxy flow) against published P/D
serving results (not a test: prints predicted vs published and the error per row).

The rows are in ``bench/data/pd_published.csv`` (schema and checks: ``bench/pd_published.py``),
each with its source, from two sources:

* ``moriio-blog``: AMD and Embedded LLM's vLLM blog post "Next-Level Inference: Why Your
  Single-Node vLLM Setup Needs Prefill-Decode Disaggregation" (vllm.ai/blog/moriio-kv-connector,
  2026-04-07): Qwen3-235B-A22B-FP8 on one 8-GPU MI300X node, vLLM 0.16 (ROCm), ISL 2000 /
  OSL 1000, Poisson 8 req/s, 100 requests, as one TP8 engine, two TP4 engines behind a
  round-robin proxy, and 1 prefill + 1 decode TP4 instance with the MoRIIO connector (read
  mode = the decoder pulls, the twin's NIXL pull flow; write mode is listed, not replayed).
  The published figures are the blog's Figure 3 data (every request's TTFT and ITL),
  reduced to mean / p50 / p90 and the count meeting both SLOs (TTFT < 1 s, ITL < 50 ms;
  Table 3).
* ``pythonsheets-efa``: "Is Disaggregated Prefill/Decode a Silver Bullet for LLM Serving?"
  (pythonsheets.com, 2026-03-10; source crazyguitar/pysheeet): DeepSeek-V2-Lite on four
  8-GPU Hopper nodes on AWS, vLLM 0.15.1 with the NixlConnector over EFA, ``vllm bench
  serve`` random data, 1024 prompts all at once, as TP8 x DP4, two TP8 x DP2 groups, four
  TP8 engines, 1 prefill + 3 decode and 2 + 2 TP8 instances; mean TTFT, mean ITL and output
  throughput read off the post's figures at three shapes (ISL 1024 and 4096 with OSL 256,
  ISL 512 with OSL 1024).

Each row is replayed with a synthetic trace of the same shape (``tuner trace synth
--kind random``: the row's fixed ISL/OSL, rate and request count, seed per ``--seed``) and
the row's flags (TP, DP, replicas, expert parallel, max_num_batched_tokens, max_num_seqs,
max_model_len, gpu-memory-utilization, the P/D layout and link). Nothing is fitted to
these rows: they check the clock, they do not train it.

Usage:  .venv/bin/python bench/pd_check.py [--seeds 3] [--source NAME] [--csv PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from pd_published import DEFAULT_CSV, METRICS, SLOS, Row, RowError, load_rows  # noqa: E402

from tuner.errors import TunerError  # noqa: E402
from tuner.perf.pd_link import PDLayout  # noqa: E402
from tuner.perf.presets import resolve_target  # noqa: E402
from tuner.perf.target import Target  # noqa: E402
from tuner.replay import parse_settings, run  # noqa: E402
from tuner.trace.synth import synthesize  # noqa: E402

REPLAYED = ("aggregated", "pd")


def replay_row(row: Row, seed: int) -> dict[str, float]:
    """The twin's figures for ``row`` on a synthetic trace drawn with ``seed``."""
    r = row.raw
    trace = synthesize("random", rate=row.rate, seed=seed, isl=row.int("isl"),
                       osl=row.int("osl"), range_ratio=1.0, num_prompts=row.int("num_prompts"))
    target = Target(hardware=r["hardware"], model=row.model_path, tp=row.int("tp"),
                    dp=row.int("dp"), enable_expert_parallel=r["expert_parallel"] == "on",
                    replicas=row.int("replicas"), max_model_len=row.int("max_model_len"),
                    gpu_memory_utilization=row.num("gpu_memory_utilization"))
    assignments = [f"{key}={r[key]}" for key in ("max_num_batched_tokens", "max_num_seqs")
                   if row.int(key)]  # 0: vLLM's default for the hardware
    settings = parse_settings(assignments, resolve_target(target).default_settings)
    extra = {}
    if row.layout == "pd":
        extra["pd"] = PDLayout(num_prefill=row.int("num_prefill"),
                               num_decode=row.int("num_decode"), link=r["link"] or "auto")
    result = run(trace, settings, target=target, **extra)
    return request_figures(result.requests, SLOS.get(row.source))


def request_figures(table: object, slo: tuple[float, float] | None) -> dict[str, float]:
    """Mean/p50/p90 TTFT, mean/p50/p90 per-request ITL, the SLO count and the output
    throughput over finished requests (as the sources reduce theirs: per-request bars for
    the MoRIIO post; ``vllm bench serve``'s means, whose pooled ITL equals the per-request
    mean at a fixed OSL, and generated tokens over the benchmark's span, for the EFA post)."""
    ttft, itl, arrival, finish, out_tokens = [], [], [], [], 0
    for r in table:  # type: ignore[attr-defined]
        if r.status != "finished":
            continue
        ttft.append(r.first_token_s - r.arrival_s)
        out = int(r.output_len)
        itl.append((r.finish_s - r.first_token_s) / (out - 1) if out > 1 else 0.0)
        arrival.append(r.arrival_s)
        finish.append(r.finish_s)
        out_tokens += out
    t, g = np.asarray(ttft), np.asarray(itl)
    figures = {"ttft_mean_s": float(t.mean()), "ttft_p50_s": float(np.percentile(t, 50)),
               "ttft_p90_s": float(np.percentile(t, 90)), "itl_mean_s": float(g.mean()),
               "itl_p50_s": float(np.percentile(g, 50)), "itl_p90_s": float(np.percentile(g, 90)),
               "output_tput_tok_s": out_tokens / (max(finish) - min(arrival))}
    if slo is not None:
        figures["slo_met"] = float(((t < slo[0]) & (g < slo[1])).sum())
    return figures


def check_source(rows: list[Row], seeds: int) -> dict[str, list[float]]:
    """Print one source's table, then each row relative to its shape's reference row;
    return the |error| per metric over the source's replayed rows."""
    errors: dict[str, list[float]] = {m: [] for m in METRICS}
    twins: dict[str, dict[str, float]] = {}
    for row in rows:
        if row.layout not in REPLAYED:
            print(f"{row.id:<26} not replayed ({row.layout}: {row.raw['notes']})")
            continue
        runs = [replay_row(row, seed) for seed in range(seeds)]
        twins[row.id] = {m: float(np.mean([x[m] for x in runs])) for m in runs[0]}
        for metric in row.published():
            twin = twins[row.id][metric]
            published = row.num(metric)
            err = (twin - published) / published if published else float("nan")
            errors[metric].append(abs(err))
            print(f"{row.id:<26} {metric:<17} {published:>10.4g} {twin:>10.4g} {err:>+8.1%}")
    print_relative(rows, twins)
    return errors


def shape(row: Row) -> tuple[str, ...]:
    return tuple(row.raw[k] for k in ("isl", "osl", "rate_rps", "num_prompts"))


def print_relative(rows: list[Row], twins: dict[str, dict[str, float]]) -> None:
    """Each replayed row's figures divided by its reference's (the first aggregated row of
    the same source and shape, in CSV order: the source's own baseline), published vs
    twin: does the clock get the *change* a layout brings, where its absolute level is
    off? Every published metric but the SLO count (a count of requests, not a scale)."""
    refs: dict[tuple[str, ...], Row] = {}
    for row in rows:
        if row.layout == "aggregated" and row.id in twins:
            refs.setdefault(shape(row), row)
    lines = []
    for row in rows:
        ref = refs.get(shape(row))
        if ref is None or ref is row or row.id not in twins:
            continue
        for metric in row.published():
            if metric == "slo_met" or ref.raw[metric] == "" or not ref.num(metric):
                continue
            published = row.num(metric) / ref.num(metric)
            twin = twins[row.id][metric] / twins[ref.id][metric]
            lines.append(f"{row.id:<26} {metric:<17} {published:>10.3g} {twin:>10.3g} "
                         f"{(twin - published) / published:>+8.1%}   / {ref.id}")
    if lines:
        print(f"\n{'relative to the reference':<26} {'metric':<17} {'published':>10} "
              f"{'twin':>10} {'error':>8}")
        print("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    ap.add_argument("--seeds", type=int, default=3, help="synthetic traces per row (averaged)")
    ap.add_argument("--source", action="append", help="only this source (repeatable)")
    args = ap.parse_args()
    try:
        rows = load_rows(args.csv)
    except (OSError, RowError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sources = list(dict.fromkeys(r.source for r in rows))
    for source in args.source or sources:
        if source not in sources:
            print(f"error: --source {source!r}: the CSV has {', '.join(sources)}", file=sys.stderr)
            return 2
    for source in args.source or sources:
        subset = [r for r in rows if r.source == source]
        print(f"\n== {source}: {subset[0].raw['source_url']}")
        print(f"{'row':<26} {'metric':<17} {'published':>10} {'twin':>10} {'error':>8}")
        try:
            errors = check_source(subset, args.seeds)
        except TunerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"mean |error| over {source}'s replayed rows: " + ", ".join(
            f"{m} {np.mean(v):.0%} (n={len(v)})" for m, v in errors.items() if v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
