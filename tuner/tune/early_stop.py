"""Stop a stage-1 replay once it has proven that the trial violates a latency constraint.

Why: on an overloaded trace most stage-1 points miss a bound like ``ttft_p90_s<=2``
by far (the bundled agentic hour: every one of 200 points, TTFT p90 21-1,000 s on the
stage-1 window), and the replay of such a point spends most of its time draining the
queue it built. A point that violates a constraint is never a survivor
(:func:`tuner.tune.survivors.pick_survivors` takes feasible points only), so once the
violation is *certain* the rest of the replay cannot change what the study recommends;
it only refines how infeasible the point is.

What is proven, and how (a percentile bound ``metric_pQ_s <= X``, ``metric`` TTFT or
end-to-end latency, on a replay of ``n`` requests measured whole):

* numpy's ``linear`` percentile of ``N`` sorted values is at least the value at rank
  ``floor((N - 1) * Q / 100)``, so it exceeds ``X`` once ``N - floor((N - 1) Q / 100)``
  values do. That count grows with ``N``, and ``N <= n`` (only requests with a first
  token, or finished ones, count), so ``k = n - floor((n - 1) Q / 100)`` requests whose
  latency exceeds ``X`` prove the violation whatever the rest do.
* a request's engine latency is final when the twin records its outcome (at its finish),
  and the summary's client-side figure (``tuner.perf.api_server``) is never lower than
  the engine's. So finished requests with latency ``> X`` are counted as they are
  recorded, and the replay stops at the ``k``-th.

The stopped trial is recorded as PRUNED with the violation's *lower bound* as its
constraint value (> 0, so Optuna's TPE ranks it among the infeasible trials): the
percentile of the finished requests' latencies, the live requests' latencies so far
(a request still waiting has waited ``now - arrival`` already) and 0 for the rest. On
the agentic hour that bound is within 0.1 % of the full replay's value for points just
over the bound and a quarter to a sixth of it for points far over (docs/tuning.md).

How it hears of outcomes: it registers an observer on the twin engine's record hook
(``TwinEngine.on_record``, ``tuner.sim.engine``), which the engine calls with each
request's trace position once its row is written, on every step path (the decode-group
fast path included). What it reads of the twin (``tuner.sim.engine.Simulator``), and
never changes: ``engine.table`` (a :class:`~tuner.records.RequestTable`; a row's
``arrival_s`` is NaN until its outcome is written), ``engine.live`` (index -> live
request with ``index``, ``arrival_s``, ``first_token_s``) and ``loop.now_s``. A backend
without them (a fleet, P/D, vLLM's core) replays to the end.
``tests/tune/test_early_stop.py`` fails when the hook is not called, and
``tests/sim/test_record_hook.py`` checks that every path calls it once per request.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tuner.records import RequestTable
from tuner.tune.objectives import Constraint

#: ``ttft_p90_s``, ``e2e_p99_s``: the per-request latency percentiles a stop can prove.
_PERCENTILE_KEY = re.compile(r"^(ttft|e2e)_p(\d+(?:\.\d+)?)_s$")


@dataclass(frozen=True, slots=True)
class StopRule:
    """``metric``'s ``q``-th percentile must stay ``<= bound`` (seconds)."""

    constraint: str  # str(Constraint): the key Optuna stores the violation under
    metric: str  # "ttft" or "e2e"
    q: float  # percentile, 0..100
    bound: float

    def needed(self, n: int) -> int:
        """Requests above ``bound`` that prove the percentile of ``n`` or fewer above it
        (one more than strictly needed where ``(n - 1) q / 100`` is an integer, so a
        rounding of numpy's rank can never make a stop wrong)."""
        return min(n, n - math.floor((n - 1) * self.q / 100.0 - 1e-9))


def stop_rules(constraints: Sequence[Constraint]) -> tuple[StopRule, ...]:
    """The constraints a replay can prove violated before it ends: upper bounds on a
    TTFT or end-to-end latency percentile."""
    rules = []
    for con in constraints:
        match = _PERCENTILE_KEY.match(con.key)
        if con.op != "<=" or match is None:
            continue
        q = float(match.group(2))
        if 0.0 <= q <= 100.0:
            rules.append(StopRule(str(con), match.group(1), q, float(con.bound)))
    return tuple(rules)


class ReplayStopped(Exception):
    """Raised out of a watched replay: ``rule`` is proven violated.

    ``lower_bound`` is a lower bound of the percentile the whole replay would have given
    (so ``lower_bound - rule.bound`` bounds the violation from below, and is > 0)."""

    def __init__(self, rule: StopRule, lower_bound: float, late: int, n: int,
                 finished: int, now_s: float) -> None:
        self.rule, self.lower_bound, self.late, self.n = rule, lower_bound, late, n
        self.finished, self.now_s = finished, now_s
        super().__init__(self.reason)

    @property
    def violation(self) -> float:
        """Optuna's constraint value for the stopped trial (a lower bound, > 0)."""
        return self.lower_bound - self.rule.bound

    @property
    def reason(self) -> str:
        r = self.rule
        return (f"{r.constraint} proven violated after {self.finished} of {self.n} requests "
                f"recorded ({self.late} with {r.metric} > {r.bound:g} s, {r.needed(self.n)} "
                f"prove it) at {self.now_s:,.0f} s of the replay; "
                f"{r.metric}_p{r.q:g} >= {self.lower_bound:,.3f} s")


class _StopWatch:
    """The observer on the twin engine's record hook: counts latencies over the rules'
    bounds as outcomes are written, and raises :class:`ReplayStopped` at the count that
    proves one violated. Reads the row the engine has just written to its table."""

    __slots__ = ("_rules", "_needed", "_late", "_n", "_sim", "_table", "_finished")

    def __init__(self, sim: Any, rules: Sequence[StopRule], n_requests: int) -> None:
        self._rules = tuple(rules)
        self._needed = [rule.needed(n_requests) for rule in rules]
        self._late = [0] * len(rules)
        self._n = n_requests
        self._sim = sim
        self._table: RequestTable = sim.engine.table
        self._finished = 0

    def __call__(self, index: int) -> None:
        table = self._table
        self._finished += 1
        arrival_s = table.arrival_s[index]
        for i, rule in enumerate(self._rules):
            end = (table.first_token_s if rule.metric == "ttft" else table.finish_s)[index]
            if end - arrival_s > rule.bound:  # NaN (no token, rejected) compares False
                self._late[i] += 1
                if self._late[i] >= self._needed[i]:
                    raise self._stopped(i)

    def _stopped(self, i: int) -> ReplayStopped:
        rule = self._rules[i]
        now = float(self._sim.loop.now_s)
        return ReplayStopped(rule, _lower_bound(self._table, rule,
                                                self._sim.engine.live.values(), now, self._n),
                             self._late[i], self._n, self._finished, now)


def _lower_bound(table: RequestTable, rule: StopRule, live: Any, now: float, n: int) -> float:
    """The rule's percentile over ``n`` values, each at most the request's final
    latency: recorded outcomes, live requests' latency so far, 0 for the rest."""
    arrival = np.frombuffer(table.arrival_s, dtype=np.float64)
    end = np.frombuffer(table.first_token_s if rule.metric == "ttft" else table.finish_s,
                        dtype=np.float64)
    done = (end - arrival)[np.isfinite(end)]
    so_far = []
    for request in live:
        if arrival[request.index] == arrival[request.index]:
            continue  # recorded already (the request being recorded now is still live)
        first = request.first_token_s
        if rule.metric == "ttft" and first == first:  # has its first token: final
            so_far.append(first - request.arrival_s)
        else:  # still waiting for it: at least the time waited
            so_far.append(max(0.0, now - request.arrival_s))
    values = np.zeros(max(n, len(done) + len(so_far)))
    values[:len(done)] = done
    values[len(done):len(done) + len(so_far)] = so_far
    return float(np.percentile(values, rule.q, method="linear"))


def watch(backend: Any, rules: Sequence[StopRule], n_requests: int) -> bool:
    """Make ``backend``'s prepared twin raise :class:`ReplayStopped` during ``run()`` as
    soon as one of ``rules`` is proven violated over its ``n_requests`` requests. False
    (nothing changed) when the backend is not a one-engine twin this module can watch,
    or its record hook is taken already."""
    if not rules or n_requests < 1:
        return False
    sim = getattr(backend, "simulator", None) if getattr(backend, "name", "") == "sim" else None
    engine, loop = getattr(sim, "engine", None), getattr(sim, "loop", None)
    if (getattr(engine, "on_record", True) is not None
            or not isinstance(getattr(engine, "table", None), RequestTable)
            or not hasattr(engine, "live") or not hasattr(loop, "now_s")):
        return False
    engine.on_record = _StopWatch(sim, rules, n_requests)
    return True


__all__ = ["ReplayStopped", "StopRule", "stop_rules", "watch"]
