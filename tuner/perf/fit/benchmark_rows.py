"""Published serving benchmarks as the twin replays them (for ``--from-benchmarks``).

A row of ``data/benchmarks/published-train.csv`` (or a user's own CSV in that layout:
``vllm bench serve`` results) names a deployment (GPU, model, precision, TP), a workload
and the figures measured. To predict the figures the twin *runs the benchmark*:

* ``closed``: ``vllm bench serve`` / InferenceX ``random`` (``--max-concurrency C``,
  request rate inf, ``--ignore-eos``): ``10 x C`` requests with input and output lengths
  drawn uniformly from ``[0.8 L, L]``, a new one issued as one finishes;
* ``offline``: ``vllm bench throughput``: every prompt queued at once, fixed lengths;
* ``batch``: ``benchmark_latency.py``: one fixed batch, fixed lengths, timed to the end.

In all three the *order of steps* does not depend on how long a step takes (a closed
loop issues on completions, an offline run has everything queued), so the twin runs
each row once on a unit clock (every step lasts 1) and records the batches; a request's
arrival, first token and finish are then step indices, and any step-time model prices
the whole benchmark with one vectorised sum (:meth:`RecordedRun.figures`). That is what
makes fitting the step-time model to benchmark figures cheap and exact.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tuner.errors import ConfigError
from tuner.perf.api_server import API_SERVER, ApiServerCost, client_ttft_s, server_load
from tuner.perf.step_time import RooflineStepTimeModel
from tuner.perf.target import Target

# API_SERVER (imported above): the API server's costs, one set shared with the replays'
# summaries; served (closed-loop) rows pay them, offline and batch runs use the ``LLM``
# class in the benchmark's own process and have no API server in the path.

DATA_DIR = Path(__file__).parents[1] / "data"
PUBLISHED_CSV = DATA_DIR / "benchmarks" / "published-train.csv"
MODEL_DIR = DATA_DIR / "models"

#: Model names in the published CSV -> bundled config (preset name or data/models file).
MODEL_NAMES: dict[str, str] = {
    "kimi-k2.5": "moonshotai--Kimi-K2.5", "llama-3.1-8b": "llama-3.1-8b",
    "qwen3.6-27b": "Qwen--Qwen3.6-27B", "llama-2-70b": "meta-llama--Llama-2-70b-hf",
    "minimax-m2.5": "MiniMaxAI--MiniMax-M2.5", "minimax-m3": "MiniMaxAI--MiniMax-M3",
    "gpt-oss-120b": "openai--gpt-oss-120b", "llama-3.1-70b": "llama-3.1-70b",
    "llama-3.3-70b": "llama-3.1-70b", "llama-3.1-405b": "meta-llama--Meta-Llama-3.1-405B",
}

#: Figures a row may report (CSV column -> how the twin's run yields it).
FIGURES = ("tok_s_gpu", "out_tok_s", "total_tok_s", "ttft_mean", "ttft_med", "tpot_mean",
           "tpot_med", "e2el_mean_s", "intvty")
#: Closed-loop runs issue 10 x C requests (InferenceX); offline runs are cut to this many
#: prompts (steady state is reached long before; the published run had 16,384).
OFFLINE_PROMPTS = 3072
SEED = 20260615
#: First vLLM release with async scheduling on by default (vLLM PR #27614, late 2025:
#: ``SchedulerConfig.async_scheduling`` None resolves to True, vllm_compat.py).
ASYNC_DEFAULT_SINCE = (0, 14)
#: First year whose ROCm software multiplied FP8 faster than BF16 on MI300X. In October
#: 2024 FP8 linears ran 1.5-2x slower than BF16, then, after AMD's fixes, "somewhat reached
#: parity" with BF16 (github.com/ROCm/TransformerEngine issue #73, 2024-10-13..16); AMD:
#: "fp8 GEMM tuning in hipblasLt library [...] should give more improvements", timeline
#: open (issue #78, 2024-10-22). The next published measurement,
#: AMD's "Measuring Max-Achievable FLOPs - Part 2" (rocm.blogs.amd.com, 2025-02-28; a
#: hipBLASLt branch for ROCm 6.5), has MI300X FP8 at 1273 TFLOPS against BF16's 708: 1.8x.
ROCM_FP8_FASTER_SINCE = "2025"


@dataclass(frozen=True, slots=True)
class BenchmarkRow:
    """One published measurement, as far as the twin needs it."""

    id: str
    series: str  # "S1", "S2b", ... (leave-one-series-out groups)
    hardware: str  # preset name
    tp: int
    model: str  # preset name or config path
    quantization: str  # vLLM --quantization ("none" = checkpoint dtype)
    kv_cache_dtype: str
    kind: str  # "closed", "offline" or "batch"
    isl: int
    osl: int
    concurrency: int  # closed: C; batch: the batch size; offline: 0
    num_prompts: int
    gpu_memory_utilization: float
    max_model_len: int
    figures: dict[str, float]  # column -> published value
    source: str = ""
    notes: str = ""
    versions: str = ""  # engine / ROCm / AITER versions the row was measured with
    async_scheduling: bool = False  # the engine ran vLLM's async scheduling (default since 0.14)
    measured: str = ""  # when (YYYY-MM), from the CSV's measured column; "" if not stated


@dataclass(frozen=True, slots=True)
class SkippedRow:
    id: str
    series: str
    reason: str


def _num(text: str) -> float | None:
    m = re.match(r"\s*([0-9][0-9,]*\.?[0-9]*)", text or "")
    return float(m.group(1).replace(",", "")) if m else None


def _quantization(prec: str) -> tuple[str, str]:
    """(``--quantization``, ``--kv-cache-dtype``) for the CSV's ``prec`` column.

    NVFP4 rows run NVIDIA's ModelOpt checkpoints, whose ``hf_quant_config.json`` sets
    ``kv_cache_quant_algo: FP8`` (25 of the 28 NVFP4 checkpoints whose configs ship in
    aiconfigurator-core); vLLM resolves ``--kv-cache-dtype auto`` to that
    (``utils/torch_utils.py`` ``resolve_kv_cache_dtype_string``, called from
    ``engine/arg_utils.py``), so their KV cache is fp8.
    """
    p = prec.lower()
    kv = "fp8" if "fp8 kv" in p else "auto"
    if "nvfp4" in p:
        return "nvfp4", "fp8"
    if "mxfp4" in p:  # includes W_MXFP4_A_MXFP6: priced as MXFP4 weights (see docs)
        return "mxfp4", kv
    if "fp8" in p:
        return "fp8", kv
    if "int4" in p:
        return "awq", kv
    if "bf16" in p or "fp16" in p:
        return "none", kv
    raise ConfigError(f"precision {prec!r} is not modelled")


def _model_ref(name: str) -> str:
    key = name.split("(")[0].strip().lower().removesuffix("-instruct")
    if key in MODEL_NAMES:
        ref = MODEL_NAMES[key]
        path = MODEL_DIR / f"{ref}.json"
        return str(path) if path.is_file() else ref
    return name.strip()


def _versions(rec: dict[str, str]) -> str:
    """``vLLM 0.20.1rc1.dev365, ROCm 7.2.2, AITER 63332f2`` from a row's columns."""
    parts = [f"{rec.get('engine') or 'vLLM'} {rec.get('engine_ver') or '(version not stated)'}"]
    text = " ".join(rec.get(k) or "" for k in ("flags", "engine_ver", "par"))
    for name in ("ROCm", "AITER"):
        m = re.search(rf"{name}\s+([0-9A-Za-z.]+)", text)
        if m and m.group(0) not in parts[0]:
            parts.append(m.group(0))
    m = re.search(r"image\s+(\S+?)[;,]?\s", text + " ")
    if m:
        parts.append(f"image {m.group(1)}")
    return ", ".join(parts)


def _async_scheduling(rec: dict[str, str]) -> bool:
    """Whether the row's vLLM ran async scheduling: by its version where stated (on by
    default from 0.14), else by its date, measured or (failing that) published: 2026 means
    a release after the switch."""
    m = re.search(r"(\d+)\.(\d+)", rec.get("engine_ver") or "")
    if m and "vllm" in (rec.get("engine") or "vllm").lower():
        return (int(m.group(1)), int(m.group(2))) >= ASYNC_DEFAULT_SINCE
    dates = re.findall(r"\b(20\d\d)-\d\d", (rec.get("measured") or "") or (rec.get("source") or ""))
    return bool(dates) and dates[-1] >= "2026"


def _measured(rec: dict[str, str]) -> str:
    """``YYYY-MM`` the row was measured (its ``measured`` column), or ""."""
    m = re.search(r"\b(20\d\d-\d\d)", rec.get("measured") or "")
    return m.group(1) if m else ""


def gemm_compute_as(vendor: str, measured: str) -> dict[str, str]:
    """``HardwareSpec.gemm_compute_as`` for a row measured at ``measured`` on a ``vendor``
    GPU: the one rule for old software. On ROCm older than :data:`ROCM_FP8_FASTER_SINCE`
    FP8 GEMMs compute at the BF16 GEMMs' rate: the BF16 peak with the BF16 ``eta_compute``
    (the tile terms stay FP8's: taking BF16's too fitted worse, docs/step-time-model.md
    kernels32), so those rows inform the BF16 compute efficiency, not today's FP8 one (pricing
    them with FP8 coefficients at the BF16 peak made the fit carry 2024's FP8 rate into
    modern FP8 deployments, above AMD's measured max-achievable; kernels32 round).

    The weight bytes stay FP8 with the FP8 kernels' ``eta_mem`` and ``t0_s`` (the weights
    stream as FP8 whatever rate the kernels multiply at). Dense per-tensor FP8 (``fp8``)
    only: that is what the evidence measured (hipBLASLt GEMMs); block-scaled and fused-MoE
    FP8 kernels of that software have no such measurement. A row without a date keeps FP8.
    """
    if vendor == "amd" and measured and measured < ROCM_FP8_FASTER_SINCE:
        return {"fp8": "bf16"}
    return {}


def load_rows(path: str | Path = PUBLISHED_CSV) -> tuple[list[BenchmarkRow], list[SkippedRow]]:
    """Rows the twin can replay, and the others with the reason.

    Rows without the workload's lengths (MLPerf: the dataset's distribution is not in
    the file), without a TP size, with ambiguous units (the AMD performance page's
    throughput table says neither output nor total) or trust grade C are skipped.

    Raises:
        ConfigError: unreadable file or a missing column (file and line).
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read benchmarks file: {exc.strerror}") from None
    reader = csv.DictReader(text.splitlines())
    needed = {"id", "series", "hw", "model", "prec", "par", "workload", "isl", "osl", "conc"}
    missing = needed - set(reader.fieldnames or [])
    if missing:
        raise ConfigError(f"{p}:1: missing column(s) {sorted(missing)}")
    rows: list[BenchmarkRow] = []
    skipped: list[SkippedRow] = []
    for line, rec in enumerate(reader, start=2):
        series = (rec["series"] or "").split()[0] if rec.get("series") else "?"
        rid = rec["id"]

        def skip(reason: str) -> None:
            skipped.append(SkippedRow(rid, series, reason))

        if (rec.get("trust") or "").strip().upper() == "C":
            skip("trust grade C")
            continue
        tp_match = re.search(r"TP\s*(\d+)", rec.get("par") or "")
        if not tp_match:
            skip("TP size not stated")
            continue
        isl, osl = _num(rec["isl"]), _num(rec["osl"])
        if not isl or not osl:
            skip("input/output lengths not in the file (dataset distribution unknown)")
            continue
        if "units ambiguous" in (rec.get("notes") or ""):
            skip("throughput units ambiguous (output or total not stated)")
            continue
        workload = (rec.get("workload") or "").lower()
        conc = _num(rec["conc"])
        if "random" in workload or "bench serve" in workload:
            kind = "closed"
        elif "offline" in (rec["conc"] or "").lower() or "throughput" in workload:
            kind = "offline"
        elif "latency" in workload and conc:
            kind = "batch"
        else:
            skip(f"workload {rec.get('workload')!r} is not a closed loop, offline run or batch")
            continue
        if kind != "offline" and not conc:
            skip("concurrency not stated")
            continue
        try:
            quant, kv = _quantization(rec["prec"])
        except ConfigError as exc:
            skip(str(exc))
            continue
        figures = {k: v for k in FIGURES
                   if (v := _num(rec.get(k) or "")) is not None and v > 0}
        if not figures:
            skip("no figure the twin predicts")
            continue
        flags = (rec.get("flags") or "") + " " + (rec.get("par") or "")
        util = re.search(r"gpu-mem(?:ory-utilization)?\s+([0-9.]+)", flags)
        mml = re.search(r"max-model-len\s+(\d+)", flags)
        n = int(_num(rec.get("n_prompts") or "") or 0)
        rows.append(BenchmarkRow(
            id=rid, series=series, hardware=rec["hw"].strip().lower(), tp=int(tp_match.group(1)),
            model=_model_ref(rec["model"]), quantization=quant, kv_cache_dtype=kv, kind=kind,
            isl=int(isl), osl=int(osl), concurrency=int(conc or 0),
            num_prompts=n or (10 * int(conc or 1) if kind == "closed" else OFFLINE_PROMPTS),
            gpu_memory_utilization=float(util.group(1)) if util else 0.90,
            max_model_len=int(mml.group(1)) if mml else int(isl) + int(osl) + 64,
            figures=figures, source=rec.get("source") or "", notes=rec.get("notes") or "",
            versions=_versions(rec), async_scheduling=_async_scheduling(rec),
            measured=_measured(rec)))
        del line
    return rows, skipped


@dataclass(slots=True)
class RecordedRun:
    """A benchmark run on the unit clock: its step batches and request step indices."""

    row: BenchmarkRow
    arrays: tuple[np.ndarray, ...]  # StepBatch counters per step (batch_arrays order)
    arrival: np.ndarray  # step index each request arrived at
    first: np.ndarray  # step index (end) of its first token
    finish: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    target: Target = field(default_factory=Target)
    resolved: Any = None  # ResolvedTarget (hardware, model spec)

    def step_periods(self, model: RooflineStepTimeModel, *,
                     async_scheduling: bool | None = None) -> np.ndarray:
        """Seconds between consecutive step ends under ``model``'s clock: CPU + GPU in a
        synchronous engine; ``max(cpu, gpu)`` under async scheduling, whose engine
        prepares step N+1 while step N runs (docs/step-time-model.md §1.3: the steady
        state of the two-clock recurrence)."""
        parts = model.terms(*self.arrays, maximum=np.maximum, minimum=np.minimum)
        total = sum(parts.values())
        if self.row.async_scheduling if async_scheduling is None else async_scheduling:
            cpu = parts["cpu"]
            total = np.maximum(cpu, total - cpu)
        return np.where(self.arrays[1] + self.arrays[2] > 0, total, 0.0)

    def figures(self, model: RooflineStepTimeModel, *, api: ApiServerCost | None = API_SERVER,
                async_scheduling: bool | None = None) -> dict[str, float]:
        """The row's figures under ``model``'s clock (client-side for served rows: the
        API server's intake and output queue, :mod:`tuner.perf.api_server`).

        ``api=None`` leaves the API server out and ``async_scheduling`` overrides the
        row's mode: the parts of the TTFT path apart (bench/calibration_fit.py).
        """
        periods = self.step_periods(model, async_scheduling=async_scheduling)
        cum = np.concatenate([[0.0], np.cumsum(periods)])
        arrival, first, finish = cum[self.arrival], cum[self.first], cum[self.finish]
        ttft = first - arrival
        tpot = (finish - first) / np.maximum(self.output_len - 1, 1)
        out: dict[str, float] = {}
        duration = float(finish.max() - arrival.min())
        if self.row.kind == "closed" and api is not None:
            load = server_load(api, self.input_len, self.output_len, duration,
                               len(self.arrays[0]))
            ttft = client_ttft_s(api, load, ttft, self.input_len,
                                 missed_step_s(periods, self.arrival))
            tpot = tpot * load.stretch
            duration *= load.stretch
        tokens_out = float(self.output_len.sum())
        tokens_all = tokens_out + float(self.input_len.sum())
        r = self.row
        out["out_tok_s"] = tokens_out / duration
        out["total_tok_s"] = tokens_all / duration
        out["tok_s_gpu"] = out["total_tok_s"] / r.tp
        out["ttft_mean"] = 1e3 * float(ttft.mean())
        out["ttft_med"] = 1e3 * float(np.median(ttft))
        out["tpot_mean"] = 1e3 * float(tpot.mean())
        out["tpot_med"] = 1e3 * float(np.median(tpot))
        out["e2el_mean_s"] = duration if r.kind == "batch" else float((finish - arrival).mean())
        out["intvty"] = 1e3 / out["tpot_med"]
        return out


def missed_step_s(periods: np.ndarray, arrival: np.ndarray) -> np.ndarray:
    """The engine step each closed-loop request cannot make: the period of the step whose
    outputs freed its slot (0 for the first ``C``, issued before any step).

    Why: the twin issues a closed loop's replacement at the end of the step that finished
    its predecessor, in time for the next ``schedule()``. A real engine core schedules its
    next step as soon as it has queued that step's outputs (vLLM 0.33.0
    ``v1/engine/core.py`` ``run_busy_loop``: ``_process_input_queue`` drains what has come
    in, then ``_process_engine_step`` puts the outputs on the output queue and the loop
    schedules again), while the replacement exists only after those outputs went through
    the API server to the client, the client's stream ended and its next coroutine sent a
    new request (``vllm bench serve``: ``limited_request_func`` holds the concurrency
    semaphore until ``request_func`` returns, ``benchmarks/serve.py``) that the server
    then parsed, tokenised and sent back over ZMQ: milliseconds against a
    microsecond turnaround in the core. So the replacement misses that schedule and
    waits out one whole step, which runs the other ``C - 1`` requests without it (the
    twin's recorded batches are kept: the moved prefill does not change the others',
    the approximation :class:`tuner.perf.api_server.ClientClock` makes for the intake).
    The step it waits out is priced as the one that just ended, its neighbour.
    """
    idx = np.asarray(arrival, dtype=np.int64) - 1
    return np.where(idx >= 0, periods[np.maximum(idx, 0)], 0.0)


class _Recorder:
    """A step-time callable that records each batch and makes every step last 1."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, ...]] = []

    def __call__(self, b: Any) -> float:
        self.rows.append((b.num_prefill_reqs, b.num_decode_reqs, b.num_prefill_tokens,
                          b.prefill_ctx_tokens, b.prefill_attn_pairs, b.decode_ctx_tokens))
        return 1.0


@dataclass(frozen=True, slots=True)
class BenchmarkRequest:
    """One random prompt of a benchmark row's run (the attributes ``Simulator`` reads)."""

    request_id: str
    arrival_s: float
    input_len: int
    output_len: int
    block_hashes: np.ndarray
    output_block_hashes: np.ndarray
    priority: int = 0
    session_id: str | None = None


def row_requests(row: BenchmarkRow, block_size: int,
                 num_prompts: int | None = None) -> tuple[list[BenchmarkRequest], int]:
    """The prompts of ``row``'s run and the number of hash ids they use: a closed loop's
    ``num_prompts`` (the row's unless given) with lengths uniform in ``[0.8 L, L]`` as
    ``vllm bench serve --random-range-ratio`` draws them (seed :data:`SEED`), a batch's
    ``concurrency`` and an offline run's (at most :data:`OFFLINE_PROMPTS`) at ``L``
    exactly. Random prompts share nothing, so every block has its own id. One place, so
    the fit's recording and anything that replays a row (bench/closed_loop_ttft.py, the
    tests) draw the same prompts."""
    n = row.num_prompts if num_prompts is None else num_prompts
    if row.kind == "closed":
        rng = np.random.default_rng(SEED)
        isl = rng.integers(int(0.8 * row.isl), row.isl + 1, n)
        osl = rng.integers(int(0.8 * row.osl), row.osl + 1, n)
    else:
        n = row.concurrency if row.kind == "batch" else min(n, OFFLINE_PROMPTS)
        isl, osl = np.full(n, row.isl), np.full(n, row.osl)
    requests, next_id = [], 0
    for i in range(n):
        nb = int(isl[i]) // block_size
        ob = (int(isl[i]) + int(osl[i])) // block_size - nb
        requests.append(BenchmarkRequest(
            f"r{i}", 0.0, int(isl[i]), int(osl[i]),
            np.arange(next_id, next_id + nb, dtype=np.int64),
            np.arange(next_id + nb, next_id + nb + ob, dtype=np.int64)))
        next_id += nb + ob
    return requests, next_id


def record(row: BenchmarkRow) -> RecordedRun:
    """Run ``row``'s benchmark through the twin once, on the unit clock."""
    from tuner.perf.presets import resolve_target
    from tuner.sim.engine import Simulator
    from tuner.sim.load import ClosedLoop, OpenLoop
    from tuner.sim.settings import CacheSettings, SimOptions

    target = Target(hardware=row.hardware, model=row.model, tp=row.tp,
                    quantization=row.quantization, kv_cache_dtype=row.kv_cache_dtype,
                    gpu_memory_utilization=row.gpu_memory_utilization,
                    max_model_len=row.max_model_len)
    resolved = resolve_target(target)
    compute_as = gemm_compute_as(resolved.hardware.vendor, row.measured)
    if compute_as:  # the row's software computed some format as another (AMD: analytic)
        hw = dataclasses.replace(resolved.hardware, gemm_compute_as=compute_as)
        resolved = dataclasses.replace(resolved, hardware=hw, step_time=RooflineStepTimeModel(
            hw, resolved.model, row.tp, resolved.step_time.coefficients))
    if row.kind == "closed":
        # the fit prices the replacement's missed step itself (missed_step_s)
        load: Any = ClosedLoop(row.concurrency, replacement_misses_step=False)
    else:
        load = OpenLoop()
    bs = resolved.cache.block_size
    requests, next_id = row_requests(row, bs)
    # random prompts share nothing; caching off as the published runs had it
    cache = CacheSettings(block_size=bs, num_gpu_blocks=resolved.cache.num_gpu_blocks,
                          enable_prefix_caching=False, max_model_len=row.max_model_len)
    recorder = _Recorder()
    sim = Simulator(requests, resolved.default_settings, cache, recorder,
                    options=SimOptions(async_scheduling=row.async_scheduling), load=load, num_gpus=row.tp, num_hash_ids=next_id)
    result = sim.run()
    done = [r for r in result.requests if r.status == "finished"]
    if not done:
        raise ConfigError(f"benchmark {row.id}: the twin finished no request "
                          f"(KV capacity {resolved.cache.num_gpu_blocks} blocks)")
    cols = np.asarray(recorder.rows, dtype=np.float64).reshape(-1, 6)

    def idx(values: list[float]) -> np.ndarray:
        return np.rint(np.asarray(values)).astype(np.int64)

    return RecordedRun(
        row=row, arrays=tuple(cols[:, i] for i in range(6)),
        arrival=idx([r.arrival_s for r in done]), first=idx([r.first_token_s for r in done]),
        finish=idx([r.finish_s for r in done]),
        input_len=np.asarray([r.input_len for r in done], dtype=np.float64),
        output_len=np.asarray([r.output_len for r in done], dtype=np.float64),
        target=target, resolved=resolved)


def log_errors(run: RecordedRun, model: RooflineStepTimeModel) -> dict[str, float]:
    """``log(predicted / published)`` per reported figure."""
    pred = run.figures(model)
    return {k: math.log(pred[k] / v) for k, v in run.row.figures.items()}
