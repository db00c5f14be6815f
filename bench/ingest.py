"""Ingest throughput and peak memory on a generated 1,000,000-request Mooncake file.

Targets (issue 2): >= 200,000 records/s on one core, and peak memory < 1 GiB whatever the
input size. The input is the bundled Mooncake sample (traces/mooncake_synthetic.jsonl)
replicated with shifted timestamps and fresh ids, so record shapes (about 30 ids a line)
are the real ones. Ingest runs in a child process pinned to one CPU with one polars
thread; its peak RSS comes from ``getrusage(RUSAGE_CHILDREN)``. A second, 4x smaller
input shows that peak memory does not grow with the input size.

Usage: .venv/bin/python bench/ingest.py [--requests 1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "traces" / "mooncake_synthetic.jsonl"
TARGET_RECORDS_PER_S = 200_000
TARGET_PEAK_BYTES = 1 << 30

CHILD = r"""
import json, os, sys, time
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
from tuner.trace import ingest
src, out = sys.argv[1], sys.argv[2]
t0, c0 = time.perf_counter(), time.process_time()
report = ingest([src], out, progress=False)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"requests": report.requests, "wall_s": wall, "ingest_cpu_s": cpu}))
"""


def generate(path: Path, n: int) -> int:
    """Write ``n`` Mooncake lines (replicas of the bundled sample); returns bytes written."""
    sample = [json.loads(x) for x in SAMPLE.read_text().splitlines()]
    span_ms = sample[-1]["timestamp"] + 1
    id_span = max(max(r["hash_ids"]) for r in sample) + 1
    written = 0
    with open(path, "w") as fh:
        rep = 0
        while written < n:
            t_off, id_off = rep * span_ms, rep * id_span
            buf = []
            for r in sample[: n - written]:
                ids = ", ".join(str(h + id_off) for h in r["hash_ids"])
                buf.append(f'{{"timestamp": {r["timestamp"] + t_off}, "input_length": '
                           f'{r["input_length"]}, "output_length": {r["output_length"]}, '
                           f'"hash_ids": [{ids}]}}\n')
            fh.write("".join(buf))
            written += len(buf)
            rep += 1
    return path.stat().st_size


def run_child(src: Path, out: Path) -> dict:
    env = dict(os.environ, POLARS_MAX_THREADS="1", OMP_NUM_THREADS="1",
               TUNER_SALT=os.environ.get("TUNER_SALT", "bench-salt"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run([sys.executable, "-c", CHILD, str(src), str(out)], env=env,
                         capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    data = json.loads(res.stdout.strip().splitlines()[-1])
    data["peak_bytes"] = after.ru_maxrss * 1024  # a max over all children so far
    # CPU seconds of the child (includes interpreter start and imports): on a shared
    # machine the wall clock also counts time other processes held the core.
    data["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path, default=None, help="directory for the files (kept)")
    args = ap.parse_args()
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tuner-bench-ingest-"))
    tmp.mkdir(parents=True, exist_ok=True)
    small_n = args.requests // 4
    results = {}
    # The small input first: ru_maxrss of children only grows, so the order matters.
    for n in (small_n, args.requests):
        src = tmp / f"mooncake_{n}.jsonl"
        t0 = time.perf_counter()
        size = generate(src, n)
        gen_s = time.perf_counter() - t0
        r = run_child(src, tmp / f"mooncake_{n}.parquet")
        r.update(bytes=size, generate_s=gen_s, out_bytes=(tmp / f"mooncake_{n}.parquet").stat().st_size)
        results[n] = r
        if not args.keep:
            src.unlink()
            (tmp / f"mooncake_{n}.parquet").unlink()
    big, small = results[args.requests], results[small_n]
    rps = big["requests"] / big["wall_s"]
    mbps = big["bytes"] / big["wall_s"] / 1e6
    print(f"input: {big['requests']:,} Mooncake records, {big['bytes'] / 1e6:,.1f} MB "
          f"(generated in {big['generate_s']:.1f} s); output {big['out_bytes'] / 1e6:,.1f} MB")
    print(f"ingest wall time (one core): {big['wall_s']:.2f} s")
    print(f"records/s: {rps:,.0f}   target {TARGET_RECORDS_PER_S:,}   ratio {rps / TARGET_RECORDS_PER_S:.2f}")
    print(f"MB/s: {mbps:,.1f}")
    cpu_rps = big["requests"] / big["ingest_cpu_s"]
    print(f"ingest CPU time: {big['ingest_cpu_s']:.2f} s -> {cpu_rps:,.0f} records per CPU-second "
          f"(ratio {cpu_rps / TARGET_RECORDS_PER_S:.2f}; what an idle core would give; child "
          f"total incl. start-up {big['cpu_s']:.2f} s)")
    print(f"peak memory (child RSS): {big['peak_bytes'] / 2**20:,.0f} MiB   target < 1024 MiB   "
          f"ratio {TARGET_PEAK_BYTES / big['peak_bytes']:.2f} (>= 1 meets it)")
    print(f"peak memory at {small_n:,} records: {small['peak_bytes'] / 2**20:,.0f} MiB "
          f"(bounded if close to the {args.requests:,}-record figure)")
    print(json.dumps({"requests": big["requests"], "records_per_s": rps, "mb_per_s": mbps,
                      "records_per_cpu_s": cpu_rps, "wall_s": big["wall_s"], "ingest_cpu_s": big["ingest_cpu_s"],
                      "peak_mib": big["peak_bytes"] / 2**20,
                      "peak_mib_quarter_input": small["peak_bytes"] / 2**20,
                      "records_per_s_ratio": rps / TARGET_RECORDS_PER_S,
                      "peak_ratio": TARGET_PEAK_BYTES / big["peak_bytes"]}))
    if not args.keep:
        tmp.rmdir()


if __name__ == "__main__":
    main()
