#!/usr/bin/env python3
"""What async scheduling changes: the same replays with ``--async-scheduling`` and
``--no-async-scheduling``, side by side (docs/fidelity.md, "Async against sync").

For the bundled agentic hour and the Mooncake-format sample, Llama-3.1-70B on 8x MI355X
(16-token blocks, the shipped step-time fit), cache-aware admission off and on (window 16,
threshold 0.5), prints p90 interactivity, output throughput per GPU, TTFT mean and p90,
the prefix-cache hit rate, preemptions, finished requests and the replay's own speed, one
row per (trace, window, mode), as a Markdown table.

Usage:  .venv/bin/python bench/async_modes.py [--json OUT]
Each replay is ``tuner.replay.run`` exactly as ``tuner replay TRACE --hardware mi355x
--model llama-3.1-70b --tp 8 --block-size 16 [--set ...] [--no-async-scheduling]`` runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("p90_interactivity", "output_throughput_per_gpu", "ttft_mean_s", "ttft_p90_s",
        "prefix_cache_hit_rate", "preemptions", "num_finished", "speed_ratio")
WINDOWS = {"off": {}, "16/0.5": {"cache_aware_admission_window": 16,
                                 "cache_aware_admission_threshold": 0.5}}


def traces(tmp: Path) -> dict[str, Path]:
    """The two bundled traces (the Mooncake sample ingested with a fixed salt)."""
    from tuner.trace import ingest

    mooncake = tmp / "mooncake.parquet"
    ingest(ROOT / "traces" / "mooncake_synthetic.jsonl", mooncake, salt=b"async-modes",
           progress=False)
    return {"agentic_1h": ROOT / "traces" / "agentic_1h.parquet", "mooncake": mooncake}


def replay(trace: Path, window: dict[str, Any], mode: bool) -> dict[str, Any]:
    from tuner import metrics
    from tuner import replay as rp
    from tuner.perf.presets import resolve_target
    from tuner.perf.target import Target

    target = Target(hardware="mi355x", model="llama-3.1-70b", tp=8, block_size=16,
                    async_scheduling=mode)
    settings = resolve_target(target).default_settings.replace(**window)
    result = rp.run(str(trace), settings, target=target)
    assert result.async_scheduling is mode, (result.async_scheduling, mode)
    return {k: v for k, v in metrics.summarize(result).to_dict().items() if k in KEYS}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in traces(Path(tmp)).items():
            for label, window in WINDOWS.items():
                for mode in (False, True):
                    row = {"trace": name, "window": label, "async_scheduling": mode,
                           **replay(path, window, mode)}
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
    print("| trace | window | mode | p90 tok/s/user | out tok/s/GPU | TTFT mean s | TTFT p90 s "
          "| hit rate | preemptions | finished | speed x |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['trace']} | {r['window']} | {'async' if r['async_scheduling'] else 'sync'} "
              f"| {r['p90_interactivity']:.2f} | {r['output_throughput_per_gpu']:.1f} "
              f"| {r['ttft_mean_s']:.2f} | {r['ttft_p90_s']:.2f} "
              f"| {r['prefix_cache_hit_rate']:.4f} | {r['preemptions']} | {r['num_finished']} "
              f"| {r['speed_ratio']:.0f} |")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
