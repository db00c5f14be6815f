"""A disaggregated deployment step for step: every pool engine of a twin P/D replay against
vLLM 0.33.0's own ``Scheduler`` / ``AsyncScheduler`` with its NIXL connector's scheduler
side (``tuner fidelity --pd P:D``).

How: the twin replays the whole deployment (``tuner.replay.prepare`` with ``pd=``, the
replay path), and each engine's calls from the P/D loop (arrivals, schedules, step starts
and updates, aborts, in the loop's order) are logged (:func:`log_engine_calls`). vLLM's
scheduler for that engine is then driven through the same log in the vLLM environment
(``tuner.vllm_core.disagg``), its fake NIXL worker reporting each read finished at the
twin's read end, and the two step records are compared field by field
(:func:`tuner.fidelity.parity.compare_steps`). Why drive vLLM by the twin's log rather than
by a second loop: the proxy's choices and the transfer times are the twin's model, not
vLLM's scheduler; what is checked is that, given those, each engine schedules what vLLM's
would. The same machinery runs the parity cases of tests/vllm/test_pd_parity.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from tuner.fidelity.parity import ParityReport, compare_steps

__all__ = ["EngineParity", "PDParityReport", "log_engine_calls", "pd_engine_jobs",
           "run_pd_parity"]


def log_engine_calls(engine: Any, log: list[tuple]) -> None:
    """Record the P/D loop's calls on ``engine`` into ``log`` (the vLLM side replays
    them): ``("add", index, arrival_s)``, ``("schedule", now_s)``, ``("start", step_no,
    start_s, duration_s)``, ``("update", step_no, end_s)`` and a decoder's
    ``("abort", request_id)``; ``step_no`` is the schedule's number."""
    seq_of: dict[int, int] = {}  # id(step) -> its schedule's number, until its update
    counter = itertools.count()
    add, schedule, start, update = (engine.add_request, engine.schedule, engine.start,
                                    engine.update)

    def add_request(index: int, source: Any, arrival_s: float) -> None:
        log.append(("add", index, arrival_s))
        add(index, source, arrival_s)

    def schedule_(now_s: float) -> Any:
        step = schedule(now_s)
        seq_of[id(step)] = next(counter)
        log.append(("schedule", now_s))
        return step

    def start_(step: Any, start_s: float, duration_s: float) -> None:
        log.append(("start", seq_of[id(step)], start_s, duration_s))
        start(step, start_s, duration_s)

    def update_(step: Any, end_s: float) -> int:
        log.append(("update", seq_of.pop(id(step)), end_s))
        return update(step, end_s)

    engine.add_request, engine.schedule, engine.start, engine.update = (
        add_request, schedule_, start_, update_)
    if hasattr(engine, "apply_aborts"):  # a decoder: aborts go in before the schedule
        apply = engine.apply_aborts

        def apply_aborts(now_s: float) -> list[str]:
            done = apply(now_s)
            log.extend(("abort", rid) for rid in done)
            return done

        engine.apply_aborts = apply_aborts


def pd_engine_jobs(requests: list[dict[str, Any]], reads: dict[int, tuple[float, float]],
                   engines: list[tuple[str, Any, list[tuple]]], *, settings: dict[str, Any],
                   async_scheduling: bool, model_dir: str, prefill_tp: int,
                   extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One driver job per pool engine (``tuner.vllm_core.disagg.replay_pd_engine``).

    ``requests``: the trace's rows in trace order (the vllm-core job's form); ``reads``:
    trace position -> the twin's (read start, read end); ``engines``: ``(role, cache,
    log)`` per engine, a cache being a ``CacheSettings``; ``settings``: per role, the
    pool's scheduler settings as a dict (a prefill pool may have its own limits).
    A prefill engine sees every request with one output token, as the proxy sends it.
    """
    ends = {requests[i]["request_id"]: end for i, (_, end) in sorted(reads.items())}
    jobs = []
    for role, cache, log in engines:
        rows = []
        for r in requests:
            row = dict(r)
            row["block_hashes"] = tuple(row.get("block_hashes") or ())
            row["output_block_hashes"] = tuple(row.get("output_block_hashes") or ())
            row["priority"] = int(row.get("priority") or 0)
            if role == "prefill":
                row["output_len"], row["output_block_hashes"] = 1, ()
            rows.append(row)
        jobs.append({"pd_role": role, "requests": rows, "settings": settings[role],
                     "cache": dataclasses.asdict(cache), "async_scheduling": async_scheduling,
                     "model_dir": model_dir, "events": log, "read_end_s": ends,
                     "prefill_tp": prefill_tp, **(extra or {})})
    return jobs


@dataclass
class EngineParity:
    """One pool engine's comparison."""

    role: str  # prefill | decode
    index: int  # the instance within its pool
    report: ParityReport

    @property
    def name(self) -> str:
        return f"{self.role} {self.index}"


@dataclass
class PDParityReport:
    """Every pool engine's :class:`ParityReport`; identical when all are."""

    engines: list[EngineParity] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return all(e.report.identical for e in self.engines)

    def to_dict(self) -> dict[str, Any]:
        return {"identical": self.identical, "notes": list(self.notes),
                "engines": [{"role": e.role, "index": e.index, **e.report.to_dict()}
                            for e in self.engines]}

    def format_text(self) -> str:
        out = [f"P/D parity: {'identical' if self.identical else 'DIFFERENT'} "
               f"({len(self.engines)} engines)"]
        out += [f"  note: {n}" for n in self.notes]
        for e in self.engines:
            out.append(f"== {e.name}")
            out.append(e.report.format_text())
        return "\n".join(out)


class _Steps:
    """The slice of a ``ReplayResult`` :func:`compare_steps` reads, for one pool engine."""

    def __init__(self, steps: list[Any], wall_s: float = 0.0) -> None:
        self.steps, self.counters, self.requests, self.wall_s = steps, {}, [], wall_s


def run_pd_parity(trace: Any, settings: Any, *, layout: Any, vllm_python: str,
                  target: Any, load: Any = None, options: Any = None,
                  model_dir: str | None = None, context: int = 3,
                  timeout_s: float | None = None) -> PDParityReport:
    """Replay ``trace`` as ``layout`` on the twin and each pool engine on vLLM's scheduler.

    Raises:
        ConfigError: the layout, target or settings cannot be replayed (as ``replay --pd``).
        BackendError: the vLLM side failed.
    """
    from tuner.perf.presets import resolve_target
    from tuner.replay import pd_pools, prefill_settings, prepare
    from tuner.sim.settings import SimOptions
    from tuner.vllm_core.backend import run_driver

    options = dataclasses.replace(options or SimOptions(), record_steps=True)
    resolved = resolve_target(target, scheduler_settings=settings)
    settings = resolved.default_settings if settings is None else settings
    twin = prepare(trace, settings, backend="sim", target=target, load=load,
                   options=options, pd=layout)
    try:
        sim = twin.simulator  # the PDSimulator (tuner.replay._sim.SimBackend)
        logs: list[tuple[str, int, Any, list[tuple]]] = []
        for role, engines in (("prefill", sim.prefill), ("decode", sim.decode)):
            for i, engine in enumerate(engines):
                log: list[tuple] = []
                log_engine_calls(engine, log)
                logs.append((role, i, engine, log))
        t0 = time.perf_counter()
        twin.run()
        twin_s = time.perf_counter() - t0
        async_mode = bool(twin.async_scheduling)
    finally:
        twin.close()
    kw = {} if model_dir is None else {"model_dir": model_dir}
    vllm = prepare(trace, settings, backend="vllm-core", target=target, load=load,
                   options=options, vllm_python=vllm_python, **kw)
    job = vllm.job
    python = vllm.vllm_python
    vllm.close()
    prefill, decode = pd_pools(layout, resolved, settings)
    caches = {"prefill": prefill.cache, "decode": decode.cache}
    jobs = pd_engine_jobs(
        job["requests"], sim.reads, [(role, caches[role], log) for role, _, _, log in logs],
        settings={"prefill": prefill_settings(layout, settings).to_dict(),
                  "decode": settings.to_dict()},
        async_scheduling=async_mode, model_dir=job["model_dir"],
        prefill_tp=int(prefill.tp), extra={"transfer_mode": layout.transfer_mode})
    t0 = time.perf_counter()
    results = run_driver(jobs, python, timeout_s=timeout_s)
    vllm_s = time.perf_counter() - t0
    report = PDParityReport(notes=[
        f"{layout.num_prefill}:{layout.num_decode} (prefill TP{prefill.tp}, decode "
        f"TP{decode.tp}, {layout.transfer_mode}), {'async' if async_mode else 'no async'} "
        "scheduling; vLLM's "
        "scheduler driven by each twin engine's calls, reads ending at the twin's times"])
    for (role, i, engine, _), steps in zip(logs, results):
        rep = compare_steps(_Steps(engine.steps, twin_s / len(logs)),  # type: ignore[arg-type]
                            _Steps(steps, vllm_s / len(logs)), context=context)  # type: ignore[arg-type]
        report.engines.append(EngineParity(role, i, rep))
    return report
