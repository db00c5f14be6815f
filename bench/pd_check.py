#!/usr/bin/env python3
"""The P/D replay (step-time model, KV transfer, proxy flow) against a published P/D
serving result (not a test: prints predicted vs published and the error per row).

The rows are in ``bench/data/pd_published.csv``, each with its source: AMD and Embedded
LLM's vLLM blog post "Next-Level Inference: Why Your Single-Node vLLM Setup Needs
Prefill-Decode Disaggregation" (vllm.ai/blog/moriio-kv-connector, 2026-04-07):
Qwen3-235B-A22B-FP8 on one 8-GPU MI300X node, vLLM 0.16 (ROCm), ISL 2000 / OSL 1000,
Poisson 8 req/s, 100 requests, as one TP8 engine, two TP4 engines behind a round-robin
proxy, and 1 prefill + 1 decode TP4 instance with the MoRIIO connector (read mode = the
decoder pulls, the twin's NIXL pull flow; write mode is listed, not replayed). The
published figures are the blog's Figure 3 data (every request's TTFT and ITL), reduced to
mean / p50 / p90 and the count meeting both SLOs (TTFT < 1 s, ITL < 50 ms; Table 3).

Each row is replayed with a synthetic trace of the same shape (``tuner trace synth
--kind random``: fixed 2000/1000 tokens, Poisson 8 req/s, 100 requests, seed per
``--seed``) and the row's flags (TP, expert parallel, max_num_batched_tokens,
max_num_seqs, max_model_len, gpu-memory-utilization; the P/D row's KV over the NIC:
the post sets ``MORI_DISABLE_AUTO_XGMI=1``). Nothing is fitted to these rows: they
check the clock, they do not train it.

Usage:  .venv/bin/python bench/pd_check.py [--seeds 3] [--csv bench/data/pd_published.csv]
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.perf.pd_link import PDLayout  # noqa: E402
from tuner.perf.presets import resolve_target  # noqa: E402
from tuner.perf.target import Target  # noqa: E402
from tuner.replay import parse_settings, run  # noqa: E402
from tuner.trace.synth import synthesize  # noqa: E402

#: the post's SLOs (Table 3): a request counts when TTFT < 1 s and its ITL < 50 ms
TTFT_SLO_S, ITL_SLO_S = 1.0, 0.050
METRICS = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "itl_mean_s", "itl_p90_s", "slo_met")


@dataclass(frozen=True)
class Row:
    """One published configuration (a CSV row's fields this script reads)."""

    id: str
    layout: str  # aggregated | pd | pd-push (listed, not replayed)
    raw: dict[str, str]

    def num(self, key: str) -> float:
        return float(self.raw[key])


def load_rows(path: Path) -> list[Row]:
    with open(path, newline="") as f:
        return [Row(r["id"], r["layout"], r) for r in csv.DictReader(f)]


def replay_row(row: Row, seed: int) -> dict[str, float]:
    """The twin's figures for ``row`` on a synthetic trace drawn with ``seed``."""
    r = row.raw
    trace = synthesize("random", rate=row.num("rate_rps"), seed=seed,
                       isl=int(r["isl"]), osl=int(r["osl"]), range_ratio=1.0,
                       num_prompts=int(r["num_prompts"]))
    target = Target(hardware=r["hardware"], model=r["model"], tp=int(r["tp"]),
                    enable_expert_parallel=r["expert_parallel"] == "on",
                    replicas=int(r["replicas"]), max_model_len=int(r["max_model_len"]),
                    gpu_memory_utilization=row.num("gpu_memory_utilization"))
    assignments = [f"max_num_batched_tokens={r['max_num_batched_tokens']}"]
    if int(r["max_num_seqs"]):
        assignments.append(f"max_num_seqs={r['max_num_seqs']}")
    settings = parse_settings(assignments, resolve_target(target).default_settings)
    extra = {}
    if row.layout == "pd":
        extra["pd"] = PDLayout(num_prefill=int(r["num_prefill"]),
                               num_decode=int(r["num_decode"]), link=r["link"] or "auto")
    result = run(trace, settings, target=target, **extra)
    return request_figures(result.requests)


def request_figures(table: object) -> dict[str, float]:
    """Mean/p50/p90 TTFT, mean/p90 per-request ITL and the SLO count over finished
    requests (as the post reduces its per-request bars)."""
    ttft, itl = [], []
    for r in table:  # type: ignore[attr-defined]
        if r.status != "finished":
            continue
        ttft.append(r.first_token_s - r.arrival_s)
        out = int(r.output_len)
        itl.append((r.finish_s - r.first_token_s) / (out - 1) if out > 1 else 0.0)
    t, g = np.asarray(ttft), np.asarray(itl)
    return {"ttft_mean_s": float(t.mean()), "ttft_p50_s": float(np.percentile(t, 50)),
            "ttft_p90_s": float(np.percentile(t, 90)), "itl_mean_s": float(g.mean()),
            "itl_p90_s": float(np.percentile(g, 90)),
            "slo_met": float(((t < TTFT_SLO_S) & (g < ITL_SLO_S)).sum())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=ROOT / "bench" / "data" / "pd_published.csv")
    ap.add_argument("--seeds", type=int, default=3, help="synthetic traces per row (averaged)")
    args = ap.parse_args()
    rows = load_rows(args.csv)
    print(f"{'row':<20} {'metric':<12} {'published':>10} {'twin':>10} {'error':>8}")
    errors: dict[str, list[float]] = {m: [] for m in METRICS}
    for row in rows:
        if row.layout not in ("aggregated", "pd"):
            print(f"{row.id:<20} not replayed ({row.layout}: {row.raw['notes']})")
            continue
        runs = [replay_row(row, seed) for seed in range(args.seeds)]
        for metric in METRICS:
            twin = float(np.mean([x[metric] for x in runs]))
            published = row.num(metric)
            err = (twin - published) / published if published else float("nan")
            errors[metric].append(abs(err))
            print(f"{row.id:<20} {metric:<12} {published:>10.4g} {twin:>10.4g} {err:>+8.1%}")
    print("\nmean |error| over the replayed rows: " + ", ".join(
        f"{m} {np.mean(v):.0%}" for m, v in errors.items() if v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
