#!/usr/bin/env python3
"""Bursts through vLLM's API server (not a test: prints; docs/step-time-model.md §1.4).

Every request arrives at t = 0 on one H200 running Llama-3.1-8B at TP1 with vLLM's
defaults; the twin replays it once and the summary is read with the API server left out
(``--api-server-count 0``), with one process and with four (tuner/perf/api_server.py).

Usage:  .venv/bin/python bench/api_server_burst.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner import replay  # noqa: E402
from tuner.metrics import summarize  # noqa: E402
from tuner.perf.api_server import api_server_cost  # noqa: E402
from tuner.perf.target import Target  # noqa: E402
from tuner.trace.schema import TraceRequest  # noqa: E402

TARGET = Target(hardware="h200", model="llama-3.1-8b", tp=1)
#: (requests, prompt tokens, output tokens)
BURSTS = ((1000, 128, 512), (3000, 64, 16), (2000, 128, 32), (500, 1024, 256))


def burst(n: int, isl: int, osl: int) -> list[TraceRequest]:
    return [TraceRequest(request_id=f"r{i}", arrival_s=0.0, input_len=isl, output_len=osl,
                         block_hashes=tuple(range(i * 1000, i * 1000 + isl // 16)),
                         output_block_hashes=()) for i in range(n)]


def main() -> None:
    print("| burst | engine TTFT mean | 1 server: TTFT mean, utilisation, out tok/s "
          "(engine's) | 4 servers: TTFT mean, utilisation |")
    print("|---|---|---|---|")
    for n, isl, osl in BURSTS:
        result = replay.run(burst(n, isl, osl), None, target=TARGET, hash_block_size=16)
        engine = summarize(result, api_server=api_server_cost(0))
        one = summarize(result, api_server=api_server_cost(1))
        four = summarize(result, api_server=api_server_cost(4))
        print(f"| {n:,} x {isl:,}/{osl:,} | {engine.ttft_mean_s:.3f} s | "
              f"{one.ttft_mean_s:.3f} s ({one.ttft_mean_s / engine.ttft_mean_s - 1:+.1%}), "
              f"{one.api_server['utilisation']:.0%}, {one.output_throughput:,.0f} "
              f"({engine.output_throughput:,.0f}) | {four.ttft_mean_s:.3f} s, "
              f"{four.api_server['utilisation']:.0%} |")


if __name__ == "__main__":
    main()
