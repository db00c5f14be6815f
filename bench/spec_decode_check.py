#!/usr/bin/env python3
"""The step-time model with speculative decoding against two published results (not a
test: prints).

1. DeepSeek-V3 technical report (arXiv 2412.19437, §5.4.3): with one MTP module "the
acceptance rate of the second token prediction ranges between 85% and 90%", and this
"enables the model to significantly improve decoding speed, delivering 1.8 times TPS
(Tokens Per Second)". The report does not give the batch or the GPU count of that
figure (its own H800 deployment); this script replays a light decode-heavy chat load
(small batches, where a decode step is weight-bound) on DeepSeek-V3 over 8 GPUs, without
speculative decoding and with MTP k = 1 at 85 % and 90 % acceptance, and prints the
decode-speed ratio (per-user tokens/s = 1 / mean TPOT, and output tokens/s) and its
error against 1.8x.

2. EAGLE-3 on Qwen3-32B, AngelSlim's speculative-decoding benchmark table (Tencent
AngelSlim docs, performance/speculative_decoding/benchmarks: "Eagle3, Qwen3 Series
Models"): MT-bench, vanilla 43.3 tokens/s against EAGLE-3 74.1 tokens/s (1.71x) at an
"accept length" of 1.86 (bonus token included: vanilla's is 1, so it is vLLM's mean
acceptance length). The table names neither the GPU nor the draft length; 43 tokens/s
for a 32B bf16 model is one request on one GPU (weight-bound), so this replays
MT-bench-like turns (short prompts, ~500-token answers) one at a time on one GPU
(--eagle-hardware, default h100; max_model_len 8192 so the KV fits), without drafts and with eagle3 at mean length 1.86 for
k = 1, 2, 3 (vLLM's minimum-variance rates for a length: the draft length the table does
not give only adds rejected drafts to verify), and prints the decode-speed ratio and its
error against 1.71x.

All replays of a check run side by side in this process.

Usage:  .venv/bin/python bench/spec_decode_check.py [--hardware h200] [--rate 1.0]
                                                    [--eagle-hardware h100]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.metrics import summarize  # noqa: E402
from tuner.perf.target import Target  # noqa: E402
from tuner.replay import run  # noqa: E402
from tuner.sim.load import ClosedLoop  # noqa: E402
from tuner.sim.settings import SimOptions  # noqa: E402
from tuner.sim.spec_decode import from_vllm_config  # noqa: E402
from tuner.trace.synth import synthesize  # noqa: E402

PUBLISHED_TPS_RATIO = 1.8
#: AngelSlim's Qwen3-32B MT-bench row: vanilla 43.3 tokens/s, EAGLE-3 74.1, length 1.86
EAGLE3_VANILLA_TPS, EAGLE3_TPS, EAGLE3_LENGTH = 43.3, 74.1, 1.86


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="h200")
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second")
    ap.add_argument("--eagle-hardware", default="h100",
                    help="GPU of the EAGLE-3 check (the source does not name one)")
    args = ap.parse_args()
    mtp_check(args)
    print()
    eagle3_check(args)
    return 0


def _table(title: str, rows: list[tuple[str, float, float]], published: float) -> None:
    base_user = rows[0][1]
    print(title)
    print(f"{'':22} {'tok/s/user':>11} {'ratio':>7} {'error':>7} {'out tok/s':>10}")
    for label, user, out in rows:
        ratio = user / base_user
        err = (ratio - published) / published
        error = "   (baseline)" if label == rows[0][0] else f"{100 * err:+6.1f}%"
        print(f"{label:22} {user:11.1f} {ratio:6.2f}x {error:>7} {out:10.1f}")


def eagle3_check(args: argparse.Namespace) -> None:
    """The EAGLE-3 point (see the module docstring, 2.)."""
    trace = synthesize("random", seed=5, isl=160, osl=500, range_ratio=0.5, num_prompts=24)
    target = Target(hardware=args.eagle_hardware, model="qwen3-32b", tp=1, max_model_len=8192)
    rows = []
    for label, k in (("no spec decode", 0), ("EAGLE-3 k=1 @ L 1.86", 1),
                     ("EAGLE-3 k=2 @ L 1.86", 2), ("EAGLE-3 k=3 @ L 1.86", 3)):
        spec = None if not k else from_vllm_config(
            {"method": "eagle3", "num_speculative_tokens": k}, str(EAGLE3_LENGTH))
        result = run(trace, target=target, load=ClosedLoop(1),
                     options=SimOptions(speculative=spec))
        s = summarize(result).to_dict()
        rows.append((label, 1.0 / s["tpot_mean_s"], s["output_throughput"]))
    published = EAGLE3_TPS / EAGLE3_VANILLA_TPS
    _table(f"Qwen3-32B, tp=1 {args.eagle_hardware}, one request at a time, MT-bench-like "
           f"(published: {EAGLE3_VANILLA_TPS} -> {EAGLE3_TPS} tok/s = {published:.2f}x with "
           f"EAGLE-3 at mean acceptance length {EAGLE3_LENGTH})", rows, published)


def mtp_check(args: argparse.Namespace) -> None:
    """The DeepSeek-V3 MTP point (see the module docstring, 1.)."""
    trace = synthesize("chat", duration_s=120, rate=args.rate, seed=11,
                       system_prompt_tokens=(200, 800), user_tokens=100, output_tokens=400,
                       max_output_tokens=1000, think_time_s=5.0)
    target = Target(hardware=args.hardware, model="deepseek-v3", tp=8)
    rows = []
    for label, acceptance in (("no spec decode", None), ("MTP k=1 @ 0.85", "0.85"),
                              ("MTP k=1 @ 0.90", "0.90")):
        spec = None if acceptance is None else from_vllm_config(
            {"method": "mtp", "num_speculative_tokens": 1}, acceptance)
        result = run(trace, target=target, options=SimOptions(speculative=spec))
        s = summarize(result).to_dict()
        rows.append((label, 1.0 / s["tpot_mean_s"], s["output_throughput"]))
    _table(f"DeepSeek-V3, tp=8 {args.hardware}, chat at {args.rate} req/s "
           f"(published: {PUBLISHED_TPS_RATIO}x TPS with MTP at 85-90 % acceptance)",
           rows, PUBLISHED_TPS_RATIO)


if __name__ == "__main__":
    sys.exit(main())
