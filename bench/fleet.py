#!/usr/bin/env python3
"""Cost of a fleet replay against its number of engines (not a test: prints ratios).

The same total traffic (one synthetic chat trace, 20 minutes at 8 requests/s, sessions
known, which one engine keeps up with) replayed on 1, 2, 4 and 8 engines of Llama-3.1-8B
on H200 (TP1): as replicas behind a router (round-robin, and prefix-aware, whose cost
also scans every engine's prefix cache per request) and as DP ranks of one deployment
(dense, vLLM's load balancer). The total number of steps grows with the engines (each
engine steps for itself), so about linear cost is the goal. Columns: CPU seconds of the
whole call (trace loading included; CPU, not wall, so a machine shared with other work
does not inflate them), that over the 1-engine figure, steps, CPU microseconds a step.

The 1-engine row runs the single-engine ``Simulator`` (the path every single-engine replay
takes); the row below it (``fleet loop, 1 engine``: ``FleetSimulator`` with one engine, the
trace read into memory) shows what the fleet machinery costs by itself.

With ``--pd`` it measures issue 26's replay-cost goal instead: a ``--pd 1:1`` replay of the
agentic hour (a slice, ``--end``; Llama-3.1-70B TP8 on MI355X, async scheduling, the
default) against the sum of its two engines' single-engine replays: the prefill
instance's traffic alone (the same trace with one output token a request, as the proxy
sends it) and the decode instance's as one aggregated engine (the whole trace: an upper
bound of the decoder's work, which reads the prompts instead of computing them) and,
the honest row, the decoder alone: the P/D replay's decode engine with no prefill
engine, each request arriving when the proxy handed it off in an untimed recording P/D
run (``_child_decoder``). Each
replay runs in its own child process, alternating, ``--rounds`` times (medians of CPU
seconds); ``--compare DIR`` also replays the P/D layout with another checkout.

Usage:  .venv/bin/python bench/fleet.py [--quick] [--json OUT]
        .venv/bin/python bench/fleet.py --pd [--end 10m] [--rounds 3] [--compare OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RATE = 8.0  # one H200 keeps up with it (TTFT p90 well under a second)


def _trace(quick: bool) -> Any:
    from tuner.trace.synth import synthesize

    return synthesize("chat", duration_s=300 if quick else 1200, rate=RATE, seed=7)


def _run(trace: Any, *, dp: int, replicas: int, policy: str,
         single_engine_fleet: bool = False) -> dict[str, Any]:
    from tuner import replay
    from tuner.metrics import summarize
    from tuner.perf.presets import resolve_target
    from tuner.perf.target import Target
    from tuner.sim.fleet import RouterSettings
    from tuner.sim.fleet.simulator import FleetSimulator

    target = Target(hardware="h200", model="llama-3.1-8b", tp=1, dp=dp, replicas=replicas)
    router = RouterSettings(policy)
    if single_engine_fleet:
        from tuner.sim.settings import SimOptions

        t0, c0 = time.perf_counter(), time.process_time()
        resolved = resolve_target(target)
        # the scheduling mode replay.run() resolves for the target (async on a GPU where
        # the twin models it), so this row replays what the Simulator row replays
        mode = bool(getattr(resolved, "async_scheduling", False))
        requests = replay.intern_requests(trace, resolved.cache.block_size)
        fleet = FleetSimulator(requests, resolved.default_settings, resolved.cache,
                               resolved.step_time, num_gpus=1,
                               num_hash_ids=requests.num_hash_ids,
                               options=SimOptions(async_scheduling=mode))
        result = fleet.run()
    else:
        t0, c0 = time.perf_counter(), time.process_time()
        result = replay.run(trace, target=target, router=router)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = summarize(result)
    return {"engines": dp * replicas, "dp": dp, "replicas": replicas, "router": policy,
            "wall_s": wall, "cpu_s": cpu, "replay_s": result.wall_s,
            "steps": int(result.counters["num_steps"]),
            "us_per_step": 1e6 * cpu / max(1, result.counters["num_steps"]),
            "ttft_p90_s": s.ttft_p90_s, "hit_rate": s.prefix_cache_hit_rate,
            "single_engine_fleet": single_engine_fleet}


_TARGET = dict(hardware="mi355x", model="llama-3.1-70b", tp=8)


def _child_pd(spec: dict[str, Any]) -> dict[str, Any]:
    """A whole replay (``--pd 1:1`` or one aggregated engine) through ``replay.run``;
    with ``handoffs`` also writes when each request reached its decoder (untimed use)."""
    from tuner import replay
    from tuner.perf.target import Target

    kw: dict[str, Any] = {}
    if spec["pd"]:
        from tuner.perf.pd_link import PDLayout

        kw["pd"] = PDLayout(1, 1)
    target = Target(**_TARGET)
    c0 = time.process_time()
    if spec.get("handoffs"):
        # The recording run: the proxy's handoffs, as the loop makes them (``_hand_off``
        # puts a request in its decoder's input queue at the loop's clock).
        instance = replay.prepare(spec["trace"], target=target, **kw)
        loop = instance._simulator.loop
        table = instance._simulator.table
        seen: dict[str, float] = {}
        hand_off = loop._hand_off

        def recording(index: int, source: Any, arrival_s: float) -> None:
            seen[table.request_id[index]] = loop.now_s
            hand_off(index, source, arrival_s)

        loop._hand_off = recording
        result = instance.run()
        instance.close()
        Path(spec["handoffs"]).write_text(json.dumps(seen))
    else:
        result = replay.run(spec["trace"], target=target, **kw)
    return {"cpu_s": time.process_time() - c0, "steps": int(result.counters["num_steps"]),
            "finished": int(result.counters["num_finished"])}


class _ToTheDecoder:
    """The decoder-alone replay's front end: every request to engine 0."""

    targets_engines = True

    def route(self, index: int, source: Any, arrival_s: float) -> int:
        return 0

    def finished(self, index: int) -> None:
        """No in-flight counts."""


def _child_decoder(spec: dict[str, Any]) -> dict[str, Any]:
    """The decode instance's own traffic replayed alone by the P/D replay's decode engine
    (``DecodeEngine``, its NIXL connector pulling every prompt over the 1:1 layout's
    link, the fenced KV manager under async scheduling), in the P/D loop with no
    prefill engine: the requests arrive when the proxy handed them off in the P/D
    replay (the trace ``spec["trace"]`` carries those times as ``arrival_s``), with
    their prompts' KV on a prefill instance that never makes the decoder wait."""
    import math

    from tuner.perf.pd_link import PDLayout, pd_settings
    from tuner.perf.presets import resolve_target
    from tuner.perf.target import Target
    from tuner.replay._disagg import pd_pools
    from tuner.replay._run import _kv_requests
    from tuner.sim.clock import batch_queue_depth
    from tuner.sim.disagg.engines import DecodeEngine, fence_decoder
    from tuner.sim.disagg.loop import PDLoop
    from tuner.sim.fleet.simulator import engine_summary, merge_timeseries, run_engines
    from tuner.sim.loop import AdmissionRules
    from tuner.sim.scheduler import Scheduler
    from tuner.sim.settings import SimOptions

    c0 = time.process_time()
    resolved = resolve_target(Target(**_TARGET))
    settings = resolved.default_settings
    layout = PDLayout(1, 1)
    prefill, decode = pd_pools(layout, resolved, settings)
    pd = pd_settings(layout, prefill, decode)
    options = SimOptions(async_scheduling=resolved.async_scheduling)
    block_size = decode.cache.block_size
    source: Any = _kv_requests(spec["trace"], None, block_size, arrays=True, hash_ids=True,
                               stream=True)
    table = source.table()
    scheduler = Scheduler(settings, decode.cache, options, num_hash_ids=source.num_hash_ids)
    if options.async_scheduling:
        fence_decoder(scheduler, source.num_hash_ids)
    source.bind(scheduler)
    # every request was prefilled remotely (do_remote_prefill): its prefill's times
    remote = {i: (math.nan, math.nan, 0, 0) for i in range(len(table))}
    engine = DecodeEngine(scheduler, block_size, options, table, pd,
                          lambda index, start_s, end_s: None, remote)
    rules = AdmissionRules.of(settings, decode.cache)
    loop = PDLoop([], [engine], source, decode.step_time, decode.step_time, rules, rules,
                  table, num_requests=source.num_requests,
                  batch_queue_depth=batch_queue_depth(options.async_scheduling),
                  router=_ToTheDecoder())
    # As the P/D simulator does: the stream renumbers its hash ids past min_compact_ids
    # (the agentic hour does at 2**21), and a request still in the loop's input queue
    # must be renumbered with the live ones, or it reaches the decoder with stale ids.
    source.hold_in_transit(lambda: [s for queue in loop.pending for _, s, _ in queue])
    run_engines([engine], loop, None)
    engine_summary(0, engine, replica=0, dp_rank=0)  # what a result would build
    merge_timeseries([engine.timeseries])
    return {"cpu_s": time.process_time() - c0, "steps": engine.num_steps,
            "finished": engine.num_finished}


def _pd_child(checkout: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """One replay in a fresh child with ``checkout``'s ``tuner`` first on the path."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(checkout), POLARS_MAX_THREADS="1")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                           json.dumps(spec)], env=env, cwd=checkout,
                          capture_output=True, text=True)
    if proc.returncode != 0:  # the child's own error, not only its exit status
        raise SystemExit(f"the {spec['kind']} replay with {checkout} failed "
                         f"({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _pd_traces(end: str, tmp: Path) -> tuple[str, str]:
    """The agentic slice, and the same requests as the proxy sends them to the prefill
    instance (one output token, no output hashes)."""
    import os
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    full = tmp / "slice.parquet"
    subprocess.run([sys.executable, "-c", "from tuner.cli import main; main()", "trace",
                    "slice", str(ROOT / "traces" / "agentic_1h.parquet"), "--end", end,
                    "-o", str(full)], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                   check=True, capture_output=True)
    table = pq.read_table(full)
    # the trace's file-level metadata (hash block size), kept
    metadata = {b"tuner.trace": pq.ParquetFile(full).metadata.metadata[b"tuner.trace"]}
    ones = pa.array([1] * table.num_rows, type=table.schema.field("output_len").type)
    table = table.set_column(table.schema.get_field_index("output_len"), "output_len", ones)
    col = table.schema.get_field_index("output_block_hashes")
    table = table.set_column(col, table.schema.field(col),
                             pa.nulls(table.num_rows, table.schema.field(col).type))
    prefill = tmp / "prefill.parquet"
    pq.write_table(table.replace_schema_metadata(metadata), prefill)
    return str(full), str(prefill)


def _decoder_trace(full: str, handoffs: str, tmp: Path) -> str:
    """The decode instance's traffic: the requests the proxy handed off, each arriving at
    its handoff time (a request refused at the handoff never reaches it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    seen = json.loads(Path(handoffs).read_text())
    table = pq.read_table(full)
    metadata = {b"tuner.trace": pq.ParquetFile(full).metadata.metadata[b"tuner.trace"]}
    ids = table.column("request_id").to_pylist()
    keep = [i for i, rid in enumerate(ids) if rid in seen]
    table = table.take(pa.array(keep, type=pa.int64()))
    times = pa.array([seen[ids[i]] for i in keep], type=table.schema.field("arrival_s").type)
    table = table.set_column(table.schema.get_field_index("arrival_s"), "arrival_s", times)
    out = tmp / "decoder.parquet"
    pq.write_table(table.replace_schema_metadata(metadata), out)
    return str(out)


def pd_main(end: str, rounds: int, compare: Path | None) -> None:
    """Issue 26's goal: a P/D replay costs at most the sum of its engines' single-engine
    replays (module doc)."""
    import statistics
    import tempfile

    load_start = os.getloadavg()[0]  # the machine is shared: say how busy it was
    with tempfile.TemporaryDirectory() as tmp:
        full, prefill = _pd_traces(end, Path(tmp))
        handoffs = str(Path(tmp) / "handoffs.json")
        _pd_child(ROOT, {"kind": "pd", "trace": full, "pd": True, "handoffs": handoffs})
        decoder = _decoder_trace(full, handoffs, Path(tmp))
        arms = [("pd", ROOT, {"kind": "pd", "trace": full, "pd": True}),
                ("prefill alone", ROOT, {"kind": "pd", "trace": prefill, "pd": False}),
                ("decoder alone", ROOT, {"kind": "decoder", "trace": decoder}),
                ("aggregated", ROOT, {"kind": "pd", "trace": full, "pd": False})]
        if compare is not None:
            arms.append(("pd, other checkout", compare.resolve(),
                         {"kind": "pd", "trace": full, "pd": True}))
        cpu: dict[str, list[float]] = {}
        steps: dict[str, int] = {}
        for r in range(rounds):
            for name, checkout, spec in arms:
                row = _pd_child(checkout, spec)
                cpu.setdefault(name, []).append(row["cpu_s"])
                steps[name] = row["steps"]
                print(f"round {r + 1} {name:<20}{row['cpu_s']:8.2f} CPU s "
                      f"{row['steps']:>9,} steps {row['finished']:>7,} finished", flush=True)
    med = {name: statistics.median(v) for name, v in cpu.items()}
    print(f"\nagentic slice {end}, Llama-3.1-70B TP8 MI355X, median of {rounds}, CPU s "
          f"(load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end):")
    for name in med:
        print(f"  {name:<20}{med[name]:8.2f} s {steps[name]:>9,} steps")
    for other in ("decoder alone", "aggregated"):
        engines = med["prefill alone"] + med[other]
        print(f"  --pd 1:1 / (prefill alone + {other}) = {med['pd'] / engines:.2f} "
              f"(goal <= 1.00)")
    # each round's own ratio: its arms ran back to back, so the spread shows the noise
    per_round = [cpu["pd"][r] / (cpu["prefill alone"][r] + cpu["decoder alone"][r])
                 for r in range(rounds)]
    print("  per round, --pd 1:1 / (prefill alone + decoder alone): "
          + ", ".join(f"{x:.2f}" for x in per_round))
    if compare is not None:
        print(f"  --pd 1:1, other checkout over this one: "
              f"{med['pd, other checkout'] / med['pd']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 minutes of traffic, not 20")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--pd", action="store_true",
                        help="P/D replay cost against its engines' single-engine replays")
    parser.add_argument("--end", default="10m", help="--pd: slice of the agentic hour")
    parser.add_argument("--rounds", type=int, default=3, help="--pd: alternating rounds")
    parser.add_argument("--compare", type=Path, default=None, help="--pd: another checkout")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:  # one timed replay (_pd_child)
        spec = json.loads(args.child)
        child = _child_decoder if spec["kind"] == "decoder" else _child_pd
        print(json.dumps(child(spec)))
        return
    if args.pd:
        pd_main(args.end, args.rounds, args.compare)
        return
    trace = _trace(args.quick)
    print(f"trace: chat, {sum(1 for _ in trace.requests()):,} requests "
          f"({'5' if args.quick else '20'} min at {RATE:g} req/s); Llama-3.1-8B TP1 on H200")
    rows = [_run(trace, dp=1, replicas=1, policy="round-robin"),
            _run(trace, dp=1, replicas=1, policy="round-robin", single_engine_fleet=True)]
    for n in (2, 4, 8):
        rows.append(_run(trace, dp=1, replicas=n, policy="round-robin"))
        rows.append(_run(trace, dp=1, replicas=n, policy="prefix-aware"))
        rows.append(_run(trace, dp=n, replicas=1, policy="round-robin"))
    base = rows[0]["cpu_s"]
    print(f"{'deployment':<34}{'CPU s':>10}{'x 1 engine':>12}{'steps':>11}"
          f"{'us/step':>9}{'TTFT p90':>10}{'hit rate':>10}")
    for r in rows:
        if r["single_engine_fleet"]:
            name = "fleet loop, 1 engine"
        elif r["engines"] == 1:
            name = "1 engine (Simulator)"
        elif r["dp"] > 1:
            name = f"DP {r['dp']} (vLLM balancer)"
        else:
            name = f"{r['replicas']} replicas, {r['router']}"
        print(f"{name:<34}{r['cpu_s']:>10.2f}{r['cpu_s'] / base:>12.2f}"
              f"{r['steps']:>11,}{r['us_per_step']:>9.1f}{r['ttft_p90_s']:>10.3f}"
              f"{r['hit_rate']:>10.4f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
