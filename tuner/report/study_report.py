"""The study (or profile) report: what was searched, what was found, and the evidence.

Sections, top to bottom: definitions and the recommendation; the Pareto front on the
training window (baseline and chosen point marked) and its re-evaluation on the held-out
window; trial history; parameter importance; baseline against tuned on both windows
(TTFT and ITL distributions, prefix-hit rate, preemptions); time series from the
replays; the trace's character. Where data is missing (no storage, no trace, too few
trials) the section says so in a note instead of disappearing.
"""

from __future__ import annotations

import math
import os
import pathlib
import warnings
from typing import Any, Callable, Sequence

from tuner.report.charts import (PALETTE, Chart, PointGroup, Series, bar_chart, cdf_chart,
                                 hbar_chart, line_chart, scatter_chart)
from tuner.report.html import Figures, Note, Page, Section, Table, fmt
from tuner.report.engines import engine_section
from tuner.report.replays import WindowReplay, binned_series, replay_windows, trace_for_spec
from tuner.report.study_data import ReportData, finite, load_report_data
from tuner.tune import Objective, Point
from tuner.perf.deployment import Deployment
from tuner.tune.deployment_space import DEPLOYMENT_KEY

BASE_COLOR, TUNED_COLOR, FRONT_COLOR, CLOUD_COLOR = "#000000", "#D55E00", "#0072B2", "#9aa4ae"
#: Below this many completed trials, parameter importances are shown with a warning.
MIN_TRIALS_FOR_IMPORTANCE = 10

DEFINITIONS = (
    "p90 interactivity = 1 / (90th percentile over requests of the per-request mean "
    "inter-token latency), in tokens/s: the decode speed the slowest 10% of users get "
    "(SemiAnalysis AgentX definition). Per-request mean inter-token latency = (last token time "
    "- first token time) / (output tokens - 1). Throughput per GPU = output tokens/s divided by "
    "the GPU count (total = input + output tokens/s per GPU, named as such). Prefix-cache hit "
    "rate = cached prompt tokens / queried prompt tokens at admission, as vLLM counts it. "
    "KV usage = blocks held by live requests / usable blocks.")

_LABELS = {
    "p90_interactivity": "p90 interactivity (tokens/s)",
    "output_throughput_per_gpu": "output tokens/s per GPU",
    "total_throughput_per_gpu": "total (input+output) tokens/s per GPU",
    "ttft_p90_s": "TTFT p90 (s)", "tpot_p90_s": "TPOT p90 (s)", "itl_p99_s": "ITL p99 (s)",
    "prefix_cache_hit_rate": "prefix-cache hit rate (fraction)", "preemptions": "preemptions",
    "kv_usage_mean": "mean KV usage (fraction)", "num_finished": "finished requests",
}


def label(key: str) -> str:
    return _LABELS.get(key, key)


def _pick_axes(objectives: Sequence[Objective]) -> tuple[Objective, Objective] | None:
    """(x, y) for the front chart: throughput on x, interactivity on y when present."""
    if len(objectives) < 2:
        return None
    x = next((o for o in objectives if "throughput" in o.key), objectives[-1])
    y = next((o for o in objectives if "interactivity" in o.key and o is not x),
             next(o for o in objectives if o is not x))
    return x, y


def _xy(p: Point, x: Objective, y: Objective, holdout: bool = False) -> tuple[float, float]:
    m = (p.holdout or {}) if holdout else p.metrics
    vx, vy = m.get(x.key), m.get(y.key)
    return (float(vx) if finite(vx) else math.nan, float(vy) if finite(vy) else math.nan)


def _tip(p: Point) -> str:
    who = "baseline (vLLM defaults)" if p.is_baseline else f"trial {p.number}"
    return f"{who}: " + ", ".join(f"{k}={v}" for k, v in sorted(p.params.items()))


# --------------------------------------------------------------------------- sections


def _summary_section(data: ReportData) -> Section:
    sec = Section("Summary")
    sec.blocks.append(Note(DEFINITIONS, kind="def"))
    for n in data.notes:
        sec.blocks.append(Note(n))
    prof = data.profile
    rows: list[list[str]] = []
    if prof is not None:
        t = prof.target
        layout = prof.deployment().describe() if t.is_multi_engine or prof.router \
            else f"TP{t.tp} x DP{t.dp}"
        rows += [["profile", prof.name], ["target", f"{t.hardware}, {t.model}, {layout} "
                                                    f"({t.num_gpus} GPUs)"]]
    if data.study_name:
        rows.append(["study", f"{data.study_name} ({data.storage or 'storage not found'})"])
    if data.trials:
        states: dict[str, int] = {}
        for r in data.trials:
            states[r.state] = states.get(r.state, 0) + 1
        rows.append(["stage-1 trials", ", ".join(f"{v} {k.lower()}" for k, v in
                                                 sorted(states.items()))])
    rows.append(["stage-2 points (training window)", fmt(len(data.stage2))])
    rows.append(["selection rule", data.rule or "\u2013"])
    rows.append(["why this point", data.reason or "\u2013"])
    robust = (prof.predicted.get("robust") or {}) if prof is not None else {}
    if robust:  # the pick under clock variants (tuner.tune.robust)
        verdicts = [c.get("verdict", "") for c in robust.get("candidates") or []]
        rows.append(["robust check", robust.get("skipped") and f"skipped: {robust['skipped']}"
                     or "; ".join(v for v in verdicts if v) or "\u2013"])
    sec.blocks.append(Table(["", ""], rows))
    if data.baseline is not None and data.chosen is not None:
        deploy = [p.settings.get(DEPLOYMENT_KEY) for p in (data.baseline, data.chosen)]
        if deploy[0] is not None and deploy[1] is not None:
            base_d, chosen_d = (Deployment.from_dict(d).describe() for d in deploy)
            sec.blocks.append(Table(["", "baseline", "recommended"],
                                    [["deployment (GPU split, router)", base_d, chosen_d]],
                                    caption="The searched deployment"))
        keys = sorted((set(data.chosen.settings) | set(data.baseline.settings))
                      - {DEPLOYMENT_KEY})
        changed = [[k, fmt(data.baseline.settings.get(k)), fmt(data.chosen.settings.get(k))]
                   for k in keys if data.baseline.settings.get(k) != data.chosen.settings.get(k)]
        if changed:
            sec.blocks.append(Table(["SchedulerConfig field", "baseline (vLLM default)",
                                     "recommended"], changed,
                                    caption="Settings the recommendation changes"))
        else:
            sec.blocks.append("The recommendation keeps vLLM's defaults (the baseline).")
    return sec


def _front_section(data: ReportData) -> Section:
    sec = Section("Pareto front")
    axes = _pick_axes(data.objectives)
    if axes is None or not data.stage2:
        sec.blocks.append(Note("No Pareto chart: the study has fewer than two objectives or no "
                               "stage-2 points."))
        return sec
    x, y = axes
    front = data.front
    front_ids = {id(p) for p in front}
    others = [p for p in data.stage2 if id(p) not in front_ids and not p.is_baseline]
    groups = [PointGroup("other replayed points", [_xy(p, x, y) for p in others],
                         color=CLOUD_COLOR, tooltips=[_tip(p) for p in others]),
              PointGroup("Pareto front", [_xy(p, x, y) for p in front], color=FRONT_COLOR,
                         connect=True, tooltips=[_tip(p) for p in front])]
    # The star goes under the diamond, so both show when the baseline is recommended.
    marks: list[tuple[PointGroup, Point]] = []
    if data.chosen is not None:
        marks.append((PointGroup("recommended", [_xy(data.chosen, x, y)], color=TUNED_COLOR,
                                 marker="star", radius=12, tooltips=[_tip(data.chosen)]),
                      data.chosen))
    if data.baseline is not None:
        marks.append((PointGroup("baseline (vLLM defaults)", [_xy(data.baseline, x, y)],
                                 color=BASE_COLOR, marker="diamond", radius=6,
                                 tooltips=[_tip(data.baseline)]), data.baseline))
    charts = [scatter_chart(
        groups + [g for g, _ in marks], title="Pareto front on the training window",
        caption=f"Each point is one setting replayed on the whole training window. Up and right "
                f"is better. The blue line joins the settings no other setting beats on both "
                f"{y.key} and {x.key}; the black diamond is vLLM's defaults and the orange star "
                "the recommendation. A star up-right of the diamond improves both.",
        x_label=label(x.key), y_label=label(y.key))]
    held = [p for p in front if p.holdout]
    if held:
        hgroups = [PointGroup("Pareto front (held-out)", [_xy(p, x, y, True) for p in held],
                              color=FRONT_COLOR, hollow=True, tooltips=[_tip(p) for p in held])]
        for g, p in marks:
            if p.holdout:
                hgroups.append(PointGroup(g.label, [_xy(p, x, y, True)], color=g.color,
                                          marker=g.marker, radius=g.radius))
        charts.append(scatter_chart(
            hgroups, title="The same points on the held-out window",
            caption="The front's settings replayed on the later held-out window, which the "
                    "search never saw. If the star is still up-right of the diamond, the "
                    "improvement is not an artefact of the training window (overfitting guard).",
            x_label=label(x.key), y_label=label(y.key)))
    sec.blocks.append(Figures(charts))
    return sec


def _history_section(data: ReportData) -> Section:
    sec = Section("Trial history")
    done = [r for r in data.trials if r.state == "COMPLETE" and r.values]
    if not done:
        sec.blocks.append(Note("No completed stage-1 trials in the storage (or no storage); "
                               "no history to show."))
        return sec
    charts = []
    for i, obj in enumerate(data.objectives):
        pts = [(float(r.number), float(r.values[i])) for r in done if len(r.values or ()) > i]
        best: list[tuple[float, float]] = []
        for px, py in sorted(pts):
            if not best:
                best.append((px, py))
            else:
                prev = best[-1][1]
                better = py > prev if obj.direction == "maximize" else py < prev
                best.append((px, py if better else prev))
        base = [(float(r.number), float(r.values[i])) for r in done
                if r.role == "baseline" and len(r.values or ()) > i]
        groups = [PointGroup("trial", pts, color=FRONT_COLOR,
                             tooltips=[f"trial {int(p[0])}" for p in pts]),
                  PointGroup("best so far", best, color=TUNED_COLOR, radius=1.5, connect=True)]
        if base:
            groups.append(PointGroup("baseline trial", base, color=BASE_COLOR, marker="diamond",
                                     radius=7))
        charts.append(scatter_chart(
            groups, title=f"History: {obj.key}",
            integer_x=True,
            caption=f"Stage-1 trials in the order they ran (short screening slice of the "
                    f"training window), {obj.direction}d. The orange line is the best value so "
                    "far; a line that stops rising early means more trials would add little.",
            x_label="trial number", y_label=label(obj.key)))
    sec.blocks.append(Figures(charts))
    refused = [r for r in data.trials if r.refused]
    if refused:
        sec.blocks.append(f"{len(refused)} trial(s) were refused before replay (vLLM would "
                          f"reject the combination), e.g. trial {refused[0].number}: "
                          f"{refused[0].refused}")
    return sec


def _importance_method() -> tuple[str, Callable[[], Any]]:
    """fANOVA (seed 0) when scikit-learn is installed, else PED-ANOVA (numpy only)."""
    import importlib.util

    import optuna

    if importlib.util.find_spec("sklearn") is None:
        return "PED-ANOVA", optuna.importance.PedAnovaImportanceEvaluator
    return "fANOVA", lambda: optuna.importance.FanovaImportanceEvaluator(seed=0)


def param_importances(data: ReportData) -> tuple[dict[str, dict[str, float]], list[str]]:
    """``{objective: {param: importance}}`` and notes; the method used is stored in
    ``data.importance_method``."""
    notes: list[str] = []
    if data.study is None:
        return {}, ["No study storage: parameter importance needs the trials."]
    import optuna
    from optuna.trial import TrialState

    done = data.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    with_params = [t for t in done if t.params]
    if len(with_params) < 2:
        return {}, [f"Parameter importance needs at least 2 completed trials with sampled "
                    f"parameters; this study has {len(with_params)}."]
    if len(with_params) < MIN_TRIALS_FOR_IMPORTANCE:
        notes.append(f"Only {len(with_params)} completed trials: importances are rough; trust "
                     f"them from about {MIN_TRIALS_FOR_IMPORTANCE} trials on.")
    name, make = _importance_method()
    out: dict[str, dict[str, float]] = {}
    for i, obj in enumerate(data.objectives):
        # PED-ANOVA ranks by *low* target values; fANOVA is direction-free. Negating a
        # maximised objective is harmless for both.
        sign = -1.0 if obj.direction == "maximize" else 1.0
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # experimental-API and target warnings
                out[obj.key] = optuna.importance.get_param_importances(
                    data.study, target=lambda t, i=i, sign=sign: sign * t.values[i],
                    evaluator=make())
        except (RuntimeError, ValueError, ZeroDivisionError) as exc:
            notes.append(f"Importance for {obj.key} could not be computed: {exc}")
    data.importance_method = name
    return out, notes


def _importance_section(data: ReportData) -> Section:
    sec = Section("Parameter importance")
    imps, notes = param_importances(data)
    for n in notes:
        sec.blocks.append(Note(n))
    if imps:
        params = sorted({p for v in imps.values() for p in v})
        groups = [(k, [float(v.get(p, 0.0)) for p in params]) for k, v in imps.items()]
        sec.blocks.append(hbar_chart(
            [p.replace("cache_aware_admission_", "admission_") for p in params], groups,
            title="Which settings matter, per objective",
            caption=f"{data.importance_method} importance (optuna.importance) of each searched setting "
                    "for each objective over the stage-1 trials; each objective's bars sum to 1. "
                    "A setting near 0 barely moves that objective on this traffic.",
            x_label="importance (share of the objective's variance, 0-1)", colors=PALETTE))
    return sec


def _metric_rows(pairs: Sequence[tuple[str, dict[str, Any], dict[str, Any]]]
                 ) -> list[list[str]]:
    keys = ["p90_interactivity", "output_throughput_per_gpu", "total_throughput_per_gpu",
            "ttft_p90_s", "itl_p99_s", "prefix_cache_hit_rate", "preemptions", "kv_usage_mean",
            "num_finished"]
    rows = []
    for key in keys:
        for window, base, tuned in pairs:
            b, t = base.get(key), tuned.get(key)
            if b is None and t is None:
                continue
            delta = (f"{(t - b) / abs(b) * 100:+.1f}%" if finite(b) and finite(t) and b else
                     "\u2013")
            rows.append([label(key), window, fmt(b), fmt(t), delta])
    return rows


def _comparison_section(data: ReportData, replays: list[WindowReplay], source: str) -> Section:
    sec = Section("Baseline vs tuned")
    sec.blocks.append(Note(source))
    by = {(r.label, r.window): r for r in replays}
    pairs = []
    for window in ("train", "holdout"):
        if ("baseline", window) in by and ("tuned", window) in by:
            pairs.append((window, by["baseline", window].summary, by["tuned", window].summary))
        elif data.baseline is not None and data.chosen is not None:
            b = data.baseline.metrics if window == "train" else (data.baseline.holdout or {})
            t = data.chosen.metrics if window == "train" else (data.chosen.holdout or {})
            if b or t:
                pairs.append((window, b, t))
    if data.chosen is not None and data.chosen.is_baseline:
        sec.blocks.append(Note("The recommendation is vLLM's defaults (nothing on the front beat "
                               "the baseline under the rule), so baseline and tuned coincide."))
    if pairs:
        sec.blocks.append(Table(["metric", "window", "baseline", "tuned", "change"],
                                _metric_rows(pairs),
                                caption="Baseline (vLLM defaults) against the recommendation"))
        hit = _baseline_vs_tuned(
            pairs, "prefix_cache_hit_rate", math.nan, title="Prefix-cache hit rate",
            caption="Cached prompt tokens over queried prompt tokens at admission. "
                    "Cache-aware admission raises it by admitting requests whose "
                    "prefix is still cached before it is evicted.",
            y_label="hit rate (fraction)")
        pre = _baseline_vs_tuned(
            pairs, "preemptions", 0.0, title="Preemptions",
            caption="Requests preempted for lack of KV blocks (each one recomputes "
                    "its prefix). Fewer is better; a rise means the tuned setting "
                    "admits too much under pressure.",
            y_label="preemptions (count)")
        sec.blocks.append(Figures([hit, pre]))
    charts: list[Chart] = []
    for window in ("train", "holdout"):
        if ("baseline", window) not in by or ("tuned", window) not in by:
            continue
        b, t = by["baseline", window], by["tuned", window]
        charts.append(cdf_chart(
            [("tuned", t.ttft_s()), ("baseline", b.ttft_s())], log_x=True,
            colors=(TUNED_COLOR, BASE_COLOR), dashed=(False, True),
            title=f"TTFT distribution ({window} window)",
            caption="Fraction of requests whose time to first token is at most x. A curve "
                    "further left is faster; compare where the curves cross 0.9 for the p90.",
            x_label="time to first token (s, log scale)"))
        charts.append(cdf_chart(
            [("tuned", t.mean_itl_s()), ("baseline", b.mean_itl_s())], log_x=True,
            colors=(TUNED_COLOR, BASE_COLOR), dashed=(False, True),
            title=f"Per-request ITL distribution ({window} window)",
            caption="Fraction of requests whose mean inter-token latency is at most x. p90 "
                    "interactivity is 1 / the x where a curve reaches 0.9: further left there "
                    "means the slowest 10% of users decode faster.",
            x_label="per-request mean inter-token latency (s, log scale)"))
    if charts:
        sec.blocks.append(Figures(charts))
    return sec


def _timeseries_section(replays: list[WindowReplay]) -> Section:
    sec = Section("Time series")
    by = {(r.label, r.window): r for r in replays}
    if ("baseline", "train") not in by or ("tuned", "train") not in by:
        sec.blocks.append(Note("No replays, so no time series (the trace was not available or "
                               "--no-replay was given)."))
        return sec
    b, t = by["baseline", "train"].result, by["tuned", "train"].result
    specs = [("kv_usage", False, "KV cache usage", "KV usage (fraction of usable blocks)",
              "Share of usable KV blocks held by live requests. Near 1 the cache evicts "
              "prefixes and preempts; the admission threshold acts above its value."),
             ("num_running", False, "Running requests", "running requests (count)",
              "Requests in the running batch after each step (averaged per bin)."),
             ("num_waiting", False, "Waiting requests", "waiting requests (count)",
              "Queue depth. A queue that keeps growing means the setting cannot keep up with "
              "arrivals; TTFT grows with it."),
             ("num_scheduled_tokens", True, "Scheduled tokens per second",
              "scheduled tokens/s (prompt + output)",
              "Tokens the engine computes per second (prefill chunks plus decode), all GPUs "
              "together: the work done, not the output rate.")]
    charts = []
    for col, rate, title, ylab, cap in specs:
        bx, by_ = binned_series(b, col, rate=rate)
        tx, ty = binned_series(t, col, rate=rate)
        # Tuned first, baseline dashed on top: both stay visible where they coincide.
        charts.append(line_chart([Series("tuned", tx, ty, color=TUNED_COLOR),
                                  Series("baseline", bx, by_, color=BASE_COLOR, dashed=True)],
                                 title=f"{title} (training window)", caption=cap,
                                 x_label="replay time (s)", y_label=ylab,
                                 y_min=0.0, y_max=1.0 if col == "kv_usage" else None))
    sec.blocks.append(Figures(charts))
    return sec


# --------------------------------------------------------------------------- the page


def study_report(*, profile: str | os.PathLike[str] | None = None, study: str | None = None,
                 storage: str | None = None, trace: Any = None, replay: bool = True,
                 include_trace: bool = True,
                 on_step: Callable[[str], None] | None = None) -> Page:
    """The report page for a profile and/or a study.

    Args:
        profile: a profile YAML (names its study and storage).
        study: the study name (with ``storage``, or to pick one of several).
        storage: database URL or journal path; overrides the profile's.
        trace: the trace (path or ``Trace``); default: the path stored in the study.
        replay: replay baseline and tuned on the study's windows for distributions and
            time series (needs the trace); False = stored metrics only.
        include_trace: add the trace's character (needs the trace).
        on_step: called with a line of progress before each slow step.

    Raises:
        ConfigError, StudyNotFound, ProfileError: see :func:`load_report_data`.
    """
    say = on_step or (lambda _msg: None)
    say("loading the study")
    data = load_report_data(profile=profile, study=study, storage=storage)
    page = Page(data.title, subtitle="What the tuner searched, what it found, and the evidence "
                                     "on the training and held-out windows.")
    page.sections.append(_summary_section(data))
    page.sections.append(_front_section(data))
    page.sections.append(_history_section(data))
    page.sections.append(_importance_section(data))
    spec = data.evaluator_spec
    near = _folders_near(profile)
    the_trace, why = (trace_for_spec(spec, trace, near=near) if spec else
                      (None, "the study's trace and target are unknown (no study storage)"))
    if data.study is None:
        page.warnings.append("no study storage found: trial history, parameter importance "
                             "and the stage-1 cloud are missing (pass --storage)")
    if the_trace is None and (replay or include_trace):
        page.warnings.append(f"{why}: the per-request distributions, time series and trace "
                             "charts are missing (pass --trace)")
    replays: list[WindowReplay] = []
    if replay and the_trace is not None and data.baseline is not None and data.chosen is not None:
        settings = {"baseline": dict(data.baseline.settings),
                    "tuned": dict(data.chosen.settings)}
        replays = replay_windows(spec, the_trace, settings, on_step=say)
        source = (f"Distributions and the table below come from replaying the baseline and the "
                  f"recommended settings now through tuner.replay.run ({spec.get('backend') or 'sim'}"
                  f" backend) on the study's windows of {why}.")
    else:
        reason = ("--no-replay was given" if not replay and the_trace is not None else why)
        source = (f"Numbers below are the metrics stored by the study/profile; no replay was "
                  f"run ({reason}), so there are no per-request distributions.")
    page.sections.append(_comparison_section(data, replays, source))
    engines = engine_section(data, replays)
    if engines is not None:
        page.sections.append(engines)
    page.sections.append(_timeseries_section(replays))
    if include_trace and the_trace is not None:
        from tuner.report.trace_report import trace_sections

        say("charting the trace")
        page.sections.extend(trace_sections(the_trace.trace, name=the_trace.source,
                                            columns=the_trace.compact.columns,
                                            stats=the_trace.stats))
    elif include_trace:
        page.sections.append(Section("Trace", [Note(f"No trace charts: {why}. Pass --trace "
                                                    "to point at it.")]))
    return page


def _folders_near(profile: str | os.PathLike[str] | None) -> list[pathlib.Path]:
    """The profile's folder and its parents: where a relative trace path may resolve."""
    if profile is None:
        return []
    folder = pathlib.Path(profile).resolve().parent
    return [folder, *folder.parents]


def _baseline_vs_tuned(pairs: Sequence[tuple[str, dict[str, Any], dict[str, Any]]], key: str,
                       missing: float, *, title: str, caption: str, y_label: str) -> Chart:
    """One bar per window for baseline and tuned: metric ``key`` (``missing`` if absent)."""
    def values(side: int) -> list[float]:
        return [float(pair[side].get(key) or missing) for pair in pairs]

    return bar_chart([f"{w} window" for w, _, _ in pairs],
                     [("baseline", values(1)), ("tuned", values(2))], title=title,
                     colors=(BASE_COLOR, TUNED_COLOR), caption=caption, y_label=y_label,
                     x_label="window")
