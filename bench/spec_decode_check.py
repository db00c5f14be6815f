#!/usr/bin/env python3
"""The step-time model with speculative decoding against a published result (not a test:
prints).

DeepSeek-V3 technical report (arXiv 2412.19437, §5.4.3): with one MTP module "the
acceptance rate of the second token prediction ranges between 85% and 90%", and this
"enables the model to significantly improve decoding speed, delivering 1.8 times TPS
(Tokens Per Second)". The report does not give the batch or the GPU count of that
figure (its own H800 deployment); this script replays a light decode-heavy chat load
(small batches, where a decode step is weight-bound) on DeepSeek-V3 over 8 GPUs, without
speculative decoding and with MTP k = 1 at 85 % and 90 % acceptance, and prints the
decode-speed ratio (per-user tokens/s = 1 / mean TPOT, and output tokens/s) and its
error against 1.8x. All replays run side by side in this process.

Usage:  .venv/bin/python bench/spec_decode_check.py [--hardware h200] [--rate 1.0]
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
from tuner.sim.settings import SimOptions  # noqa: E402
from tuner.sim.spec_decode import from_vllm_config  # noqa: E402
from tuner.trace.synth import synthesize  # noqa: E402

PUBLISHED_TPS_RATIO = 1.8


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="h200")
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second")
    args = ap.parse_args()
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
    base_user, base_out = rows[0][1], rows[0][2]
    print(f"DeepSeek-V3, tp=8 {args.hardware}, chat at {args.rate} req/s "
          f"(published: {PUBLISHED_TPS_RATIO}x TPS with MTP at 85-90 % acceptance)")
    print(f"{'':18} {'tok/s/user':>11} {'ratio':>7} {'error':>7} {'out tok/s':>10}")
    for label, user, out in rows:
        ratio = user / base_user
        err = (ratio - PUBLISHED_TPS_RATIO) / PUBLISHED_TPS_RATIO
        error = "   (baseline)" if label == rows[0][0] else f"{100 * err:+6.1f}%"
        print(f"{label:18} {user:11.1f} {ratio:6.2f}x {error:>7} {out:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
