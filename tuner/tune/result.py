"""``TuneResult``: what a tuning run found.

The result keeps both windows apart: ``metrics`` of a point are on the training window
(what the search ranked on), ``holdout`` on the later held-out window (never used to
rank). ``tuner.profile.profile_of`` writes both into a profile, with the deltas against
the baseline; the study itself never builds a profile (``tuner.profile`` is downstream).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from tuner.tune.deployment_space import DEPLOYMENT_KEY, scheduler_part
from tuner.tune.evaluate import Windows
from tuner.tune.objectives import Constraint, Objective
from tuner.tune.overload import OverloadReport
from tuner.tune.select import (TTFT_KEYS, PickRule, Point, Selection, check, trade_off,
                               ttft_guard_applies)
from tuner.tune.space import GPU_SPLIT, PD_LAYOUT, SearchSpace, is_deployment_param
from tuner.units import FRONT, cell

if TYPE_CHECKING:
    from rich.table import Table
    from tuner.tune.kv_tier_space import KvTierGain
    from tuner.tune.pd_verdict import PDVerdict
    from tuner.tune.spec_space import SpecGain

    from tuner.tune.robust import RobustReport

#: Metrics copied into a profile's ``predicted`` section (objectives/constraints are added).
PROFILE_METRICS = ("p90_interactivity", "output_throughput_per_gpu", "total_throughput_per_gpu",
                   "prefix_cache_hit_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s",
                   "tpot_p90_s", "itl_p99_s", "preemptions", "kv_usage_mean", "queue_depth_mean",
                   "num_finished", "num_requests", "num_rejected")


def delta_pct(tuned: float | None, base: float | None) -> float | None:
    """``(tuned - base) / base`` in percent, rounded to 0.01; None if undefined."""
    if tuned is None or base is None or not (math.isfinite(tuned) and math.isfinite(base)) \
            or base == 0:
        return None
    return round((tuned - base) / abs(base) * 100.0, 2)


@dataclass(slots=True)
class TuneResult:
    """The outcome of :func:`tuner.tune.tune` (see the study module for the stages)."""

    study_name: str
    storage: str | None  # redacted URL or journal path; None = in memory
    config_attrs: dict[str, Any]  # the StudyConfig as stored in the study
    space: SearchSpace
    objectives: tuple[Objective, ...]
    constraints: tuple[Constraint, ...]
    windows: Windows
    baseline: Point  # vLLM's defaults, on the training window (+ holdout)
    selection: Selection  # the recommended point and the rule that picked it
    front: list[Point]  # stage-2 Pareto front (training window), holdout filled
    stage2: list[Point]  # every point replayed on the training window
    n_complete: int  # stage-1 trials that finished
    n_refused: int  # stage-1 trials refused before running (vLLM would reject them)
    n_pruned: int  # refused + undefined objective
    n_failed: int  # crashed or left by a dead process
    n_infeasible: int  # completed stage-1 points violating a constraint
    prefer: str
    seed: int
    wall_s: float
    notes: list[str] = field(default_factory=list)
    evaluator_spec: dict[str, Any] = field(default_factory=dict)
    num_gpus: int = 1
    block_size: int | None = None
    timings: dict[str, float] = field(default_factory=dict)  # stage1_s, stage2_s, holdout_s
    #: pruned stage-1 trials whose replay stopped once it proved a constraint violated
    #: (tuner.tune.early_stop); also counted in ``n_pruned``
    n_stopped: int = 0
    rule: PickRule = PickRule()
    overload: OverloadReport | None = None  # set when the baseline cannot keep up
    max_model_len: int | None = None  # what the twin admitted (the target's resolved value)
    #: the pick re-checked under clock variants (None: a result made before the check)
    robust: "RobustReport | None" = None
    #: the pick against itself with speculative decoding toggled (tuner.tune.spec_space;
    #: None: the study has no speculative decoding)
    spec_gain: "SpecGain | None" = None
    #: the pick against itself with the CPU KV tier toggled (tuner.tune.kv_tier_space;
    #: None: the study searches no tier size)
    kv_tier_gain: "KvTierGain | None" = None
    #: whether disaggregation wins, by how much, and the knee ratio (tuner.tune.pd_space;
    #: None: --disaggregated off, or no P/D point was measured)
    pd_verdict: "PDVerdict | None" = None

    @property
    def recommended(self) -> Point:
        return self.selection.point

    def comparison(self, window: str = "train") -> dict[str, dict[str, Any]]:
        """``{"baseline": {...}, "tuned": {...}, "delta_pct": {...}}`` on ``window``."""
        keys = list(dict.fromkeys(list(PROFILE_METRICS) + [o.key for o in self.objectives]
                                  + [c.key for c in self.constraints]))
        base = self.baseline.metrics if window == "train" else (self.baseline.holdout or {})
        tuned = (self.recommended.metrics if window == "train"
                 else (self.recommended.holdout or {}))
        return {
            "baseline": {k: base.get(k) for k in keys if k in base},
            "tuned": {k: tuned.get(k) for k in keys if k in tuned},
            "delta_pct": {k: delta_pct(tuned.get(k), base.get(k)) for k in keys
                          if isinstance(tuned.get(k), (int, float))
                          and isinstance(base.get(k), (int, float))},
        }

    def confirms(self) -> dict[str, Any]:
        """Whether the pick holds on each window: it satisfies every constraint (and the
        TTFT guard) and beats the baseline by the rule (a positive score: what it gains is
        worth what it gives up). ``failed`` lists, per window, what does not hold."""
        from tuner.tune.select import score

        guard = ttft_guard_applies(self.rule, self.objectives, self.constraints)
        failed: dict[str, list[str]] = {}

        def verdict(window: str) -> bool | None:
            p, b = self.recommended, self.baseline
            mine = p.metrics if window == "train" else p.holdout
            base = b.metrics if window == "train" else b.holdout
            if not mine:
                return None
            fails = check(mine, base, self.constraints, self.rule,
                          guard and not p.is_baseline)
            if p.is_baseline:
                fails.append("the pick is the baseline itself")
            else:
                win = Point(p.number, p.params, p.settings, mine)
                ref = Point(b.number, b.params, b.settings, base or {})
                if not score(win, ref, self.objectives, self.rule) > 0:
                    fails.append("does not beat the baseline under the rule")
            failed[window] = fails
            return not fails

        out: dict[str, Any] = {"train": verdict("train"),
                               "holdout": verdict("holdout") if self.windows.has_holdout
                               else None}
        out["failed"] = failed
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON form for ``tuner tune --json``."""
        return {
            "study": self.study_name, "storage": self.storage,
            "space": self.space.name, "objectives": [str(o) for o in self.objectives],
            "constraints": [str(c) for c in self.constraints], "prefer": self.prefer,
            "windows": self.windows.to_dict(),
            "trials": {"complete": self.n_complete, "refused": self.n_refused,
                       "pruned": self.n_pruned, "stopped": self.n_stopped,
                       "failed": self.n_failed,
                       "infeasible": self.n_infeasible, "stage2": len(self.stage2)},
            "recommended": {"trial": self.recommended.number,
                            "is_baseline": self.recommended.is_baseline,
                            "params": self.recommended.params,
                            "settings": scheduler_part(self.recommended.settings),
                            "deployment": self.deployment_of(self.recommended),
                            "rule": self.selection.rule, "reason": self.selection.reason},
            "baseline": {"trial": self.baseline.number,
                         "settings": scheduler_part(self.baseline.settings),
                         "deployment": self.deployment_of(self.baseline)},
            "train": self.comparison("train"),
            "holdout": self.comparison("holdout") if self.windows.has_holdout else None,
            "confirms": self.confirms(),
            "runner_ups": [{"trial": p.number, "trade_off": trade_off(p, self.recommended,
                                                                     self.objectives)}
                           for p in self.selection.runner_ups],
            "skipped": list(self.selection.skipped),
            "excluded": [{"trial": p.number, "why": why,
                          "trade_off": trade_off(p, self.recommended, self.objectives)}
                         for p, why in self.selection.excluded],
            "overload": None if self.overload is None else self.overload.to_dict(),
            "robust": None if self.robust is None else self.robust.to_dict(self.objectives),
            "front": [_point_dict(p, self.objectives) for p in self.front],
            "notes": self.notes, "wall_s": round(self.wall_s, 3), "seed": self.seed,
            "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
            **({} if self.spec_gain is None
               else {"speculative_gain": self.spec_gain.to_dict()}),
            **({} if self.kv_tier_gain is None
               else {"kv_tier_gain": self.kv_tier_gain.to_dict()}),
            **({} if self.pd_verdict is None
               else {"disaggregation": self.pd_verdict.to_dict()}),
        }

    def deployment_of(self, point: Point) -> dict[str, Any]:
        """The deployment ``point`` ran on (Deployment.to_dict form): its own when the
        study searched one, else the target's."""
        own = point.settings.get(DEPLOYMENT_KEY)
        if own is not None:
            return dict(own)
        target = self.evaluator_spec.get("target", {})
        return {"tp": int(target.get("tp", 1)), "dp": int(target.get("dp", 1)),
                "replicas": int(target.get("replicas", 1)),
                "enable_expert_parallel": bool(target.get("enable_expert_parallel", False)),
                "router": self.evaluator_spec.get("router")}

    def front_table(self) -> "Table":
        """The Pareto front (training window, held-out beside it) as a rich table."""
        from rich.table import Table

        table = Table(title=f"Pareto front of {self.study_name} (train window; held-out in "
                            "brackets)")
        table.add_column("trial", justify="right")
        for p in self.space.names:
            table.add_column(_COLUMN.get(p, p), justify="right")
        extra = [k for k in TTFT_KEYS if k not in {o.key for o in self.objectives}]
        for key in [o.key for o in self.objectives] + extra:
            table.add_column(_COLUMN.get(key, key), justify="right")
        table.add_column(f"likely {_COLUMN.get(self.objectives[0].key, self.objectives[0].key)}",
                         justify="right")  # the first objective's error band (train)
        table.add_column("")
        rows = list(self.front)
        if all(p is not self.baseline for p in rows):
            rows.append(self.baseline)
        for p in rows:
            mark = ("baseline" if p.is_baseline else "") + (
                " <- recommended" if p is self.recommended else "")
            cells = [str(p.number)] + [_fmt(_coordinate(p, n)) for n in self.space.names]
            for key in [o.key for o in self.objectives] + extra:
                held = (p.holdout or {}).get(key)
                cells.append(f"{_fmt(p.metrics.get(key))} [{_fmt(held)}]")
            cells.append(self.likely_text(p, self.objectives[0].key))
            table.add_row(*cells, mark.strip())
        return table

    def likely(self, point: Point, keys: Sequence[str],
               window: str = "train") -> dict[str, list[float]]:
        """``{key: [low, high]}``: the error band of each of ``keys`` for ``point``
        (:mod:`tuner.metrics.bands`; narrowed when the target has a calibration file)."""
        from tuner.metrics.bands import metrics_likely

        values = point.metrics if window == "train" else (point.holdout or {})
        return metrics_likely(values, list(keys), self._calibration())

    def band_record(self, point: Point) -> dict[str, Any]:
        """The profile's ``predicted.bands``: the tuned point's likely range per reported
        metric on each window, and how the bands were made."""
        from tuner.metrics.bands import bands_from_keys

        keys = list(dict.fromkeys(list(PROFILE_METRICS) + [o.key for o in self.objectives]))
        pb = bands_from_keys(point.metrics, self._calibration())
        if pb is None:
            return {}
        out: dict[str, Any] = {"regime": pb.regime, "family": pb.family,
                               "calibrated": pb.calibrated, "note": pb.note,
                               "train": self.likely(point, keys)}
        if self.windows.has_holdout:
            out["holdout"] = self.likely(point, keys, "holdout")
        return out

    def _calibration(self) -> str | None:
        """The target's calibration file (it narrows the bands), if any."""
        return self.evaluator_spec.get("target", {}).get("calibration")

    def likely_text(self, point: Point, key: str) -> str:
        """``1.4-2.8`` (the front table's band cell; ``-`` without a band)."""
        r = self.likely(point, [key]).get(key)
        return "-" if r is None else f"{_fmt(r[0])}-{_fmt(r[1])}"


#: Short column titles (the JSON output and profiles keep the full names).
_COLUMN = {"cache_aware_admission_window": "window", "cache_aware_admission_threshold": "threshold",
           "prefill_schedule_interval": "prefill every", "max_num_batched_tokens": "tokens/step",
           "max_num_seqs": "max seqs", "long_prefill_token_threshold": "long prefill",
           "scheduler_reserve_full_isl": "full ISL", "p90_interactivity": "p90 tok/s/user",
           "gpu_split": "GPU split", "router.policy": "router",
           "router.overlap_weight": "overlap weight", "router.load_metric": "load metric",
           "output_throughput_per_gpu": "out tok/s/GPU", "ttft_p50_s": "TTFT p50 s",
           "ttft_p90_s": "TTFT p90 s", "goodput": "goodput req/s",
           "kv_offloading.size": "CPU tier GiB", "kv_offloading.eviction_policy": "tier policy",
           "pd.mode": "P/D", "pd.layout": "P/D layout", "pd.router": "P/D proxy"}


def _coordinate(p: Point, name: str) -> Any:
    """A point's value of space parameter ``name`` (scheduler field or deployment); a
    split in the table's short form (``TP2/DP1/R4``, ``+EP``) so the row fits."""
    if name == GPU_SPLIT:
        own = p.settings.get(DEPLOYMENT_KEY)
        if own is None:
            return p.params.get(name)
        if own.get("pd") is not None:  # a P/D point has pools, not a split (pd.layout)
            return None
        return (f"TP{own['tp']}/DP{own['dp']}/R{own['replicas']}"
                + ("+EP" if own.get("enable_expert_parallel") else ""))
    if name == PD_LAYOUT and p.params.get(name) is not None:  # 1:3 p8/d4
        counts, p_tp, d_tp = str(p.params[name]).split(",")
        return f"{counts} p{p_tp.split('=')[1]}/d{d_tp.split('=')[1]}"
    if is_deployment_param(name):
        return p.params.get(name)
    return p.settings.get(name)


def _fmt(value: Any) -> str:
    return cell(value, FRONT)


def _point_dict(p: Point, objectives: Sequence[Objective]) -> dict[str, Any]:
    own = {"deployment": p.settings[DEPLOYMENT_KEY]} if DEPLOYMENT_KEY in p.settings else {}
    return {"trial": p.number, "baseline": p.is_baseline, "params": p.params, **own,
            "train": {o.key: p.metrics.get(o.key) for o in objectives},
            "holdout": {o.key: p.holdout.get(o.key) for o in objectives} if p.holdout else None}
