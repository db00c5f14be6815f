"""Overload: say when no scheduler setting can help, and what deployment would.

Why: when demand stays above what the deployment finishes, the waiting queue grows for
as long as the traffic lasts, every setting's TTFT is the queueing delay, and the search
can only trade which requests starve. An operator must hear that first, with the
numbers, and the size of deployment at which the twin keeps up.

What is modelled (and what not): a larger tensor-parallel size is replayed as such (the
step-time model and the KV capacity both follow TP, up to :data:`MAX_TP` GPUs, one
node); more capacity beyond that is *replicas*: independent copies of the deployment
(its TP x DP, data-parallel ranks replayed as such) behind a load balancer with session
affinity, each replaying its own share of the sessions
(:meth:`ReplayEvaluator.evaluate_deployment`); a fleet target's own replicas are the
starting count. The DP size is kept: trading DP ranks against TP and replicas is the
study's ``--gpu-budget`` search (:mod:`tuner.tune.deployment_space`), not this one; the KV
capacity of one engine (blocks) is :mod:`tuner.perf.capacity`, a different question.

The search (:func:`find_capacity`), on the baseline settings and the training window:
for each TP from the current one up to :data:`MAX_TP` (powers of two), the smallest
replica count that keeps up (doubling, then bisection), skipping any count that cannot
beat the best GPU total found so far. A copy keeps up when :func:`overload_verdict`
finds no unbounded queue in its replay (from the ``Summary`` fields ``backlog_end``,
``queue_growth_per_s`` and ``arrival_rate``, docs/metrics.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from tuner.perf.deployment import MAX_TP  # the largest TP tried: one 8-GPU node
from tuner.sim.settings import SchedulerSettings

#: The most replicas tried per TP size.
MAX_REPLICAS = 64


def overload_verdict(metrics: dict[str, Any]) -> str | None:
    """A sentence with the numbers when the queue grows without bound, else None.

    Overloaded: at the last arrival at least 5 % of the requests (and 16) still wait for
    admission, and that backlog is sustained rather than a burst at the end: demand is at
    least 10 % above the rate the deployment finishes requests, or the fitted queue growth
    over the arrival span accounts for at least half of the backlog. No scheduler setting
    fixes that.
    """
    def num(key: str) -> float:
        v = metrics.get(key)
        return float(v) if isinstance(v, (int, float)) and v is not None else math.nan

    backlog, growth, n = num("backlog_end"), num("queue_growth_per_s"), num("num_requests")
    rate, served = num("arrival_rate"), num("request_throughput")
    if not (math.isfinite(backlog) and math.isfinite(n) and math.isfinite(rate) and rate > 0):
        return None
    if backlog < max(16.0, 0.05 * n):
        return None
    climbs = math.isfinite(growth) and growth * (n - 1) / rate >= 0.5 * backlog
    outpaced = math.isfinite(served) and rate >= 1.1 * served
    if not (climbs or outpaced):
        return None
    return (f"demand {rate:,.2f} req/s, the deployment finishes {served:,.2f} req/s: the "
            f"queue grows by {growth:,.2f} req/s to {backlog:,.0f} waiting at the last "
            f"arrival (mean {num('queue_depth_mean'):,.0f}); TTFT p50 "
            f"{num('ttft_p50_s'):,.1f} s, p90 {num('ttft_p90_s'):,.1f} s")


@dataclass(frozen=True, slots=True)
class Probe:
    """One replayed deployment size."""

    tp: int
    replicas: int
    gpus: int
    keeps_up: bool
    ttft_p50_s: float | None  # the worst copy's
    ttft_p90_s: float | None


@dataclass(slots=True)
class OverloadReport:
    """The overload finding printed first by ``tuner tune``."""

    verdict: str  # overload_verdict() of the baseline on ``window``
    tp: int  # the current deployment
    dp: int
    gpus: int
    needed: Probe | None = None  # the smallest deployment that keeps up (None: none tried did)
    probes: list[Probe] = field(default_factory=list)
    window: str = "train"  # where the baseline falls behind: "train" or "holdout"
    replicas: int = 1  # the current deployment's copies behind its router

    def message(self) -> str:
        text = (f"OVERLOADED: the deployment ({self.gpus} GPU, TP {self.tp}"
                + (f", DP {self.dp}" if self.dp > 1 else "")
                + (f", {self.replicas} replicas" if self.replicas > 1 else "")
                + ") cannot keep up on the "
                + ("training" if self.window == "train" else "held-out") + " window: "
                + self.verdict + ". No scheduler setting fixes overload; the tuned settings "
                "only choose which requests wait.")
        if not self.probes:
            return text
        if self.needed is None:
            tried = max(self.probes, key=lambda p: p.gpus)
            return text + (f" The twin still queues without bound at {tried.gpus} GPU "
                           f"(TP {tried.tp} x {tried.replicas} replicas), the largest tried.")
        n = self.needed
        return text + (f" The twin keeps up with TP {n.tp} x {n.replicas} "
                       f"replica{'s' if n.replicas > 1 else ''} = {n.gpus} GPU (TTFT p50 "
                       f"{_s(n.ttft_p50_s)}, p90 {_s(n.ttft_p90_s)}); searched "
                       f"{len(self.probes)} size{'s' if len(self.probes) != 1 else ''}: "
                       f"TP up to {MAX_TP} and replicas with "
                       "session affinity" + (f" (DP {self.dp} kept)" if self.dp > 1 else "")
                       + ".")

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "window": self.window, "tp": self.tp, "dp": self.dp,
                "replicas": self.replicas, "gpus": self.gpus,
                "needed": None if self.needed is None else _probe_dict(self.needed),
                "probes": [_probe_dict(p) for p in self.probes], "message": self.message()}


def _probe_dict(p: Probe) -> dict[str, Any]:
    return {"tp": p.tp, "replicas": p.replicas, "gpus": p.gpus, "keeps_up": p.keeps_up,
            "ttft_p50_s": p.ttft_p50_s, "ttft_p90_s": p.ttft_p90_s}


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f} s"


Deploy = Callable[[SchedulerSettings, int, int], list[dict[str, Any]]]


def find_capacity(deploy: Deploy, settings: SchedulerSettings, *, tp: int, dp: int = 1,
                  replicas: int = 1, max_tp: int = MAX_TP,
                  max_replicas: int = MAX_REPLICAS) -> tuple[Probe | None, list[Probe]]:
    """The smallest (GPU count, then fewer replicas) deployment that keeps up.

    ``deploy(settings, tp, replicas)`` returns one metrics dict per replica; ``replicas``
    is the current count at ``tp`` (known to fall behind).
    """
    probes: list[Probe] = []
    cache: dict[tuple[int, int], Probe] = {}

    def probe(t: int, r: int) -> Probe:
        if (t, r) not in cache:
            copies = deploy(settings, t, r)
            ok = bool(copies) and all(overload_verdict(m) is None for m in copies)
            cache[(t, r)] = Probe(t, r, t * r * dp, ok, _worst(copies, "ttft_p50_s"),
                                  _worst(copies, "ttft_p90_s"))
            probes.append(cache[(t, r)])
        return cache[(t, r)]

    best: Probe | None = None
    sizes = [t for t in (tp * 2 ** k for k in range(8)) if t <= max(max_tp, tp)]
    for t in sizes:
        # at most as many GPUs as the best so far (equal: fewer replicas wins, below)
        limit = max_replicas if best is None else best.gpus // (t * dp)
        if limit < 1:
            continue
        # lo: a count known to fall behind (the current deployment does); hi: the next try
        lo = replicas if t == tp else 0
        hi = max(1, 2 * lo)
        while True:
            if hi >= limit:
                hi = limit
                found = hi > lo and probe(t, hi).keeps_up
                break
            if probe(t, hi).keeps_up:
                found = True
                break
            lo, hi = hi, hi * 2
        if not found:
            continue
        while hi - lo > 1:  # bisect to the smallest count that keeps up
            mid = (lo + hi) // 2
            if probe(t, mid).keeps_up:
                hi = mid
            else:
                lo = mid
        found = cache.get((t, hi))
        if found is not None and found.keeps_up and (
                best is None or (found.gpus, found.replicas) < (best.gpus, best.replicas)):
            best = found
    return best, probes


def _worst(copies: list[dict[str, Any]], key: str) -> float | None:
    values = [float(m[key]) for m in copies if isinstance(m.get(key), (int, float))]
    return max(values) if values else None


def overload_report(evaluator: Any, baseline: Any,
                    settings: SchedulerSettings) -> OverloadReport | None:
    """The report when the baseline's replay is overloaded on the training window (or,
    failing that, the held-out window), else None.

    The capacity search runs on that window when the evaluator can replay other
    deployment sizes (``evaluate_deployment``); otherwise the report holds the verdict.
    """
    window, verdict = "train", overload_verdict(baseline.metrics)
    if verdict is None and baseline.holdout:
        window, verdict = "holdout", overload_verdict(baseline.holdout)
    if verdict is None:
        return None
    target = getattr(evaluator, "target", None)
    tp = int(getattr(target, "tp", 1))
    dp = int(getattr(target, "dp", 1))
    replicas = int(getattr(target, "replicas", 1))
    report = OverloadReport(verdict=verdict, tp=tp, dp=dp, gpus=tp * dp * replicas,
                            window=window, replicas=replicas)
    if not hasattr(evaluator, "evaluate_deployment"):
        return report

    def deploy(s: SchedulerSettings, t: int, r: int) -> list[dict[str, Any]]:
        return evaluator.evaluate_deployment(s, window, tp=t, replicas=r)

    report.needed, report.probes = find_capacity(deploy, settings, tp=tp, dp=dp,
                                                 replicas=replicas)
    return report
