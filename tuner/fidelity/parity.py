"""Step-by-step parity between the twin (``sim``) and vLLM's own scheduler (``vllm-core``).

Both backends replay the same trace on the same clock and record one ``StepRecord`` per
executed step. Parity means every step is identical: the same requests scheduled in the
same order with the same token counts, the same preemptions (in order), the same
prefix-cache hit for every request admitted in the step, the same KV usage (vLLM's
definition) after scheduling and, where both sides record it, the KV-usage gauge vLLM
samples at the end of ``update_from_output`` (under async scheduling the next step is
scheduled by then), the same running/waiting counts, and the same start time and
duration (same step-time model, so any difference in the batch shows up here too).
Both sides run in the mode of ``SimOptions.async_scheduling``.

:func:`compare_steps` compares two finished replays; :func:`run_parity` runs both
backends and compares them. The first divergence comes with a few steps of context
from both sides, because the cause usually sits a step or two earlier (an admission one
side made and the other did not).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.records import ReplayResult, StepRecord

#: Step fields compared, in the order a divergence is reported.
STEP_FIELDS = ("num_scheduled_tokens", "preempted", "cached_tokens", "kv_usage",
               "kv_usage_at_update", "num_running", "num_waiting", "start_s", "duration_s")
#: Counters compared after the run (vLLM-side counting, see docs/fidelity.md).
COUNTERS = ("num_steps", "preemptions", "prefix_cache_queries", "prefix_cache_hits",
            "num_finished", "rejected")


@dataclass(frozen=True, slots=True)
class StepDiff:
    """One step where the two sides differ: field -> (twin value, vllm value)."""

    step: int
    fields: dict[str, tuple[Any, Any]]


@dataclass(slots=True)
class ParityReport:
    """The outcome of a step-by-step comparison."""

    num_steps_twin: int
    num_steps_vllm: int
    num_compared: int  # min of the two step counts
    num_identical: int  # steps (of the compared) identical in every field
    first_divergence: StepDiff | None  # None: every compared step identical
    #: steps first_divergence-context .. first_divergence, as (twin, vllm) records
    context: list[tuple["StepRecord | None", "StepRecord | None"]]
    counter_diffs: dict[str, tuple[float, float]]  # counters that differ
    request_diffs: dict[str, int]  # per-request field -> number of requests that differ
    twin_wall_s: float  # the twin's replay loop
    vllm_wall_s: float  # the driver's replay loop (vLLM imports and construction excluded)
    vllm_total_s: float = math.nan  # the whole vllm-core run, driver start-up included
    #: steps whose KV-usage gauge at update both sides recorded (and so were compared)
    num_gauge_compared: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        """100% parity: same number of steps, every step identical, same counters."""
        return (self.first_divergence is None and self.num_steps_twin == self.num_steps_vllm
                and not self.counter_diffs and not self.request_diffs)

    @property
    def identical_pct(self) -> float:
        """Identical steps over the longer side's step count, in percent."""
        n = max(self.num_steps_twin, self.num_steps_vllm)
        return 100.0 * self.num_identical / n if n else 100.0

    @property
    def speed_ratio(self) -> float:
        """How many times faster the twin replays than vLLM's scheduler (loop vs loop)."""
        return self.vllm_wall_s / self.twin_wall_s if self.twin_wall_s > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        def rec(r: "StepRecord | None") -> dict[str, Any] | None:
            if r is None:
                return None
            return {f: getattr(r, f) for f in ("step",) + STEP_FIELDS}

        fd = self.first_divergence
        return {
            "identical": self.identical,
            "num_steps_twin": self.num_steps_twin,
            "num_steps_vllm": self.num_steps_vllm,
            "num_compared": self.num_compared,
            "num_identical": self.num_identical,
            "identical_pct": self.identical_pct,
            "num_gauge_compared": self.num_gauge_compared,
            "first_divergence": None if fd is None else {
                "step": fd.step,
                "fields": {k: {"twin": a, "vllm": b} for k, (a, b) in fd.fields.items()}},
            "context": [{"twin": rec(a), "vllm": rec(b)} for a, b in self.context],
            "counter_diffs": {k: {"twin": a, "vllm": b} for k, (a, b) in
                              self.counter_diffs.items()},
            "request_diffs": self.request_diffs,
            "twin_wall_s": self.twin_wall_s,
            "vllm_wall_s": self.vllm_wall_s,
            "vllm_total_s": self.vllm_total_s,
            "speed_ratio": self.speed_ratio,
            "notes": self.notes,
        }

    def format_text(self) -> str:
        """A human-readable report: summary, first divergence with context."""
        lines = [
            f"steps compared: {self.num_compared} (twin {self.num_steps_twin}, "
            f"vllm-core {self.num_steps_vllm}); identical: {self.num_identical} "
            f"({self.identical_pct:.2f}%)",
            f"parity: {'100% - every step identical' if self.identical else 'NO'}",
            f"KV-usage gauge at update compared on {self.num_gauge_compared} of "
            f"{self.num_compared} steps",
        ]
        if self.first_divergence is not None:
            fd = self.first_divergence
            lines.append(f"first divergence at step {fd.step}:")
            for name, (a, b) in fd.fields.items():
                lines.append(f"  {name}: twin={_short(a)}  vllm={_short(b)}")
            lines.append("context (twin / vllm):")
            for a, b in self.context:
                for side, r in (("twin", a), ("vllm", b)):
                    lines.append(f"  {side} {_fmt_step(r)}")
        for name, (a, b) in self.counter_diffs.items():
            lines.append(f"counter {name}: twin={a:g} vllm={b:g}")
        for name, n in self.request_diffs.items():
            lines.append(f"requests whose {name} differs: {n}")
        lines.append(f"speed: twin {self.twin_wall_s:.3f}s, vllm-core {self.vllm_wall_s:.3f}s "
                     f"(loop; {self.vllm_total_s:.1f}s with start-up) -> twin "
                     f"{self.speed_ratio:.1f}x faster")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _fmt_step(r: "StepRecord | None") -> str:
    if r is None:
        return "(no step)"
    sched = " ".join(f"{k}:{v}" for k, v in r.num_scheduled_tokens.items())
    extra = ""
    if r.preempted:
        extra += f" preempted={list(r.preempted)}"
    if r.cached_tokens:
        extra += f" admitted(hit)={r.cached_tokens}"
    gauge = "" if r.kv_usage_at_update is None else f" gauge@update={r.kv_usage_at_update:.4f}"
    return (f"step {r.step} t={r.start_s:.6f} usage={r.kv_usage:.4f}{gauge} run={r.num_running} "
            f"wait={r.num_waiting} [{_short(sched, 200)}]{extra}")


def _close(a: float, b: float, rel: float) -> bool:
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def diff_step(a: "StepRecord", b: "StepRecord", *, rel_tol: float = 1e-9
              ) -> dict[str, tuple[Any, Any]]:
    """Fields of two step records that differ (order matters for scheduled and preempted).

    ``kv_usage_at_update`` is compared when both records carry it (None: that side did
    not record the gauge; :func:`compare_steps` counts the steps compared)."""
    out: dict[str, tuple[Any, Any]] = {}
    if list(a.num_scheduled_tokens.items()) != list(b.num_scheduled_tokens.items()):
        out["num_scheduled_tokens"] = (a.num_scheduled_tokens, b.num_scheduled_tokens)
    if tuple(a.preempted) != tuple(b.preempted):
        out["preempted"] = (a.preempted, b.preempted)
    if dict(a.cached_tokens) != dict(b.cached_tokens):
        out["cached_tokens"] = (a.cached_tokens, b.cached_tokens)
    if tuple(a.waiting_for_kv) != tuple(b.waiting_for_kv):
        out["waiting_for_kv"] = (a.waiting_for_kv, b.waiting_for_kv)
    for name in ("kv_usage", "start_s", "duration_s"):
        x, y = float(getattr(a, name)), float(getattr(b, name))
        if not _close(x, y, rel_tol):
            out[name] = (x, y)
    ga, gb = a.kv_usage_at_update, b.kv_usage_at_update
    if ga is not None and gb is not None and not _close(float(ga), float(gb), rel_tol):
        out["kv_usage_at_update"] = (float(ga), float(gb))
    for name in ("num_running", "num_waiting"):
        if getattr(a, name) != getattr(b, name):
            out[name] = (getattr(a, name), getattr(b, name))
    return out


def compare_steps(twin: "ReplayResult", vllm: "ReplayResult", *, context: int = 3,
                  rel_tol: float = 1e-9) -> ParityReport:
    """Compare two replays recorded with ``record_steps``; see the module docstring."""
    if twin.steps is None or vllm.steps is None:
        raise ValueError("both replays must record steps (SimOptions(record_steps=True))")
    ta, va = twin.steps, vllm.steps
    n = min(len(ta), len(va))
    identical = 0
    gauged = 0
    first: StepDiff | None = None
    for i in range(n):
        gauged += ta[i].kv_usage_at_update is not None and va[i].kv_usage_at_update is not None
        d = diff_step(ta[i], va[i], rel_tol=rel_tol)
        if d:
            if first is None:
                first = StepDiff(step=i, fields=d)
        else:
            identical += 1
    if first is None and len(ta) != len(va):
        i = n
        first = StepDiff(step=i, fields={"step": ("present" if i < len(ta) else "absent",
                                                  "present" if i < len(va) else "absent")})
    ctx: list[tuple[Any, Any]] = []
    if first is not None:
        for i in range(max(0, first.step - context), first.step + 1):
            ctx.append((ta[i] if i < len(ta) else None, va[i] if i < len(va) else None))
    counters = {}
    for name in COUNTERS:
        x = float(twin.counters.get(name, math.nan))
        y = float(vllm.counters.get(name, math.nan))
        if not (math.isnan(x) or math.isnan(y)) and x != y:
            counters[name] = (x, y)
    return ParityReport(
        num_steps_twin=len(ta), num_steps_vllm=len(va), num_compared=n,
        num_identical=identical, first_divergence=first, context=ctx,
        counter_diffs=counters, request_diffs=_request_diffs(twin, vllm, rel_tol),
        twin_wall_s=float(twin.wall_s), vllm_wall_s=float(vllm.wall_s),
        num_gauge_compared=gauged)


def _activity(result: "ReplayResult") -> str:
    """What the replay exercised (a parity check on a trace that never preempts proves less)."""
    c = result.counters
    return (f"vllm-core: {c.get('num_steps', 0):.0f} steps, {c.get('preemptions', 0):.0f} "
            f"preemptions, {c.get('cache_aware_reorders', 0):.0f} cache-aware reorders, prefix "
            f"hits {c.get('prefix_cache_hits', 0):.0f}/{c.get('prefix_cache_queries', 0):.0f} "
            f"tokens, {c.get('num_finished', 0):.0f}/{c.get('num_requests', 0):.0f} finished")


def _request_diffs(twin: "ReplayResult", vllm: "ReplayResult", rel_tol: float
                   ) -> dict[str, int]:
    other = {r.request_id: r for r in vllm.requests}
    diffs: dict[str, int] = {}

    def bump(name: str) -> None:
        diffs[name] = diffs.get(name, 0) + 1

    for a in twin.requests:
        b = other.get(a.request_id)
        if b is None:
            bump("presence")
            continue
        for name in ("output_len", "num_cached_tokens", "num_preemptions", "status"):
            if getattr(a, name) != getattr(b, name):
                bump(name)
        for name in ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s"):
            x, y = float(getattr(a, name)), float(getattr(b, name))
            if not ((math.isnan(x) and math.isnan(y)) or _close(x, y, rel_tol)):
                bump(name)
    if len(other) != len(twin.requests):
        diffs["presence"] = diffs.get("presence", 0) + abs(len(other) - len(twin.requests))
    return diffs


def run_parity(trace: Any, settings: Any = None, *, vllm_python: str | None = None,
               target: Any = None, load: Any = None, options: Any = None,
               hash_block_size: int | None = None, model_dir: str | None = None,
               context: int = 3) -> tuple[ParityReport, "ReplayResult", "ReplayResult"]:
    """Replay ``trace`` on the twin and on vLLM's scheduler and compare step by step.

    ``options`` are the twin's (``record_steps`` is forced on). Against vLLM 0.32 pass
    ``SimOptions(prefill_interval_mode="off")``: 0.32 has no single-engine cadence.

    Returns:
        (report, twin result, vllm-core result).
    """
    case = ParityCase(name="", trace=trace, settings=settings, target=target, load=load,
                      options=options, hash_block_size=hash_block_size)
    return run_parity_many([case], vllm_python=vllm_python, model_dir=model_dir,
                           context=context)[0]


@dataclass(frozen=True)
class ParityCase:
    """One replay to check: a trace (or requests) under settings, target, load, options."""

    name: str
    trace: Any
    settings: Any = None
    target: Any = None
    load: Any = None
    options: Any = None  # the twin's SimOptions (record_steps is forced on)
    hash_block_size: int | None = None
    #: vLLM's ``--scheduler-cls`` for the vllm-core side (``VllmCoreBackend``); None: the
    #: class vLLM resolves (the plugin's with the cache-aware window on)
    scheduler_cls: str | None = None


def run_parity_many(cases: "list[ParityCase]", *, vllm_python: str | None = None,
                    model_dir: str | None = None, context: int = 3,
                    timeout_s: float | None = None
                    ) -> list[tuple[ParityReport, "ReplayResult", "ReplayResult"]]:
    """:func:`run_parity` for several cases with one vLLM driver process (one vLLM import).

    Both sides of a case come through ``tuner.replay.prepare`` (trace loading, target
    resolution, the scheduling mode, settings defaults and validation, re-blocking): the
    twin runs at once, the vLLM-side jobs run together in one driver.

    Returns:
        One (report, twin result, vllm-core result) per case, in order.
    """
    from tuner.replay import prepare
    from tuner.sim.settings import SimOptions
    from tuner.perf.target import Target
    from tuner.vllm_core.backend import run_driver

    backend_kw: dict[str, Any] = {"vllm_python": vllm_python}
    if model_dir is not None:
        backend_kw["model_dir"] = model_dir
    twins, jobs, modes = [], [], []
    python = ""
    for case in cases:
        options = replace(case.options or SimOptions(), record_steps=True)
        common = dict(target=case.target or Target(), load=case.load,
                      hash_block_size=case.hash_block_size)
        twin = prepare(case.trace, case.settings, backend="sim", options=options, **common)
        try:
            twins.append(twin.run())
        finally:
            twin.close()
        extra = {} if case.scheduler_cls is None else {"scheduler_cls": case.scheduler_cls}
        vllm = prepare(case.trace, case.settings, backend="vllm-core",
                       options=replace(options, prefill_interval_mode="local"), **common,
                       **backend_kw, **extra)
        jobs.append(vllm.job)
        python = vllm.vllm_python
        vllm.close()
        modes.append(bool(vllm.job["async_scheduling"]))  # resolved by prepare
    t0 = time.perf_counter()
    results = run_driver(jobs, python, timeout_s=timeout_s) if jobs else []
    total = time.perf_counter() - t0
    reports = []
    for case, twin_result, vllm_result, mode in zip(cases, twins, results, modes):
        report = compare_steps(twin_result, vllm_result, context=context)
        report.vllm_total_s = total / len(jobs)
        note = vllm_result.notes[0] if vllm_result.notes else ""
        report.notes.append(f"case {case.name}; {note}" if case.name else note)
        report.notes.append(_activity(vllm_result))
        options = case.options or SimOptions()
        report.notes.append("async scheduling (batch queue of depth 2)" if mode
                            else "no async scheduling")
        if options.prefill_interval_mode != "local":
            report.notes.append(
                f"twin ran with prefill_interval_mode={options.prefill_interval_mode!r}")
        reports.append((report, twin_result, vllm_result))
    return reports


__all__ = ["ParityCase", "ParityReport", "StepDiff", "STEP_FIELDS", "compare_steps",
           "diff_step", "run_parity", "run_parity_many"]
