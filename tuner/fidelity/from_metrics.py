"""``tuner calibrate --from-metrics``: fit the clock to a production server's ``/metrics``.

Most operators have a Prometheus scrape of their vLLM servers, not a benchmark. Given the
trace of a window (ingested logs) and the server's latency histograms over the same window
-- ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
``vllm:request_prefill_time_seconds``, ``vllm:request_decode_time_seconds``,
``vllm:iteration_tokens_total`` -- this fits the twin's clock so the replay of the window
reproduces them, and reports the fit per histogram.

How, in three steps:

1. **The clock's factors** (``tuner.perf.clock_variant``): the window is replayed on the
   twin and the step-time model's prefill and decode parts are scaled until the replay's
   mean prefill time (scheduled -> first token, engine side) and mean inter-token latency
   equal the server's (a fixed-point iteration: each round multiplies a factor by
   measured / replayed; the sums of a Prometheus histogram are exact, its quantiles are
   bucket interpolations). The CPU and transfer parts follow the decode factor: the
   histograms cannot tell them apart from it.
2. **The coefficients**: the scaled clock is turned into the per-kernel model's physical
   coefficients by :func:`tuner.fidelity.calibrate.fit_probes` -- the fit ``tuner
   calibrate`` runs on a live server's probes -- over probe shapes taken from the window
   (its prompt lengths, its running batches and contexts), each priced by the scaled
   clock. The result is an ordinary calibration file (``--calibration``), whose probe
   residuals narrow the error bands.
3. **The check**: the window is replayed again with that file, and each histogram's count,
   mean, p50 and p90 are printed measured / nominal twin / calibrated twin.

Inputs (:func:`read_window_metrics`): one text exposition (a dump; it counts since the
server started, so the trace must cover the same span), two text scrapes (the second
minus the first: the window between them), or one Prometheus range-query JSON export
(``/api/v1/query_range`` of the histograms' ``_bucket``/``_sum``/``_count`` series: each
series' last minus first value). It refuses, in one line, a window with fewer than
:data:`MIN_REQUESTS` requests in the histograms, metrics that saw a different number of
requests than the trace holds, and a deployment in the metrics (``vllm:cache_config_info``:
block size and KV blocks; the ``model_name`` label) that is not the target.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tuner.errors import ConfigError
from tuner.perf.clock_variant import ClockVariant
from tuner.perf.target import Target
from tuner.serve.prometheus import (CACHE_CONFIG_INFO, ExpositionError, Histogram,
                                    MetricsSnapshot, parse_exposition)
from tuner.sim.batch import StepBatch

TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
PREFILL = "vllm:request_prefill_time_seconds"
DECODE = "vllm:request_decode_time_seconds"
ITERATION_TOKENS = "vllm:iteration_tokens_total"
#: The histograms read, in the order they are reported.
WINDOW_HISTOGRAMS = (TTFT, ITL, PREFILL, DECODE, ITERATION_TOKENS)
#: The two the clock is fitted to (step 1); the others are checked.
FITTED = (PREFILL, ITL)
#: Requests the window's histograms must hold (fewer: the means are noise).
MIN_REQUESTS = 20
#: Inter-token gaps the window must hold.
MIN_GAPS = 100
#: The metrics and the trace must count the same requests within this ratio.
COUNT_RATIO = 1.25
#: Fixed-point rounds at most, and the relative error at which the fit stops.
MAX_ROUNDS = 8
TOLERANCE = 0.01
#: Refits of the coefficients at most, and the relative error of the calibrated replay's
#: fitted means at which they stop.
COEFFICIENT_ROUNDS = 3
COEFFICIENT_TOLERANCE = 0.03
#: The factors stay inside this range (a fit outside it is a wrong window, not a GPU).
FACTOR_RANGE = (0.02, 50.0)


@dataclass(slots=True)
class WindowMetrics:
    """The server's histograms over the window and what they say about the deployment."""

    histograms: dict[str, Histogram]  # name -> the window's increase
    cache_config: dict[str, str]  # vllm:cache_config_info labels (one engine's)
    model_names: set[str]  # the model_name labels seen
    span_s: float | None  # the range query's span (None: text scrapes)
    source: str  # the files, for messages and the calibration record


# --------------------------------------------------------------------------- reading
def _read_text(path: Path) -> MetricsSnapshot:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the metrics ({exc})") from None
    try:
        return parse_exposition(text)
    except ExpositionError as exc:
        # "/metrics line N: ..." -> "FILE:N: ..."
        msg = str(exc)
        if msg.startswith("/metrics line "):
            line, _, rest = msg[len("/metrics line "):].partition(": ")
            raise ConfigError(f"{path}:{line}: sample: {rest}") from None
        raise ConfigError(f"{path}: {msg}") from None


def _snapshot_of(samples: list[tuple[str, dict[str, str], float]]) -> MetricsSnapshot:
    from tuner.serve.prometheus import Sample

    snap = MetricsSnapshot()
    for name, labels, value in samples:
        snap.samples.append(Sample(name, tuple(sorted(labels.items())), value))
    return snap


def _read_range_json(path: Path, doc: Any) -> tuple[MetricsSnapshot, MetricsSnapshot, float]:
    """A range-query export as (first, last) snapshots and its span in seconds."""
    where = f"{path}"
    data = doc.get("data") if isinstance(doc, dict) else None
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        raise ConfigError(f"{where}: data.result: expected the list of a Prometheus "
                          "query_range answer ({\"data\": {\"result\": [...]}})")
    first: list[tuple[str, dict[str, str], float]] = []
    last: list[tuple[str, dict[str, str], float]] = []
    t_lo, t_hi = math.inf, -math.inf
    for i, series in enumerate(result):
        field_ = f"data.result[{i}]"
        metric = series.get("metric") if isinstance(series, dict) else None
        values = series.get("values") if isinstance(series, dict) else None
        if not isinstance(metric, dict) or not isinstance(metric.get("__name__"), str):
            raise ConfigError(f"{where}: {field_}.metric: needs a __name__ label")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: {field_}.values: expected [[time, \"value\"], ...]")
        try:
            pts = sorted((float(t), float(v)) for t, v in values)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: {field_}.values: expected [[time, \"value\"], ...] "
                              "with numbers") from None
        labels = {str(k): str(v) for k, v in metric.items() if k != "__name__"}
        first.append((metric["__name__"], labels, pts[0][1]))
        last.append((metric["__name__"], labels, pts[-1][1]))
        t_lo, t_hi = min(t_lo, pts[0][0]), max(t_hi, pts[-1][0])
    return _snapshot_of(first), _snapshot_of(last), (t_hi - t_lo if t_hi > t_lo else 0.0)


def read_window_metrics(paths: Sequence[str | os.PathLike[str]]) -> WindowMetrics:
    """The window's histograms from one text dump, two text scrapes or one JSON export."""
    files = [Path(p) for p in paths]
    if not 1 <= len(files) <= 2:
        raise ConfigError(f"--from-metrics takes one file (a text dump or a range-query JSON "
                          f"export) or two (scrapes before and after); got {len(files)}")
    source = " -> ".join(str(f) for f in files)
    span: float | None = None
    before: MetricsSnapshot | None = None
    if len(files) == 1 and files[0].suffix.lower() == ".json":
        try:
            doc = json.loads(files[0].read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{files[0]}:{exc.lineno}: JSON: {exc.msg}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{files[0]}: cannot read the metrics ({exc})") from None
        before, after, span = _read_range_json(files[0], doc)
    elif len(files) == 1:
        after = _read_text(files[0])
    else:
        before, after = _read_text(files[0]), _read_text(files[1])
    histograms: dict[str, Histogram] = {}
    for name in WINDOW_HISTOGRAMS:
        h = after.histogram(name)
        if h is None:
            continue
        d = h.minus(before.histogram(name) if before is not None else None)
        if d.count < 0:
            raise ConfigError(f"{source}: {name}: the count fell ({d.count:g}): the server "
                              "restarted between the scrapes, or they are in the wrong order")
        histograms[name] = d
    missing = [n for n in FITTED if n not in histograms]
    if missing:
        raise ConfigError(f"{files[-1]}: {missing[0]}: not in the metrics (vLLM 0.30+ exports "
                          "it; the fit needs the prefill-time and inter-token histograms)")
    info = after.labels_of(CACHE_CONFIG_INFO)
    names = {s.label("model_name") for s in after.samples if s.label("model_name")}
    return WindowMetrics(histograms, info[0] if info else {}, {n for n in names if n},
                         span, source)


# --------------------------------------------------------------------------- the twin's side
def twin_histograms(result: Any, like: dict[str, Histogram]) -> dict[str, Histogram]:
    """The replay's histograms of the window, binned at the server's bucket bounds."""
    done = [r for r in result.requests if math.isfinite(r.first_token_s)]
    values: dict[str, list[tuple[float, float]]] = {
        TTFT: [(r.first_token_s - r.arrival_s, 1.0) for r in done],
        PREFILL: [(r.first_token_s - r.first_scheduled_s, 1.0) for r in done
                  if math.isfinite(r.first_scheduled_s)],
        DECODE: [(r.finish_s - r.first_token_s, 1.0) for r in done
                 if math.isfinite(r.finish_s)],
        ITL: [(float(g), float(n)) for g, n in result.itl_samples],
    }
    out: dict[str, Histogram] = {}
    for name, pairs in values.items():
        bounds = [le for le, _ in like[name].buckets] if name in like else [math.inf]
        out[name] = _binned(pairs, bounds)
    steps = float(result.counters.get("num_steps") or 0)
    if steps > 0:
        tokens = sum(max(r.input_len - r.num_cached_tokens, 0) + r.output_len
                     for r in result.requests if math.isfinite(r.first_scheduled_s))
        out[ITERATION_TOKENS] = Histogram(((math.inf, steps),), float(tokens), steps)
    return out


def _binned(pairs: list[tuple[float, float]], bounds: list[float]) -> Histogram:
    import bisect

    bounds = sorted(set(bounds) | {math.inf})
    counts = [0.0] * len(bounds)
    total = n = 0.0
    for v, w in pairs:
        counts[bisect.bisect_left(bounds, v)] += w
        total += v * w
        n += w
    cum, acc = [], 0.0
    for c in counts:
        acc += c
        cum.append(acc)
    return Histogram(tuple(zip(bounds, cum)), total, n)


def stats_of(h: Histogram | None) -> dict[str, float | None]:
    """count, mean, p50, p90 (quantiles only where the histogram has finite buckets)."""
    if h is None:
        return {"count": None, "mean": None, "p50": None, "p90": None}
    finite = any(math.isfinite(le) for le, _ in h.buckets)
    q = (lambda x: _clean(h.quantile(x))) if finite else (lambda x: None)
    return {"count": h.count, "mean": _clean(h.mean), "p50": q(0.5), "p90": q(0.9)}


def _clean(x: float) -> float | None:
    return x if isinstance(x, float) and math.isfinite(x) else None


# --------------------------------------------------------------------------- checks
def check_window(metrics: WindowMetrics, result: Any) -> None:
    """Refuse a window too short to fit, or metrics of another window than the trace's."""
    ttft = metrics.histograms.get(TTFT) or metrics.histograms[PREFILL]
    n_metrics = ttft.count
    if n_metrics < MIN_REQUESTS:
        raise ConfigError(f"{metrics.source}: the window is too short: the metrics count "
                          f"{n_metrics:g} requests (at least {MIN_REQUESTS} needed)")
    gaps = metrics.histograms[ITL].count
    if gaps < MIN_GAPS:
        raise ConfigError(f"{metrics.source}: the window is too short: {gaps:g} inter-token "
                          f"gaps in the metrics (at least {MIN_GAPS} needed)")
    n_trace = sum(1 for r in result.requests if math.isfinite(r.first_token_s))
    ratio = n_metrics / max(n_trace, 1)
    if not 1 / COUNT_RATIO <= ratio <= COUNT_RATIO:
        raise ConfigError(f"{metrics.source}: the metrics count {n_metrics:g} requests but the "
                          f"trace window holds {n_trace}: they are not the same window (scrape "
                          "at the window's start and end, or slice the trace to the scrapes)")


def _names_of(target: Target, model: Any) -> set[str]:
    def base(text: str) -> str:
        p = Path(str(text).strip().rstrip("/"))
        if p.name == "config.json":
            p = p.parent
        return (p.stem if p.suffix in (".json", ".yaml", ".yml") else p.name).lower()

    names = {base(target.model), base(model.name)}
    hf = getattr(model, "hf_id", None) or getattr(model, "hf_name", None)
    if hf:
        names.add(base(hf))
    return names


def check_deployment(metrics: WindowMetrics, resolved: Any,
                     served_model_name: str | None = None) -> None:
    """Refuse metrics whose deployment is not the target (block size, KV blocks, model)."""
    cfg = metrics.cache_config
    cache = resolved.cache
    for key, ours, flag in (("block_size", cache.block_size, "--block-size"),
                            ("num_gpu_blocks", cache.num_gpu_blocks, "--num-gpu-blocks")):
        theirs = cfg.get(key)
        if theirs in (None, "", "None"):
            continue
        try:
            value = int(float(theirs))
        except ValueError:
            continue
        if value != int(ours):
            raise ConfigError(f"{metrics.source}: {CACHE_CONFIG_INFO}.{key} is {value} but the "
                              f"target's is {ours}: the metrics are of another deployment "
                              f"(pass {flag} {value} if it is this one)")
    if not metrics.model_names:
        return
    wanted = ({served_model_name.lower()} if served_model_name
              else _names_of(resolved.target, resolved.model))
    seen = {n.lower() for n in metrics.model_names}
    if not any(Path(n).name in wanted or n in wanted for n in seen):
        raise ConfigError(f"{metrics.source}: model_name is {sorted(metrics.model_names)[0]!r} "
                          f"but the target model is {resolved.target.model!r} (pass "
                          "--served-model-name NAME if the server serves it under that name)")


# --------------------------------------------------------------------------- the fit
@dataclass(slots=True)
class HistogramFit:
    """One histogram: the server's figures and the twin's, nominal and calibrated."""

    name: str
    measured: dict[str, float | None]
    nominal: dict[str, float | None]
    fitted: dict[str, float | None]  # under the fitted clock factors
    calibrated: dict[str, float | None] = field(default_factory=dict)  # with the file
    fitted_to: bool = False  # one of the two the clock was fitted to

    def error_pct(self, which: str = "calibrated") -> float | None:
        twin = getattr(self, which).get("mean")
        ref = self.measured.get("mean")
        if twin is None or not ref:
            return None
        return (twin - ref) / ref * 100.0

    def to_dict(self) -> dict[str, Any]:
        return {"measured": self.measured, "nominal": self.nominal, "fitted": self.fitted,
                "calibrated": self.calibrated, "fitted_to": self.fitted_to,
                "error_pct": {w: _round(self.error_pct(w)) for w in
                              ("nominal", "fitted", "calibrated")}}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


@dataclass(slots=True)
class MetricsFit:
    """What ``calibrate --from-metrics`` found."""

    factors: ClockVariant  # the fitted clock (step 1)
    rounds: list[dict[str, float]]  # per round: factors and the two errors
    histograms: list[HistogramFit]
    calibration: Any  # the Calibration to write (step 2)
    probes: list[Any]  # the probe shapes priced by the fitted clock

    def to_dict(self) -> dict[str, Any]:
        return {"factors": self.factors.to_dict(), "rounds": self.rounds,
                "histograms": {h.name: h.to_dict() for h in self.histograms},
                "coefficients": self.calibration.coefficients.to_dict()}


def _replay(trace: Any, target: Target, settings: Any) -> Any:
    from tuner import replay

    return replay.run(trace, settings, target=target)


def _mean(hists: dict[str, Histogram], name: str) -> float:
    h = hists.get(name)
    return h.mean if h is not None and h.count > 0 else math.nan


def fit_clock(trace: Any, target: Target, settings: Any, metrics: WindowMetrics, *,
              progress: Callable[[str], None] | None = None
              ) -> tuple[ClockVariant, list[dict[str, float]], Any, Any]:
    """Step 1: the prefill and decode factors that reproduce the two fitted means.

    Returns (factors, rounds, the nominal replay, the fitted replay)."""
    say = progress or (lambda _m: None)
    nominal = _replay(trace, target, settings)
    check_window(metrics, nominal)
    want_p, want_d = _mean(metrics.histograms, PREFILL), _mean(metrics.histograms, ITL)
    p = d = 1.0
    rounds: list[dict[str, float]] = []
    result = nominal
    lo, hi = FACTOR_RANGE
    for i in range(MAX_ROUNDS):
        got = twin_histograms(result, metrics.histograms)
        have_p, have_d = _mean(got, PREFILL), _mean(got, ITL)
        if not (have_p > 0 and have_d > 0):
            raise ConfigError(f"{metrics.source}: the twin's replay of the window has no "
                              "prefill or inter-token time to fit to")
        err_p, err_d = have_p / want_p - 1.0, have_d / want_d - 1.0
        rounds.append({"prefill": round(p, 4), "decode": round(d, 4),
                       "prefill_error_pct": round(100 * err_p, 2),
                       "itl_error_pct": round(100 * err_d, 2)})
        say(f"round {i + 1}: prefill x{p:.3f}, decode x{d:.3f}: prefill time "
            f"{100 * err_p:+.1f} %, inter-token latency {100 * err_d:+.1f} %")
        if abs(err_p) <= TOLERANCE and abs(err_d) <= TOLERANCE:
            break
        p = min(max(p * want_p / have_p, lo), hi)
        d = min(max(d * want_d / have_d, lo), hi)
        result = _replay(trace, _with_clock(target, p, d), settings)
    return ClockVariant(prefill=p, decode=d, cpu=d, transfer=d), rounds, nominal, result


def _with_clock(target: Target, p: float, d: float) -> Target:
    return dataclasses.replace(target, clock=ClockVariant(prefill=p, decode=d, cpu=d,
                                                          transfer=d))


def probe_shapes(trace_requests: Sequence[Any], result: Any, max_tokens: int
                 ) -> list[tuple[str, str, StepBatch]]:
    """Probe shapes from the window: lone prefills at its prompt-length quantiles, decode
    batches at its running batch sizes and contexts, mixed steps of both."""
    prompts = sorted(r.input_len for r in trace_requests) or [128]
    outs = sorted(r.output_len for r in trace_requests) or [16]

    def q(xs: list[int], f: float) -> int:
        return int(xs[min(int(f * (len(xs) - 1)), len(xs) - 1)])

    lens = sorted({max(16, min(q(prompts, f), max_tokens)) for f in (0.1, 0.5, 0.9)}
                  | {max(16, min(max_tokens, 2 * q(prompts, 0.9)))})
    ctx = max(16, q(prompts, 0.5) + q(outs, 0.5) // 2)
    running = max(1.0, _mean_running(result))
    sizes = sorted({1, max(1, int(running / 2)), max(1, int(running)), max(2, int(2 * running))})
    shapes: list[tuple[str, str, StepBatch]] = []
    for n in lens:
        shapes.append(("prefill", f"prefill P={n}", StepBatch(
            num_prefill_reqs=1, num_prefill_tokens=n, prefill_attn_pairs=n * (n + 1) / 2)))
    for b in sizes:
        for c in (max(16, ctx // 4), ctx, 4 * ctx):
            shapes.append(("decode", f"decode N={b} L={c}", StepBatch(
                num_decode_reqs=b, decode_ctx_tokens=b * c)))
    for n in lens[:2]:
        b = max(1, int(running))
        if n + b <= max_tokens:
            shapes.append(("mixed", f"mixed N={b} L={ctx} P={n}", StepBatch(
                num_prefill_reqs=1, num_prefill_tokens=n, prefill_attn_pairs=n * (n + 1) / 2,
                num_decode_reqs=b, decode_ctx_tokens=b * ctx)))
    return shapes


def _mean_running(result: Any) -> float:
    """Mean requests with a first token and no finish at each first-token time (a cheap
    stand-in for the running batch: how many decode together)."""
    events = []
    for r in result.requests:
        if math.isfinite(r.first_token_s) and math.isfinite(r.finish_s):
            events.append((r.first_token_s, 1))
            events.append((r.finish_s, -1))
    events.sort()
    live, area, t_prev = 0, 0.0, None
    for t, k in events:
        if t_prev is not None:
            area += live * (t - t_prev)
        live += k
        t_prev = t
    span = (events[-1][0] - events[0][0]) if events else 0.0
    return area / span if span > 0 else 1.0


def calibrate_from_metrics(trace: Any, target: Target, metrics: WindowMetrics, *,
                           settings: Any = None, served_model_name: str | None = None,
                           progress: Callable[[str], None] | None = None) -> MetricsFit:
    """Steps 1-3 (module docstring): the clock, the coefficients, the per-histogram check."""
    from tuner.fidelity.calibrate import Probe, fit_probes
    from tuner.perf.fit.calibration_file import save_calibration
    from tuner.perf.presets import resolve_target
    from tuner.replay import load_requests

    if target.calibration:
        raise ConfigError("--calibration with --from-metrics: the fit starts from the GPU's "
                          "own coefficients; leave --calibration out")
    resolved = resolve_target(target, scheduler_settings=settings)
    settings = settings or resolved.default_settings
    check_deployment(metrics, resolved, served_model_name)
    factors, rounds, nominal, fitted = fit_clock(trace, target, settings, metrics,
                                                 progress=progress)
    scaled = resolve_target(_with_clock(target, factors.prefill, factors.decode),
                            scheduler_settings=settings).step_time
    requests, _ = load_requests(trace)
    shapes = probe_shapes(requests, fitted, int(settings.max_num_batched_tokens))
    probes = [Probe(kind, label, batch, scaled.step_time_s(batch), 1)  # type: ignore[arg-type]
              for kind, label, batch in shapes]
    extra = {"method_from_metrics": (
        "clock factors fitted to the window's prefill-time and inter-token means, then the "
        "coefficients to probe shapes of the window priced by that clock, the probe targets "
        "corrected until the calibrated replay's means match"),
        "from_metrics": metrics.source, "clock_factors": factors.to_dict()}
    want = (_mean(metrics.histograms, PREFILL), _mean(metrics.histograms, ITL))
    for attempt in range(COEFFICIENT_ROUNDS):
        result = fit_probes(probes, hardware=target.hardware, model=target.model, tp=target.tp,
                            quantization=target.quantization,
                            kv_cache_dtype=target.kv_cache_dtype, extra_fit=extra)
        with tempfile.TemporaryDirectory(prefix="tuner-from-metrics-") as tmp:
            path = save_calibration(Path(tmp) / "calibration.yaml", result.calibration)
            calibrated = _replay(trace, dataclasses.replace(target, calibration=str(path)),
                                 settings)
        got = twin_histograms(calibrated, metrics.histograms)
        r_p, r_d = want[0] / _mean(got, PREFILL), want[1] / _mean(got, ITL)
        if say := progress:
            say(f"coefficients {attempt + 1}: calibrated replay prefill time "
                f"{100 * (1 / r_p - 1):+.1f} %, inter-token latency {100 * (1 / r_d - 1):+.1f} %")
        if max(abs(r_p - 1), abs(r_d - 1)) <= COEFFICIENT_TOLERANCE or not (
                math.isfinite(r_p) and math.isfinite(r_d)):
            break
        # the coefficients could not follow the scaled clock on every shape: move each
        # kind's targets by what the replay still misses, and refit
        scale = {"prefill": r_p, "decode": r_d, "mixed": math.sqrt(r_p * r_d)}
        probes = [dataclasses.replace(p, measured_s=p.measured_s * scale[p.kind])
                  for p in probes]
    sides = {"nominal": twin_histograms(nominal, metrics.histograms),
             "fitted": twin_histograms(fitted, metrics.histograms),
             "calibrated": twin_histograms(calibrated, metrics.histograms)}
    report = [HistogramFit(name, stats_of(metrics.histograms.get(name)),
                           stats_of(sides["nominal"].get(name)),
                           stats_of(sides["fitted"].get(name)),
                           stats_of(sides["calibrated"].get(name)), name in FITTED)
              for name in WINDOW_HISTOGRAMS if name in metrics.histograms]
    fit_record = dict(result.calibration.fit)
    fit_record["histograms"] = {h.name: h.to_dict() for h in report}
    calibration = dataclasses.replace(result.calibration, fit=fit_record)
    return MetricsFit(factors, rounds, report, calibration, probes)


# --------------------------------------------------------------------------- writing metrics
def exposition_of(hists: dict[str, Histogram], *, model_name: str = "tuner-replay",
                  cache_config: dict[str, str] | None = None) -> str:
    """Prometheus text for ``hists`` (tests and examples: metrics a replay would produce)."""
    lines: list[str] = []
    for name, h in hists.items():
        lines.append(f"# TYPE {name} histogram")
        lab = f'engine="0",model_name="{model_name}"'
        for le, c in h.buckets:
            bound = "+Inf" if math.isinf(le) else repr(float(le))
            lines.append(f'{name}_bucket{{{lab},le="{bound}"}} {c!r}')
        lines.append(f"{name}_sum{{{lab}}} {h.sum!r}")
        lines.append(f"{name}_count{{{lab}}} {h.count!r}")
    if cache_config:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(cache_config.items()))
        lines.append(f"# TYPE {CACHE_CONFIG_INFO} gauge")
        lines.append(f"{CACHE_CONFIG_INFO}{{{labels}}} 1.0")
    return "\n".join(lines) + "\n"


#: vLLM 0.32/0.33's bucket bounds (vllm/v1/metrics/loggers.py), for metrics written here.
VLLM_BUCKETS = {
    TTFT: (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
           7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, math.inf),
    ITL: (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
          10.0, 20.0, 40.0, 80.0, math.inf),
    PREFILL: (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
              120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0, math.inf),
    DECODE: (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
             120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0, math.inf),
}


def replay_metrics_text(result: Any, **kw: Any) -> str:
    """The text exposition a server would have shown for ``result``'s window."""
    like = {name: Histogram(tuple((b, 0.0) for b in bounds), 0.0, 0.0)
            for name, bounds in VLLM_BUCKETS.items()}
    return exposition_of(twin_histograms(result, like), **kw)


__all__ = ["HistogramFit", "MetricsFit", "WindowMetrics", "calibrate_from_metrics",
           "check_deployment", "check_window", "exposition_of", "fit_clock",
           "read_window_metrics", "replay_metrics_text", "stats_of", "twin_histograms"]
