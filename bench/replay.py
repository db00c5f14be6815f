#!/usr/bin/env python3
"""Replay speed of the twin, side by side with aisimulate (not a test: prints ratios).

Measures simulated seconds per wall second on one core for:

* traces/agentic_1h.parquet and the Mooncake-format sample (traces/mooncake_synthetic.jsonl,
  ingested to Parquet), Llama-3.1-70B on 8x MI355X with 16-token blocks, cache-aware
  admission window 0 (off) and 16 (threshold 0.5), each replayed twice, with
  ``--no-async-scheduling`` (sync) and with async scheduling (the twin's
  ``SimOptions.async_scheduling``: AsyncScheduler under a batch queue of 2), side by side;
  the async column is its speed over the sync run's (target >= 0.9x). Target: >= 1,000x
  real time in both modes, window off and on (>= 1,500x on the Mooncake sample).
* Peak memory of each replay (max RSS of a child process that does only that replay).
* The prefix-hit check: with an effectively unbounded KV cache the twin's hit rate on the
  Mooncake sample against the trace's ideal rate (tuner.trace stats), with every
  difference accounted for (block granularity, vLLM's last-token rule, in-flight timing).
* aisimulate (when a venv with it exists at $AISIM_VENV or .venv-aisim) on the Mooncake
  sample with the closest configuration (Llama-3.1-8B, TP4 on H200, 16-token blocks,
  prefix caching; ../shared/spec/landscape.md §7): our speed ratio over it and both
  tools' TTFT p50/p99, ITL p99 and prefix-hit rate.

* With ``--curve``: microseconds per scheduler step against running requests in steady
  decode, 8 to 1,024 running, both modes (``bench/step_curve.py``).
* With ``--compare DIR``: every speed row (and curve point) is also replayed with another
  checkout (``DIR`` first on ``PYTHONPATH``) at the same time, and the ratio of the two
  replays' CPU seconds is printed (the steadier figure on a shared machine).

Usage:  .venv/bin/python bench/replay.py [--speed-only] [--no-aisim] [--curve]
        [--compare OTHER_CHECKOUT] [--json OUT]
Each replay runs in its own child process pinned to one CPU, so peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from peak_rss import peak_rss_mib

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 1000.0  # issue 23: >= 1,000x on the agentic hour (>= 1,500x on Mooncake)
AISIM_VERSION = "0.13.0.dev202610270000000085"


# ----------------------------------------------------------------------------- child side


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """One replay in this process; returns its figures (called in a fresh child)."""
    # One core: the twin is single-threaded Python and polars is held to one thread. The
    # child is not pinned, so a busy neighbour on one CPU does not halve it; CPU seconds
    # are reported beside wall seconds for machines shared with other work.
    from tuner import replay
    from tuner.metrics import summarize
    from tuner.sim.load import ClosedLoop, OpenLoop
    from tuner.perf.presets import resolve_target
    from tuner.perf.target import Target

    from tuner.sim.settings import SimOptions

    async_scheduling = bool(spec.get("async_scheduling", False))
    target = Target(**spec["target"], async_scheduling=async_scheduling)
    resolved = resolve_target(target)
    settings = replay.parse_settings(spec.get("set", []), resolved.default_settings)
    load = ClosedLoop(spec["concurrency"]) if spec.get("concurrency") else OpenLoop()
    t0, c0 = time.perf_counter(), time.process_time()
    result = replay.run(spec["trace"], settings, target=target, load=load,
                        options=SimOptions(async_scheduling=async_scheduling))
    total_wall, total_cpu = time.perf_counter() - t0, time.process_time() - c0
    s = summarize(result)
    rss = peak_rss_mib()  # this child's own peak (bench/peak_rss.py says why)
    return {"summary": s.to_dict(), "total_wall_s": total_wall, "total_cpu_s": total_cpu,
            "peak_rss_mib": rss,
            "target": resolved.description, "num_gpu_blocks": resolved.cache.num_gpu_blocks,
            "block_size": resolved.cache.block_size,
            "max_model_len": resolved.cache.max_model_len}


def _timed(cmd: list[str], **kwargs: Any) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``cmd``; return it with its wall seconds and CPU seconds (user + sys, including
    the processes it waited for), so ratios stay meaningful on a machine shared with
    other work."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, wall, cpu


def _run_child(spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, POLARS_MAX_THREADS="1", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", RAYON_NUM_THREADS="1")
    proc, wall, cpu = _timed([sys.executable, __file__, "--child", json.dumps(spec)],
                             env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({spec}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out.update(process_wall_s=wall, process_cpu_s=cpu)
    return out


def _run_pair(spec: dict[str, Any], other: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same child replay with this checkout and with ``other`` first on PYTHONPATH,
    both at once (a busy machine slows both alike); their figures, ours first."""
    procs = []
    for root in (ROOT, other):
        env = dict(os.environ, POLARS_MAX_THREADS="1", OMP_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1", RAYON_NUM_THREADS="1")
        if root != ROOT:
            env["PYTHONPATH"] = str(root)
        procs.append(subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env, cwd=ROOT))
    outs = []
    for root, proc in zip((ROOT, other), procs):
        stdout, stderr = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"child failed ({root}, {spec}):\n{stderr[-3000:]}")
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outs[0], outs[1]


#: ``--compare DIR``: every speed row is also replayed with that checkout, at the same time.
COMPARE: Path | None = None


# ----------------------------------------------------------------------------- traces


def _mooncake_parquet(src: Path, workdir: Path) -> Path:
    from tuner.trace import ingest

    out = workdir / "mooncake_synthetic.parquet"
    ingest(src, out, format="mooncake", salt=b"bench-replay", progress=False)
    return out


def _ideal_hit_rate(trace_path: Path) -> float:
    from tuner.trace import read_trace
    from tuner.trace.stats import trace_stats

    return float(trace_stats(read_trace(trace_path)).ideal_prefix_hit_rate)


def _hit_accounting(trace_path: Path, block_size: int, max_model_len: int) -> dict[str, float]:
    """The trace's ideal hit rate taken, one exact step at a time, to what vLLM can reach.

    1. ``stats_rule_engine``: tuner trace stats' rule (leading run of seen hash blocks at
       the trace's granularity, a seen partial tail counting up to ``input_len``), without
       the requests the engine rejects (``input_len + output_len > max_model_len``).
    2. ``kv_block_ideal``: at ``block_size``-token full KV blocks (a partial tail's last
       ``< block_size`` tokens never hit), ``tuner.replay.ideal_hit_rate``.
    3. ``kv_block_ideal_capped``: plus vLLM's last-token rule: the attainable ideal.
    """
    from tuner import replay

    requests, size = replay.load_requests(str(trace_path))
    seen: set[int] = set()
    queries = hits = 0
    for r in requests:
        if r.input_len + r.output_len > max_model_len:
            continue
        run = 0
        for h in r.block_hashes:
            if h not in seen:
                break
            run += 1
        queries += r.input_len
        hits += min(run * size, r.input_len)
        seen.update(r.block_hashes)
        seen.update(r.output_block_hashes)
    kv = [replay.reblock_request(r, size, block_size) for r in requests]
    ideal = replay.ideal_hit_rate(kv, block_size=block_size, max_model_len=max_model_len)
    return {"stats_rule_engine": hits / queries,
            "kv_block_ideal": ideal.full_block_rate,
            "kv_block_ideal_capped": ideal.attainable_rate,
            "requests_counted": ideal.num_requests,
            "requests_total": len(requests)}


# ----------------------------------------------------------------------------- aisimulate


def _aisim_venv() -> Path | None:
    for cand in (os.environ.get("AISIM_VENV"), str(ROOT / ".venv-aisim")):
        if cand and (Path(cand) / "bin" / "aisimulate").exists():
            return Path(cand)
    return None


def _try_install_aisim() -> Path | None:
    """Create .venv-aisim once (about 1.5 GB); None when it cannot be installed."""
    venv = ROOT / ".venv-aisim"
    marker = ROOT / ".venv-aisim.failed"
    if marker.exists():
        return None
    print(f"installing aisimulate=={AISIM_VERSION} into {venv} (once, ~1.5 GB) ...", flush=True)
    ok = subprocess.run([sys.executable, "-m", "venv", str(venv)]).returncode == 0 and \
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q",
                        f"aisimulate=={AISIM_VERSION}"]).returncode == 0
    if not ok:
        marker.write_text("aisimulate install failed once; delete this file to retry\n")
        return None
    return venv


def _run_aisim(venv: Path, trace_jsonl: Path, workdir: Path, *,
               kv_blocks: int | None = None) -> dict[str, Any]:
    cfg = workdir / f"aisim_{kv_blocks or 'default'}.yaml"
    out = workdir / f"aisim_out_{kv_blocks or 'default'}"
    capacity = (f"\n        capacity: {{type: fixed, blocks: {kv_blocks}}}" if kv_blocks else "")
    cfg.write_text(f"""traffic:
  source: {{type: trace, paths: [{trace_jsonl}], format: mooncake, block_size: 512}}
  load:   {{type: trace_timestamps, speedup: 1.0}}
engine:
  mode: aggregated
  model: meta-llama/Meta-Llama-3.1-8B
  hardware: h200_sxm
  backend: vllm
  backend_version: "0.24.0"
  workers:
    aggregated:
      parallelism: {{replicas: 1, tensor: 4}}
      scheduler: {{max_batched_tokens: 8192, max_sequences: 256}}
      kv_cache:
        block_size: 16
        prefix_caching: true{capacity}
""")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               RAYON_NUM_THREADS="1")
    proc, process_wall, process_cpu = _timed(
        [str(venv / "bin" / "aisimulate"), "predict", "-c", str(cfg), "--output-dir", str(out)],
        env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"aisimulate failed:\n{proc.stderr[-3000:]}")
    pred = json.loads((out / "prediction.json").read_text())
    return {
        "simulated_s": pred["duration_ms"] / 1e3,
        "wall_s": pred["wall_time_ms"] / 1e3,
        "process_wall_s": process_wall,
        "process_cpu_s": process_cpu,
        "ttft_p50_s": pred["median_ttft_ms"] / 1e3,
        "ttft_p99_s": pred["p99_ttft_ms"] / 1e3,
        "itl_p99_s": pred["p99_itl_ms"] / 1e3,
        "prefix_cache_hit_rate": pred["prefix_cache_reused_ratio"],
        "completed": pred["completed_requests"],
    }


# ----------------------------------------------------------------------------- report


def _fmt_ratio(x: float) -> str:
    return f"{x:,.0f}x"


def _decisions(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary without the replay's own timings: what must not change between two
    checkouts whose decisions are identical."""
    return {k: v for k, v in summary.items() if k not in ("wall_s", "speed_ratio")}


def _speed_row(name: str, path: Path, window: int, target: dict[str, Any],
               sync_row: dict[str, Any] | None) -> dict[str, Any]:
    """Replay one trace in a child, sync when ``sync_row`` is None, else async (its speed
    then also relative to ``sync_row``'s, in CPU seconds: steadier than wall time on a
    shared machine); print its two lines and return its figures."""
    mode = "sync" if sync_row is None else "async"
    spec = {"trace": str(path), "target": target, "async_scheduling": sync_row is not None,
            "set": [f"cache_aware_admission_window={window}",
                    "cache_aware_admission_threshold=0.5"]}
    other = None
    if COMPARE is not None:
        out, other = _run_pair(spec, COMPARE)
    else:
        out = _run_child(spec)
    s = out["summary"]
    row = {"trace": name, "window": window, "mode": mode, "requests": s["num_requests"],
           "simulated_s": s["simulated_s"], "wall_s": s["wall_s"],
           "speed_ratio": s["speed_ratio"],
           "vs_target": s["speed_ratio"] / TARGET_RATIO,
           "cpu_s": out["total_cpu_s"],
           "cpu_speed_ratio": s["simulated_s"] / out["total_cpu_s"],
           "peak_rss_mib": out["peak_rss_mib"],
           "p90_interactivity": s["p90_interactivity"],
           "output_throughput_per_gpu": s["output_throughput_per_gpu"],
           "prefix_cache_hit_rate": s["prefix_cache_hit_rate"],
           "preemptions": s["preemptions"], "kv_usage_peak": s["kv_usage_peak"]}
    versus = ""
    if sync_row is not None:
        row["async_over_sync_cpu"] = row["cpu_speed_ratio"] / sync_row["cpu_speed_ratio"]
        row["async_over_sync_wall"] = row["speed_ratio"] / sync_row["speed_ratio"]
        versus = f"{row['async_over_sync_cpu']:.2f}x"
    print(f"{name:<20} {window:>6} {mode:>5} {row['requests']:>9,} "
          f"{row['simulated_s']:>12,.1f} {row['wall_s']:>8.2f} "
          f"{_fmt_ratio(row['speed_ratio']):>13} {row['vs_target']:>7.2f}x "
          f"{_fmt_ratio(row['cpu_speed_ratio']):>12} {row['peak_rss_mib']:>7.0f} MiB "
          f"{versus:>10}")
    if other is not None:
        row["other_cpu_s"] = other["total_cpu_s"]
        row["other_over_this_cpu"] = other["total_cpu_s"] / out["total_cpu_s"]
        row["same_summary"] = _decisions(other["summary"]) == _decisions(s)
        print(f"{'':<20} {'':>6} {'':>5}   vs {COMPARE} (run at the same time): replay CPU "
              f"{other['total_cpu_s']:.2f} s there, {out['total_cpu_s']:.2f} s here: "
              f"{row['other_over_this_cpu']:.2f}x; same summary (all but timings): "
              f"{'yes' if row['same_summary'] else 'NO'}")
    print(f"{'':<20} {'':>6} {'':>5}   p90 interactivity {row['p90_interactivity']:.1f} tok/s, "
          f"output {row['output_throughput_per_gpu']:.0f} tok/s/GPU, hit rate "
          f"{row['prefix_cache_hit_rate']:.4f}, preemptions {row['preemptions']}, "
          f"peak KV {row['kv_usage_peak']:.3f}")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--no-aisim", action="store_true", help="skip the aisimulate comparison")
    ap.add_argument("--install-aisim", action="store_true",
                    help="create .venv-aisim when no aisimulate venv is found")
    ap.add_argument("--skip-agentic", action="store_true", help="only the Mooncake sample")
    ap.add_argument("--speed-only", action="store_true",
                    help="stop after the speed table (sync and async side by side)")
    ap.add_argument("--json", help="also write all figures to this JSON file")
    ap.add_argument("--curve", action="store_true",
                    help="also print us per step against running requests (steady decode)")
    ap.add_argument("--compare", type=Path,
                    help="another checkout: every speed row and curve point is also run "
                         "with it, at the same time, and the CPU-second ratio printed")
    ap.add_argument("--agentic", default=str(ROOT / "traces" / "agentic_1h.parquet"),
                    help="the agentic trace (default: the bundled one)")
    ap.add_argument("--mooncake", default=str(ROOT / "traces" / "mooncake_synthetic.jsonl"),
                    help="the Mooncake-format JSONL sample (default: the bundled one)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    global COMPARE
    COMPARE = args.compare.resolve() if args.compare else None

    figures: dict[str, Any] = {"speed": [], "target_ratio": TARGET_RATIO}
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        work = Path(tmp)
        mooncake_src = Path(args.mooncake)
        mooncake = _mooncake_parquet(mooncake_src, work)
        traces = [("mooncake_synthetic", mooncake)]
        if not args.skip_agentic:
            traces.insert(0, ("agentic_1h", Path(args.agentic)))
        big = {"hardware": "mi355x", "model": "llama-3.1-70b", "tp": 8, "block_size": 16}

        print("== Speed: Llama-3.1-70B on 8x MI355X, 16-token blocks, one core ==")
        print(f"{'trace':<20} {'window':>6} {'mode':>5} {'requests':>9} {'simulated s':>12} "
              f"{'wall s':>8} {'sim s/wall s':>13} {f'vs {TARGET_RATIO:,.0f}x':>8} {'sim s/CPU s':>12} "
              f"{'peak RSS':>10} {'async/sync':>10}")
        for name, path in traces:
            for window in (0, 16):
                sync_row = _speed_row(name, path, window, big, None)
                figures["speed"].append(sync_row)
                figures["speed"].append(_speed_row(name, path, window, big, sync_row))

        if args.curve:
            sys.path.insert(0, str(ROOT / "bench"))
            from step_curve import RUNNING, curve

            print("\n== Steady decode: us per step against running requests ==")
            figures["step_curve"] = curve(list(RUNNING), 512, args.compare)
        if args.speed_only:
            if args.json:
                Path(args.json).write_text(json.dumps(figures, indent=2, default=str))
            return 0
        # --- the aisimulate configuration on our side -----------------------------------
        small = {"hardware": "h200", "model": "llama-3.1-8b", "tp": 4, "block_size": 16}
        small_set = ["max_num_batched_tokens=8192", "max_num_seqs=256"]
        ours = _run_child({"trace": str(mooncake), "target": small, "set": small_set})
        figures["ours_8b_h200"] = ours

        # --- the unbounded-cache prefix-hit check ---------------------------------------
        from tuner import replay as _replay

        reqs, _ = _replay.load_requests(str(mooncake))
        unbounded = sum(-(-(r.input_len + r.output_len) // 16) for r in reqs) + 2
        ub_target = dict(small, num_gpu_blocks=unbounded)
        ub_open = _run_child({"trace": str(mooncake), "target": ub_target, "set": small_set})
        ub_c1 = _run_child({"trace": str(mooncake), "target": ub_target, "set": small_set,
                            "concurrency": 1})
        ideal = _ideal_hit_rate(mooncake)
        acct = _hit_accounting(mooncake, 16, int(ours.get("max_model_len") or 1 << 30))
        hit = {"trace_ideal_stats": ideal, **acct,
               "sim_unbounded_open_loop": ub_open["summary"]["prefix_cache_hit_rate"],
               "sim_unbounded_concurrency_1": ub_c1["summary"]["prefix_cache_hit_rate"],
               "unbounded_blocks": unbounded}
        figures["prefix_hit_check"] = hit
        print("\n== Prefix-hit check, Mooncake sample, unbounded KV cache "
              f"({unbounded:,} blocks of 16 tokens) ==")
        print(f"  trace ideal (tuner trace stats, 512-token hash blocks) {ideal:.6f}"
              f"  all {acct['requests_total']:,} requests")
        print(f"  ... without the {acct['requests_total'] - acct['requests_counted']} requests "
              f"the engine rejects (> max_model_len)  {acct['stats_rule_engine']:.6f}")
        print(f"  ideal at 16-token full KV blocks                       {acct['kv_block_ideal']:.6f}"
              "  (partial tails' last < 16 tokens never hit)")
        print(f"  ... with vLLM's last-token rule (the attainable ideal) {acct['kv_block_ideal_capped']:.6f}")
        print(f"  twin, closed loop concurrency 1 (no in-flight overlap) {hit['sim_unbounded_concurrency_1']:.6f}"
              f"  {'== attainable ideal' if abs(hit['sim_unbounded_concurrency_1'] - acct['kv_block_ideal_capped']) < 1e-12 else '!= attainable ideal'}")
        print(f"  twin, open loop at trace times                         {hit['sim_unbounded_open_loop']:.6f}")

        # --- aisimulate side by side ----------------------------------------------------
        if not args.no_aisim:
            venv = _aisim_venv() or (_try_install_aisim() if args.install_aisim else None)
            if venv is None:
                print("\naisimulate: no venv at $AISIM_VENV or .venv-aisim (create it with "
                      "--install-aisim); side-by-side skipped")
            else:
                theirs = _run_aisim(venv, mooncake_src.resolve(), work)
                theirs_ub = _run_aisim(venv, mooncake_src.resolve(), work, kv_blocks=unbounded)
                figures["aisimulate"] = {"default": theirs, "unbounded": theirs_ub}
                s = ours["summary"]
                ours_ratio = s["speed_ratio"]
                ours_process = s["simulated_s"] / ours["process_wall_s"]
                ours_cpu = s["simulated_s"] / ours["process_cpu_s"]
                their_ratio = theirs["simulated_s"] / theirs["wall_s"]
                their_process = theirs["simulated_s"] / theirs["process_wall_s"]
                their_cpu = theirs["simulated_s"] / theirs["process_cpu_s"]
                print("\n== Side by side with aisimulate on the Mooncake sample "
                      "(Llama-3.1-8B, TP4, H200, 16-token blocks, prefix caching) ==")
                print(f"{'':<34} {'tuner sim':>14} {'aisimulate':>14}")
                rows = [
                    ("simulated s", f"{s['simulated_s']:,.1f}", f"{theirs['simulated_s']:,.1f}"),
                    ("sim s / wall s (replay only)", _fmt_ratio(ours_ratio), _fmt_ratio(their_ratio)),
                    ("sim s / wall s (whole process)", _fmt_ratio(ours_process),
                     _fmt_ratio(their_process)),
                    ("sim s / CPU s (whole process)", _fmt_ratio(ours_cpu), _fmt_ratio(their_cpu)),
                    ("TTFT p50 (ms)", f"{s['ttft_p50_s'] * 1e3:,.1f}", f"{theirs['ttft_p50_s'] * 1e3:,.1f}"),
                    ("TTFT p99 (ms)", f"{s['ttft_p99_s'] * 1e3:,.1f}", f"{theirs['ttft_p99_s'] * 1e3:,.1f}"),
                    ("ITL p99 (ms)", f"{s['itl_p99_s'] * 1e3:,.2f}", f"{theirs['itl_p99_s'] * 1e3:,.2f}"),
                    ("prefix-hit rate", f"{s['prefix_cache_hit_rate']:.4f}",
                     f"{theirs['prefix_cache_hit_rate']:.4f}"),
                    ("prefix-hit rate, unbounded cache",
                     f"{hit['sim_unbounded_open_loop']:.4f}",
                     f"{theirs_ub['prefix_cache_hit_rate']:.4f}"),
                    ("finished requests", f"{s['num_finished']:,}", f"{theirs['completed']:,}"),
                ]
                for label, a, b in rows:
                    print(f"{label:<34} {a:>14} {b:>14}")
                print(f"speed ratio tuner/aisimulate: {ours_ratio / their_ratio:.2f}x (replay only, "
                      f"wall), {ours_process / their_process:.2f}x (whole process, wall), "
                      f"{ours_cpu / their_cpu:.2f}x (whole process, CPU s)")
                figures["ratio_over_aisimulate"] = {
                    "replay_wall": ours_ratio / their_ratio,
                    "process_wall": ours_process / their_process,
                    "process_cpu": ours_cpu / their_cpu}
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
