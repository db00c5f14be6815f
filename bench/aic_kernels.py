#!/usr/bin/env python3
"""The analytic kernel model against NVIDIA's measured vLLM kernel tables (not a test).

aiconfigurator-core (optional extra ``tuner[aic]``) ships per-GPU tables measured with
vLLM's own kernels: GEMM by dtype and (m, n, k), context and generation attention,
custom all-reduce, fused MoE. For H100, H200 and B200 this script prices every table
row with the step-time model's kernel formulas and coefficients (tuner.perf: the
hardware priors with the shipped fit, exactly what a replay uses) and prints the error
per op class: median |error|, median signed error (bias) and the 10th/90th percentiles,
split by token-count regime where it matters. It checks the *shape* of the analytic
model (how time grows with M, context, message size), kernel by kernel.

Formulas (docs/step-time-model.md §1), per kernel:

* GEMM:   t0 + max(N K b / (eta_mem BW), 2 (N + n_half)(K + k_half)(M + m_half) / (eta_compute P))
* context attention: floor + KV write + max(KV read / (kv_eff BW), compute), compute =
  4 H d [pairs + (half + kv / g) tokens] / (eff(d) P) + the longest prompt's last tile
  (tuner/perf/prefill_attention.py, the formula the step-time model folds)
* generation attention: floor + max(KV bytes / (kv_eff BW) x (1 + half_items / items),
  occupancy floor, items x item_s / units, 4 H d ctx / (decode_eff P)), items = requests x
  KV heads (the decode work items, docs/step-time-model.md §1)
* all-reduce: latency + 2(p-1)/p (bytes + half) / (eff link)
* fused MoE: 2 t0 + moe_layer_overhead + max(touched W b / (eta_mem BW),
  2 W (k T + touched m_half) / (eta_compute P)) per rank
* all-to-all (expert parallelism): all2all_latency + bytes / all2all_bw (the preset's),
  against the measured NCCL all-to-all on 8 GPUs
* Gated DeltaNet layer: tuner/perf/linear_attention.py against the measured GDN kernels

Whole steps: the analytic model's prefill (one 1k-32k-token prompt) and decode steps of
Llama-3.1-8B/70B at TP 1-8 against the ``aic`` step-time source (``--no-steps`` skips).

``--priors`` prices with the hardware presets' priors alone: the structure against the
tables before the published-results fit moves the coefficients.

Usage:  .venv/bin/python bench/aic_kernels.py [--gpus h100,h200,b200] [--markdown OUT] [--no-steps] [--priors]
        .venv/bin/python bench/aic_kernels.py --fit-priors   (the NVIDIA presets' GEMM,
        all-reduce and all-to-all priors and the GDN constants: a log least-squares fit of
        the formulas to the tables)
        .venv/bin/python bench/aic_kernels.py --fit-generation [--hold-floor] [--hold-chunk]
        (the decode-attention priors alone: floor, occupancy chunk, work-item latency,
        bandwidth underfill; --hold-* keep attn_floor_s / attn_chunk_tokens at the shipped
        values, as the presets' figures were fitted)
        .venv/bin/python bench/aic_kernels.py --fit-experts   (Hopper's fp8moe and int4moe
        compute rate: Marlin's fused MoE, the kernel the H200 FP8 and INT4 MoE serving rows ran)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.perf.dtypes import FORMAT_BYTES  # noqa: E402
from tuner.perf.fit.coefficients import tile_rows_array  # noqa: E402
from tuner.perf.fit.published import default_coefficients  # noqa: E402
from tuner.perf.hardware import load_hardware  # noqa: E402
from tuner.perf.models import aic_model_dir  # noqa: E402
from tuner.perf.prefill_attention import prefill_attention_s  # noqa: E402

SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm"}
GEMM_FORMAT = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8b", "nvfp4": "fp4",
               "w4a16_mxfp4": "fp4", "int4_wo": "int4"}
#: Fused-MoE tables: fp8 experts (per-tensor or block-scaled) run vLLM's fused MoE kernels,
#: priced with the ``fp8moe`` coefficients, INT4 (W4A16 Marlin) experts with ``int4moe``
#: (the model's routed-expert formats, tuner.perf.dtypes.EXPERT_FORMATS)
MOE_FORMAT = dict(GEMM_FORMAT, fp8="fp8moe", fp8_block="fp8moe", int4_wo="int4moe")


def _table(system: Path, op: str, name: str):  # type: ignore[no-untyped-def]
    import polars as pl

    files = sorted((system / op / "vllm").glob(f"*/{name}"))
    if not files:
        return None
    return pl.read_parquet(files[-1])  # newest vLLM version measured


def _stats(pred: np.ndarray, meas: np.ndarray) -> str:
    err = pred / meas - 1.0
    return (f"n={len(err):6d}  median |err| {100 * np.median(np.abs(err)):5.1f}%  "
            f"bias {100 * np.median(err):+6.1f}%  p10/p90 {100 * np.percentile(err, 10):+6.1f}%"
            f"/{100 * np.percentile(err, 90):+6.1f}%")


def gemm_s(g, hw, fmt: str, m, n, k):  # type: ignore[no-untyped-def]
    """One GEMM kernel as the step-time model prices it (vectorised over m, n, k):
    ``t0 + max(N K b / (eta_mem BW), 2 (N + n_half)(K + k_half)(M' + m_half) / (eta P))``,
    ``M'`` = M padded to the kernel's M tiles where the format has them (``m_tile``)."""
    mem = n * k * FORMAT_BYTES[fmt] / (g.eta_mem * hw.hbm_bandwidth)
    rows = tile_rows_array(m, g.m_tile) if g.m_tile else m
    cmp = 2 * g.flop_elems(n * k, n, k, 1.0) * (rows + g.m_half) / (g.eta_compute * hw.peak(fmt))
    return g.t0_s + np.maximum(mem, cmp)


def gemm(system: Path, hw, c) -> list[str]:  # type: ignore[no-untyped-def]
    import polars as pl

    d = _table(system, "gemm", "gemm_perf.parquet")
    if d is None:
        return []
    # the fastest measured kernel per shape: what vLLM's kernel selection aims for
    d = d.group_by(["gemm_dtype", "m", "n", "k"]).agg(pl.col("latency").min())
    out = []
    for dtype, fmt in GEMM_FORMAT.items():
        sub = d.filter(pl.col("gemm_dtype") == dtype)
        if sub.is_empty():
            continue
        m, n, k = (sub[x].to_numpy().astype(float) for x in ("m", "n", "k"))
        pred = gemm_s(c.gemm_for(fmt), hw, fmt, m, n, k) * 1e3
        meas = sub["latency"].to_numpy()
        # compute-bound: the format's peak needs over 200 us for the shape (dispatch outside
        # the kernel, e.g. the fp8_block rows' ~90 us floor, is then a small share)
        big = 2 * n * k * m / hw.peak(fmt) > 2e-4
        # serving: the linears of 8B-405B models at TP <= 8 have N and K >= 512 (the
        # smallest, Llama-3.1-8B's o_proj at TP8, has K = 512); the tables also hold
        # N or K of 32-256, which no serving linear but a MoE router has
        serving = (n >= 512) & (k >= 512)
        for label, sel in (("all", m > 0), ("M<=64", m <= 64), ("64<M<1024", (m > 64) & (m < 1024)),
                           ("M>=1024", m >= 1024), ("compute", big), ("serving", serving)):
            if sel.any():
                out.append(f"  gemm {dtype:10s} {label:10s} {_stats(pred[sel], meas[sel])}")
    return out


def generation_attention_s(c, hw, b, ctx, h, kvh, hd, per_tok, fp8=False):  # type: ignore[no-untyped-def]
    """One decode-attention kernel as the step-time model prices it (vectorised): floor +
    max(KV read x (1 + half_items / items), occupancy floor, items x item_s / units,
    compute) + the new tokens' KV write, with items = requests x KV heads; ``fp8`` rows
    read their KV at ``kv_fp8_bw_eff`` (``Coefficients.kv_read_bw_eff``)."""
    bw = c.kv_bw_eff * hw.hbm_bandwidth
    read_bw = np.where(fp8, c.kv_read_bw_eff("fp8"), c.kv_bw_eff) * hw.hbm_bandwidth
    items = b * kvh
    mem = np.maximum(b * ctx * per_tok / read_bw * (1.0 + c.attn_decode_half_items / items),
                     c.attn_chunk_tokens * hw.compute_units / kvh * per_tok / read_bw)
    mem = np.maximum(mem, items * c.attn_decode_item_s / hw.compute_units)
    cmp = 4 * h * hd * b * ctx / (c.attn_decode_eff * hw.peak("bf16"))
    return c.attn_floor_s + np.maximum(mem, cmp) + b * per_tok / bw


def attention(system: Path, hw, c) -> list[str]:  # type: ignore[no-untyped-def]
    import polars as pl

    out = []
    peak = hw.peak("bf16")
    for name, kind in (("context_attention_perf.parquet", "context"),
                       ("generation_attention_perf.parquet", "generation")):
        d = _table(system, "attention", name)
        if d is None:
            continue
        d = d.filter(pl.col("window_size") == 0).group_by(
            ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim",
             "kv_cache_dtype", "step"]).agg(pl.col("latency").min())
        b, s, h, kvh, hd, step = (d[x].to_numpy().astype(float) for x in (
            "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "step"))
        kvb = np.where(d["kv_cache_dtype"].to_numpy() == "fp8", 1.0, 2.0)
        per_tok = 2 * kvh * hd * kvb
        if kind == "context":
            ctx = step  # tokens already cached before the chunk
            pred = prefill_attention_s(c, hw, h, kvh, hd, per_tok, b, b * s,
                                       b * s * (ctx + (s + 1) / 2), ctx, np.maximum, kvb == 1)
        else:
            ctx = step + s
            pred = generation_attention_s(c, hw, b, ctx, h, kvh, hd, per_tok, kvb == 1)
        meas = d["latency"].to_numpy()
        out.append(f"  {kind:10s} attention       {_stats(pred * 1e3, meas)}")
        if kind == "context":  # GQA serving head dims apart from MLA-like 192/512
            g = h / kvh
            for label, sel in (("hd<=128", hd <= 128), ("hd 192/256", (hd > 128) & (hd <= 256)),
                               ("hd 512", hd == 512), ("s<1k", s < 1024), ("s>=1k", s >= 1024),
                               ("MHA g=1", g == 1), ("GQA g>=4", g >= 4),
                               ("serving", (hd <= 128) & (h >= 4) & (s >= 128))):
                out.append(f"  {kind:10s} {label:10s}      {_stats(pred[sel] * 1e3, meas[sel])}")
        if kind == "generation":
            items = b * kvh
            for label, sel in (("ctx<2k", ctx < 2048), ("ctx>=2k", ctx >= 2048),
                               ("bf16 KV", kvb == 2), ("fp8 KV", kvb == 1),
                               ("items<=8", items <= 8), ("items>=512", items >= 512)):
                out.append(f"  {kind:10s} {label:10s}      {_stats(pred[sel] * 1e3, meas[sel])}")
    return out


def allreduce(system: Path, hw, c) -> list[str]:  # type: ignore[no-untyped-def]
    import polars as pl

    d = _table(system, "comm", "custom_allreduce_perf.parquet")
    if d is None:
        return []
    d = d.filter(pl.col("backend") == "vllm_graph")
    p = d["num_gpus"].to_numpy().astype(float)
    msg = d["message_size"].to_numpy().astype(float) * 2.0  # bf16 elements -> bytes
    lat = hw.allreduce_latency_s if c.allreduce_latency_s is None else c.allreduce_latency_s
    from tuner.perf.step_time import CUSTOM_ALLREDUCE_MAX_BYTES, LIBRARY_LATENCY_FACTOR

    # custom all-reduce up to 8 MiB, the library (its latency and bandwidth) above
    lib = msg > CUSTOM_ALLREDUCE_MAX_BYTES
    lib_eff = c.allreduce_bw_eff if c.allreduce_lib_bw_eff is None else c.allreduce_lib_bw_eff
    link = hw.interconnect_bandwidth * np.where(lib, lib_eff, c.allreduce_bw_eff)
    pred = lat * np.where(lib, LIBRARY_LATENCY_FACTOR, 1.0) + 2 * (p - 1) / p * (
        msg + c.allreduce_half_bytes) / link
    meas = d["latency"].to_numpy()
    out = [f"  all-reduce (graph) all        {_stats(pred * 1e3, meas)}"]
    for label, sel in (("<=64KiB", msg <= 65536), (">64KiB", msg > 65536), (">8MiB", lib)):
        if sel.any():
            out.append(f"  all-reduce (graph) {label:9s} {_stats(pred[sel] * 1e3, meas[sel])}")
    return out


def moe(system: Path, hw, c) -> list[str]:  # type: ignore[no-untyped-def]
    import polars as pl

    d = _table(system, "moe", "moe_perf.parquet")
    if d is None:
        return []
    d = d.filter(pl.col("distribution") == "balanced").group_by(
        ["moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
         "moe_tp_size", "moe_ep_size"]).agg(pl.col("latency").min())
    out = []
    for dtype, fmt in MOE_FORMAT.items():
        sub = d.filter(pl.col("moe_dtype") == dtype)
        if sub.is_empty():
            continue
        t, h, i, k, e, tp, ep = (sub[x].to_numpy().astype(float) for x in (
            "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
            "moe_ep_size"))
        g = c.gemm_for(fmt)
        local = e / ep
        w = 3 * h * i / tp  # one expert's elements on this rank
        # its FLOP elements with the tile terms: w13 (N = 2 I/tp, K = h), w2 (N = h, K = I/tp)
        wf = g.flop_elems(w, 2 * i / tp + h, h + i / tp, 2.0)
        touched = local * (1 - (1 - k / e) ** t)
        mem = touched * w * FORMAT_BYTES[fmt] / (g.eta_mem * hw.hbm_bandwidth)
        cmp = 2 * wf * (k * t / ep + touched * g.m_half) / (g.eta_compute * hw.peak(fmt))
        pred = 2 * g.t0_s + c.moe_layer_overhead_s + np.maximum(mem, cmp)
        meas = sub["latency"].to_numpy()
        for label, sel in (("all", t > 0), ("T<=64", t <= 64), ("T>64", t > 64)):
            if sel.any():
                out.append(f"  moe  {dtype:10s} {label:10s} {_stats(pred[sel] * 1e3, meas[sel])}")
    return out


def _alltoall_table(system: Path):  # type: ignore[no-untyped-def]
    """aiconfigurator-core's newest NCCL all-to-all rows (fp16, 8 GPUs), bytes and s."""
    import polars as pl

    files = sorted((system / "comm" / "nccl").glob("*/nccl_perf.parquet"))
    if not files:
        return None
    d = pl.read_parquet(files[-1]).filter((pl.col("op_name") == "alltoall")
                                          & (pl.col("nccl_dtype") == "half")
                                          & (pl.col("num_gpus") == 8))
    return (d["message_size"].to_numpy().astype(float) * 2.0,
            d["latency"].to_numpy().astype(float) * 1e-3)


def alltoall(system: Path, hw, c) -> list[str]:  # type: ignore[no-untyped-def]
    """The expert-parallel all-to-all term (latency + V / bandwidth, the preset's
    interconnect.all2all_*) against the measured NCCL all-to-all on 8 GPUs."""
    del c
    rows = _alltoall_table(system)
    if rows is None:
        return []
    v, t = rows
    pred = hw.all2all_latency_s + v / hw.all2all_bandwidth
    out = [f"  all-to-all (NCCL) all        {_stats(pred * 1e3, t * 1e3)}"]
    for label, sel in (("<=1MiB", v <= 1 << 20), (">1MiB", v > 1 << 20)):
        out.append(f"  all-to-all (NCCL) {label:10s} {_stats(pred[sel] * 1e3, t[sel] * 1e3)}")
    return out


def _gdn_rows(system: Path):  # type: ignore[no-untyped-def]
    """Measured GDN layers of the Qwen3.5-27B shapes (6-48 value heads: TP8..TP1; the
    conv and scan kernels summed per shape), or None."""
    import polars as pl

    files = sorted((system / "linear_attention" / "vllm").glob("*/gdn_perf.parquet"))
    if not files:
        return None
    return (pl.read_parquet(files[-1]).filter(pl.col("model_name") == "Qwen/Qwen3.5-27B")
            .group_by(["phase", "batch_size", "seq_len", "num_k_heads", "num_v_heads",
                       "head_k_dim", "head_v_dim"])
            .agg(pl.col("latency").sum()))


def gdn(system: Path, hw, c) -> list[str]:  # type: ignore[no-untyped-def]
    """tuner/perf/linear_attention.py against the measured Gated DeltaNet kernels (fp32
    state, as Qwen3.5/3.6 configure it)."""
    import dataclasses

    import polars as pl

    from tuner.perf import linear_attention as la
    from tuner.perf.models import load_model
    from tuner.sim.batch import StepBatch

    del c
    d = _gdn_rows(system)
    if d is None:
        return []
    base = load_model(ROOT / "tuner/perf/data/models/Qwen--Qwen3.6-27B.json")
    out = []
    for phase in ("generation", "context"):
        pred, meas = [], []
        for row in d.filter(pl.col("phase") == phase).iter_rows(named=True):
            m = dataclasses.replace(base, num_linear_layers=1,
                                    linear_num_key_heads=row["num_k_heads"],
                                    linear_num_value_heads=row["num_v_heads"],
                                    linear_key_head_dim=row["head_k_dim"],
                                    linear_value_head_dim=row["head_v_dim"])
            b, s = row["batch_size"], row["seq_len"]
            batch = (StepBatch(num_decode_reqs=b, decode_ctx_tokens=b)
                     if phase == "generation" else
                     StepBatch(num_prefill_reqs=b, num_prefill_tokens=b * s))
            pred.append(la.linear_attention_s(la.linear_constants(hw, m, 1), batch) * 1e3)
            meas.append(row["latency"])
        out.append(f"  gdn {phase:10s}       {_stats(np.asarray(pred), np.asarray(meas))}")
    return out


#: Whole steps checked against the ``aic`` source (the issue's "8B/70B, TP 1-8, 1k-32k").
STEP_MODELS = ("llama-3.1-8b", "llama-3.1-70b")
STEP_TPS = (1, 2, 4, 8)
PREFILL_TOKENS = (1024, 2048, 4096, 8192, 16384, 32768)
#: (decode requests, KV tokens per request)
DECODE_BATCHES = ((1, 1024), (16, 2048), (64, 4096), (256, 2048), (128, 8192))


def whole_steps(gpu: str, coefficients=None, quantization: str | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    """The analytic model's whole prefill and decode steps against the ``aic`` source
    (``--step-time-source analytic`` vs ``aic``: the measured tables summed the way a
    replay sums them), median |error| per phase, and each model/TP's worst step."""
    from tuner.perf.presets import resolve_target
    from tuner.perf.step_time import RooflineStepTimeModel
    from tuner.perf.target import Target
    from tuner.sim.batch import StepBatch

    errs: dict[str, list[float]] = {"prefill": [], "decode": []}
    worst: list[str] = []
    for model in STEP_MODELS:
        for tp in STEP_TPS:
            try:
                pair = {src: resolve_target(Target(hardware=gpu, model=model, tp=tp,
                                                   quantization=quantization,
                                                   block_size=16, step_time_source=src)
                                            ).step_time for src in ("analytic", "aic")}
            except Exception as exc:  # a shape the tables lack, a model that does not fit
                worst.append(f"    {model} TP{tp}: skipped ({str(exc).splitlines()[0][:80]})")
                continue
            if coefficients is not None:  # the same deployment priced with other coefficients
                ref = pair["analytic"]
                pair["analytic"] = RooflineStepTimeModel(ref.hardware, ref.model, tp, coefficients)
            cases = [("prefill", f"prefill {n}", StepBatch(
                num_prefill_reqs=1, num_prefill_tokens=n,
                prefill_attn_pairs=n * (n + 1) / 2)) for n in PREFILL_TOKENS]
            cases += [("decode", f"decode {b}x{c}", StepBatch(
                num_decode_reqs=b, decode_ctx_tokens=b * c)) for b, c in DECODE_BATCHES]
            row = []
            for phase, label, batch in cases:
                e = pair["analytic"].step_time_s(batch) / pair["aic"].step_time_s(batch) - 1.0
                errs[phase].append(e)
                row.append((abs(e), label, e))
            big = max(row)
            worst.append(f"    {model} TP{tp}: worst {big[1]} {100 * big[2]:+.1f}%")
    out = []
    for phase, e in errs.items():
        if e:
            a = np.abs(np.asarray(e))
            out.append(f"  whole {phase:7s} steps  n={len(e):3d}  median |err| "
                       f"{100 * np.median(a):5.1f}%  bias {100 * np.median(e):+6.1f}%  "
                       f"within 15 %: {int((a <= 0.15).sum())}/{len(e)}")
    return out + worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="h100,h200,b200")
    ap.add_argument("--markdown", default=None, help="also write the lines to this file")
    ap.add_argument("--priors", action="store_true",
                    help="price with the hardware presets' priors alone (the structure against "
                         "the tables, before the serving fit moves the coefficients)")
    ap.add_argument("--no-steps", action="store_true",
                    help="skip the whole-step check against the aic source (about a minute)")
    ap.add_argument("--step-quantization", default=None,
                    help="--quantization of the whole-step check's models (e.g. fp8: dense "
                         "per-tensor FP8 GEMMs against the tables' fp8 rows)")
    args = ap.parse_args()
    folder = aic_model_dir()
    if folder is None:
        sys.exit("aiconfigurator-core is not installed: pip install 'tuner[aic]'")
    data = folder.parent / "systems" / "data"
    lines: list[str] = []
    for gpu in args.gpus.split(","):
        hw = load_hardware(gpu)
        c = hw.coefficients if args.priors else default_coefficients(hw)
        system = data / SYSTEMS[gpu]
        lines.append(f"{gpu} ({system.name}): predicted vs measured kernel latency"
                     + (" (priors alone)" if args.priors else ""))
        for part in (gemm, attention, allreduce, moe, alltoall, gdn):
            lines += part(system, hw, c)
        if not args.no_steps:
            lines += whole_steps(gpu, c if args.priors else None, args.step_quantization)
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")



def fit_priors(system: Path, hw) -> dict:  # type: ignore[no-untyped-def]
    """Least-squares (log) fit of the GEMM and all-reduce coefficients to the tables:
    the numbers the NVIDIA presets' ``step_time`` priors quote (``--fit-priors``)."""
    import polars as pl

    from tuner.perf.fit.coefficients import GemmCoefficients
    from tuner.perf.fit.least_squares import Param, fit_params

    out: dict = {"gemm": {}}
    # sorted: group_by's row order is not fixed, and the 4,000-row sample below must be
    # the same rows on every run for the printed priors to be reproducible
    d = _table(system, "gemm", "gemm_perf.parquet").group_by(
        ["gemm_dtype", "m", "n", "k"]).agg(pl.col("latency").min()).sort(
        ["gemm_dtype", "m", "n", "k"])
    for dtype, fmt in (("bfloat16", "bf16"), ("fp8", "fp8")):
        sub = d.filter(pl.col("gemm_dtype") == dtype).sample(n=4000, seed=7, with_replacement=False) \
            if len(d.filter(pl.col("gemm_dtype") == dtype)) > 4000 else d.filter(pl.col("gemm_dtype") == dtype)
        m, n, k = (sub[x].to_numpy().astype(float) for x in ("m", "n", "k"))
        y = sub["latency"].to_numpy() * 1e-3

        # the M tile is the kernel's dispatch (a preset fact, not fitted)
        tile = hw.coefficients.gemm_for(fmt).m_tile

        def res(v: dict, m=m, n=n, k=k, y=y, fmt=fmt, tile=tile) -> np.ndarray:
            return np.log(gemm_s(GemmCoefficients(**v, m_tile=tile), hw, fmt, m, n, k) / y)

        r = fit_params(res, [Param("t0_s", 2e-7, 4e-4, 6e-6, np.inf), Param("eta_mem", 0.02, 1.0, 0.7, np.inf),
                             Param("eta_compute", 0.02, 1.0, 0.6, np.inf), Param("m_half", 1.0, 4096.0, 64.0, np.inf),
                             Param("k_half", 1.0, 16384.0, 64.0, np.inf),
                             Param("n_half", 1.0, 16384.0, 64.0, np.inf)])
        out["gemm"][fmt] = {k2: float(f"{v:.3g}") for k2, v in r.values.items()}
        out["gemm"][fmt]["median_abs_err_pct"] = float(f"{100 * np.median(np.abs(np.expm1(r.residuals))):.3g}")
    # the block-scaled floor stays the preset's (the M-only per-tensor floor, its
    # activation-quantization launch included; the table's own floor is dispatch, §10)
    out["gemm"]["fp8b"] = fit_block_fp8(d, hw, hw.coefficients.gemm_for("fp8b").t0_s)
    for fmt in ("fp8moe", "int4moe"):
        marlin = fit_marlin_experts(system, hw, fmt)
        if marlin is not None:
            out["gemm"][fmt] = marlin
    out.update(fit_context_attention(system, hw))
    out.update(fit_generation_attention(system, hw))
    a = _table(system, "comm", "custom_allreduce_perf.parquet").filter(pl.col("backend") == "vllm_graph")
    p = a["num_gpus"].to_numpy().astype(float)
    msg = a["message_size"].to_numpy().astype(float) * 2.0
    y = a["latency"].to_numpy() * 1e-3

    def res_ar(v: dict) -> np.ndarray:
        pred = v["allreduce_latency_s"] + 2 * (p - 1) / p * (msg + v["allreduce_half_bytes"]) / (
            v["allreduce_bw_eff"] * hw.interconnect_bandwidth)
        return np.log(pred / y)

    r = fit_params(res_ar, [Param("allreduce_latency_s", 1e-7, 1e-4, 5e-6, np.inf),
                            Param("allreduce_bw_eff", 0.02, 1.0, 0.7, np.inf),
                            Param("allreduce_half_bytes", 1e3, 1e8, 1e6, np.inf)])
    out.update({k2: float(f"{v:.3g}") for k2, v in r.values.items()})
    lib = msg > 8 * 1024 * 1024  # the library regime: latency twice, its own bandwidth

    def res_lib(v: dict) -> np.ndarray:
        pred = 2 * out["allreduce_latency_s"] + 2 * (p[lib] - 1) / p[lib] * (
            msg[lib] + out["allreduce_half_bytes"]) / (v["allreduce_lib_bw_eff"]
                                                       * hw.interconnect_bandwidth)
        return np.log(pred / y[lib])

    r_lib = fit_params(res_lib, [Param("allreduce_lib_bw_eff", 0.02, 1.0, 0.7, np.inf)])
    out["allreduce_lib_bw_eff"] = float(f"{r_lib.values['allreduce_lib_bw_eff']:.3g}")
    out["allreduce_median_abs_err_pct"] = float(f"{100 * np.median(np.abs(np.expm1(r.residuals))):.3g}")
    rows = _alltoall_table(system)
    if rows is not None:  # the presets' interconnect.all2all_latency_us / all2all_bw_gbps
        v, t = rows

        def res_a2a(p: dict) -> np.ndarray:
            return np.log((p["all2all_latency_s"] + v / p["all2all_bw"]) / t)

        r = fit_params(res_a2a, [Param("all2all_latency_s", 1e-7, 1e-4, 8e-6, np.inf),
                                 Param("all2all_bw", 1e9, 5e12, 3e11, np.inf)])
        out["all2all_latency_us"] = float(f"{r.values['all2all_latency_s'] * 1e6:.3g}")
        out["all2all_bw_gbps"] = float(f"{r.values['all2all_bw'] / 1e9:.3g}")
        out["all2all_median_abs_err_pct"] = float(
            f"{100 * np.median(np.abs(np.expm1(r.residuals))):.3g}")
    return out


def fit_block_fp8(d, hw, t0_s: float) -> dict:  # type: ignore[no-untyped-def]
    """Block-scaled fp8 (``fp8b``): ``eta_compute`` and ``m_half`` fitted to the fp8_block
    rows whose FP8-peak work exceeds 200 us, the floor held at the preset's (the M-only per-tensor fp8 floor) and
    ``eta_mem`` at DeepGEMM's published 0.66 (the presets cite both). The table's small-M
    rows sit on a ~90 us (Hopper) / ~200 us (B200) floor flat in N and K, several times
    DeepGEMM's own kernel times at those shapes: dispatch outside the kernel, which
    CUDA-graph serving does not pay, so they are left out of the fit."""
    import polars as pl

    from tuner.perf.fit.least_squares import Param, fit_params

    sub = d.filter(pl.col("gemm_dtype") == "fp8_block")
    m, n, k = (sub[x].to_numpy().astype(float) for x in ("m", "n", "k"))
    y = sub["latency"].to_numpy() * 1e-3
    big = 2 * m * n * k / hw.peak("fp8") > 2e-4
    m, n, k, y = m[big], n[big], k[big], y[big]
    mem = n * k * FORMAT_BYTES["fp8b"] / (0.66 * hw.hbm_bandwidth)

    def res(v: dict) -> np.ndarray:
        cmp = 2 * n * k * (m + v["m_half"]) / (v["eta_compute"] * hw.peak("fp8"))
        return np.log((t0_s + np.maximum(mem, cmp)) / y)

    r = fit_params(res, [Param("eta_compute", 0.02, 1.0, 0.6, np.inf),
                         Param("m_half", 1.0, 4096.0, 64.0, np.inf)])
    out = {"t0_s": t0_s, "eta_mem": 0.66, **{k2: float(f"{v:.3g}") for k2, v in r.values.items()}}
    out["median_abs_err_pct"] = float(f"{100 * np.median(np.abs(np.expm1(r.residuals))):.3g}")
    return out


def fit_marlin_experts(system: Path, hw, fmt: str = "fp8moe") -> dict | None:  # type: ignore[no-untyped-def]
    """Hopper's routed experts as the serving rows run them: vLLM's Marlin fused MoE,
    W8A16 for FP8 experts (``fp8moe``; the S5a H200 rows' note: "Hopper FP8 MoE ->
    Marlin") and W4A16 for INT4 experts (``int4moe``; Kimi-K2.5's compressed-tensors
    checkpoint, S5c). Marlin dequantises the weights in registers and multiplies in bf16
    whatever their width, so its compute rate is measured by the tables' Marlin rows
    (``int4_wo``, ``vllm_marlin_int4_moe``: Kimi-K2's expert shape, 7168 x 2048, 384
    experts, top-8, at TP 1-32 and EP 1-128) at the bf16 peak; only the bytes differ
    between W4A16 and W8A16. Fitted: ``eta_compute`` and ``m_half`` (the padded rows per
    touched expert), the floor and ``eta_mem`` held at the preset's ``fmt`` priors (the
    table's floor is ~29 us, dispatch a CUDA-graph step does not pay, as for ``fp8b``; the
    memory term never binds with the padded rows: the fit returns its start value).
    ``eta_compute`` is printed against the bf16 peak and converted to the peak ``fmt`` is
    priced at (:meth:`tuner.perf.hardware.HardwareSpec.peak`). None without Marlin rows
    (B200 runs DeepGEMM / CUTLASS grouped GEMMs for these experts: no table)."""
    import polars as pl

    from tuner.perf.fit.least_squares import Param, fit_params

    d = _table(system, "moe", "moe_perf.parquet")
    if d is None or hw.name == "b200":
        return None
    d = d.filter((pl.col("distribution") == "balanced") & (pl.col("moe_dtype") == "int4_wo"))
    if d.is_empty():
        return None
    d = d.group_by(["num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
                    "moe_tp_size", "moe_ep_size"]).agg(pl.col("latency").min()).sort(
        ["num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
         "moe_ep_size"])
    t, h, i, k, e, tp, ep = (d[x].to_numpy().astype(float) for x in (
        "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
        "moe_ep_size"))
    y = d["latency"].to_numpy() * 1e-3
    g, c = hw.coefficients.gemm_for(fmt), hw.coefficients
    w = 3 * h * i / tp
    touched = e / ep * (1 - (1 - k / e) ** t)
    mem = touched * w * FORMAT_BYTES["int4"] / (g.eta_mem * hw.hbm_bandwidth)

    def res(v: dict) -> np.ndarray:
        cmp = 2 * w * (k * t / ep + touched * v["m_half"]) / (v["eta_compute"] * hw.peak("bf16"))
        return np.log((2 * g.t0_s + c.moe_layer_overhead_s + np.maximum(mem, cmp)) / y)

    r = fit_params(res, [Param("eta_compute", 0.02, 1.0, 0.3, np.inf),
                         Param("m_half", 1.0, 4096.0, 64.0, np.inf)])
    bf16 = r.values["eta_compute"]
    resid = np.expm1(r.residuals)
    return {"eta_compute_bf16_peak": float(f"{bf16:.3g}"),
            "eta_compute": float(f"{bf16 * hw.peak('bf16') / hw.peak(fmt):.3g}"),
            "m_half": float(f"{r.values['m_half']:.3g}"), "rows": int(len(y)),
            "median_abs_err_pct": float(f"{100 * np.median(np.abs(resid)):.3g}"),
            # the deployments a TP-sharded serving row runs (EP 1) and the TP 8 of the
            # S5a/S5c rows, apart: where the single-rate form is closer than its median
            "ep1_median_abs_err_pct": float(f"{100 * np.median(np.abs(resid[ep == 1])):.3g}"),
            "tp8_ep1_bias_pct": float(
                f"{100 * np.median(resid[(ep == 1) & (tp == 8)]):.3g}")}


#: The prefill-attention shape coefficients ``--fit-priors`` fits (tuner/perf/prefill_attention.py).
CONTEXT_PARAMS = ("attn_prefill_eff", "attn_prefill_half_tokens", "attn_prefill_kv_tokens",
                  "attn_prefill_tail_rows", "attn_softmax_head_dim")


def fit_context_attention(system: Path, hw) -> dict:  # type: ignore[no-untyped-def]
    """The prefill-attention shape (``CONTEXT_PARAMS``) fitted to the measured context
    attention of the serving head dims (64 and 128; no window), the kernel floor and KV
    bandwidth held at the preset's priors (they are decode's too): the formula of
    tuner/perf/prefill_attention.py, exactly as a replay prices it."""
    import dataclasses

    import polars as pl

    from tuner.perf.fit.least_squares import Param, fit_params

    c = hw.coefficients
    d = _table(system, "attention", "context_attention_perf.parquet")
    d = d.filter((pl.col("window_size") == 0) & (pl.col("head_dim") <= 128)).group_by(
        ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim",
         "kv_cache_dtype", "step"]).agg(pl.col("latency").min())
    b, s, h, kvh, hd, ctx = (d[x].to_numpy().astype(float) for x in (
        "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "step"))
    kvb = np.where(d["kv_cache_dtype"].to_numpy() == "fp8", 1.0, 2.0)
    y = d["latency"].to_numpy() * 1e-3
    pairs = b * s * (ctx + (s + 1) / 2)

    def res(v: dict) -> np.ndarray:
        cv = dataclasses.replace(c, **v)
        return np.log(prefill_attention_s(cv, hw, h, kvh, hd, 2 * kvh * hd * kvb, b, b * s,
                                          pairs, ctx, np.maximum, kvb == 1) / y)

    r = fit_params(res, [Param("attn_prefill_eff", 0.02, 1.0, 0.6, np.inf),
                         Param("attn_prefill_half_tokens", 1.0, 8192.0, 256.0, np.inf),
                         Param("attn_prefill_kv_tokens", 1.0, 8192.0, 256.0, np.inf),
                         Param("attn_prefill_tail_rows", 1.0, 1024.0, 64.0, np.inf),
                         Param("attn_softmax_head_dim", 1.0, 1024.0, 50.0, np.inf)])
    out = {k: float(f"{v:.3g}") for k, v in r.values.items()}
    out["context_attention_median_abs_err_pct"] = float(
        f"{100 * np.median(np.abs(np.expm1(r.residuals))):.3g}")
    return out


def fit_gdn(system: Path, hw) -> dict:  # type: ignore[no-untyped-def]
    """The constants of tuner/perf/linear_attention.py: a log least-squares fit to the
    measured GDN kernels (Qwen3.5-27B shapes; decode: floor, state and conv bandwidth
    fractions; prefill: floor, state and conv fractions, scan FLOP fraction)."""
    import polars as pl

    from tuner.perf.fit.least_squares import Param, fit_params

    d = _gdn_rows(system)
    if d is None:
        return {}
    d = d.filter(pl.col("num_v_heads") > 0)
    bw, peak = hw.hbm_bandwidth, hw.peak("bf16")
    out = {}
    for phase in ("generation", "context"):
        sub = d.filter(pl.col("phase") == phase)
        b, s, nk, nv, dk, dv = (sub[x].to_numpy().astype(float) for x in (
            "batch_size", "seq_len", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"))
        y = sub["latency"].to_numpy() * 1e-3
        state = 2 * nv * dk * dv * 4.0
        conv = 2 * (2 * nk * dk + nv * dv) * 2.0
        flops = nv * (4 * dk * dv + 2 * 64 * (dk + dv) + 2 * 64 * dk)
        tok = b * s if phase == "context" else b

        def res(p: dict, b=b, tok=tok, state=state, conv=conv, flops=flops, y=y,
                phase=phase) -> np.ndarray:
            t = p["floor_s"] + b * state / (p["state_eff"] * bw) + tok * conv / (p["conv_eff"] * bw)
            if phase == "context":
                t = t + tok * flops / (p["flop_eff"] * peak)
            return np.log(t / y)

        params = [Param("floor_s", 1e-7, 1e-4, 8e-6, np.inf), Param("state_eff", 0.01, 1.0, 0.6, np.inf),
                  Param("conv_eff", 0.01, 1.0, 0.5, np.inf)]
        if phase == "context":
            params.append(Param("flop_eff", 0.01, 1.0, 0.15, np.inf))
        r = fit_params(res, params)
        out[phase] = {k: float(f"{v:.3g}") for k, v in r.values.items()}
        out[phase]["median_abs_err_pct"] = float(
            f"{100 * np.median(np.abs(np.expm1(r.residuals))):.3g}")
    return out


#: The decode-attention coefficients ``--fit-priors`` / ``--fit-generation`` fit.
GENERATION_PARAMS = ("attn_floor_s", "attn_chunk_tokens", "attn_decode_item_s",
                     "attn_decode_half_items", "kv_fp8_bw_eff")


def fit_generation_attention(system: Path, hw) -> dict:  # type: ignore[no-untyped-def]
    """The decode-attention floor, occupancy chunk, work-item latency and bandwidth
    underfill (``GENERATION_PARAMS``) fitted to the measured generation attention (every
    head dim and KV dtype; no window), the KV bandwidth held at the shipped fit's
    ``kv_bw_eff`` (what a replay uses; the serving rows set it): the formula of
    :func:`generation_attention_s`, exactly as the step-time model prices a decode."""
    import dataclasses

    import polars as pl

    from tuner.perf.fit.least_squares import Param, fit_params

    c = default_coefficients(hw)
    d = _table(system, "attention", "generation_attention_perf.parquet")
    d = d.filter(pl.col("window_size") == 0).group_by(
        ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim",
         "kv_cache_dtype", "step"]).agg(pl.col("latency").min())
    b, s, h, kvh, hd, step = (d[x].to_numpy().astype(float) for x in (
        "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "step"))
    fp8 = d["kv_cache_dtype"].to_numpy() == "fp8"
    per_tok = 2 * kvh * hd * np.where(fp8, 1.0, 2.0)
    y = d["latency"].to_numpy() * 1e-3

    def res(v: dict) -> np.ndarray:
        cv = dataclasses.replace(c, **v)
        return np.log(generation_attention_s(cv, hw, b, step + s, h, kvh, hd, per_tok, fp8) / y)

    hold = sys.argv
    r = fit_params(res, [*([Param("attn_floor_s", 2e-7, 1e-3, 8e-6, np.inf)]
                           if "--hold-floor" not in hold else []),
                         *([Param("attn_chunk_tokens", 1.0, 4096.0, 64.0, np.inf)]
                           if "--hold-chunk" not in hold else []),
                         *([Param("attn_decode_item_s", 1e-8, 1e-4, 2e-6, np.inf),
                            Param("attn_decode_half_items", 1e-3, 1024.0, 1.0, np.inf)]
                           if "--hold-items" not in hold else []),
                         *([Param("kv_fp8_bw_eff", 0.05, 1.0, 0.6, np.inf)]
                           if "--hold-kv-fp8" not in hold else [])])
    out = {k: float(f"{v:.3g}") for k, v in r.values.items()}
    out["generation_attention_median_abs_err_pct"] = float(
        f"{100 * np.median(np.abs(np.expm1(r.residuals))):.3g}")
    return out


if __name__ == "__main__" and "--fit-generation" in sys.argv:
    _folder = aic_model_dir()
    for _gpu in ("h100", "h200", "b200"):
        _system = _folder.parent / "systems" / "data" / SYSTEMS[_gpu]
        print(_gpu, fit_generation_attention(_system, load_hardware(_gpu)))
    sys.exit(0)


if __name__ == "__main__" and "--fit-experts" in sys.argv:
    _folder = aic_model_dir()
    for _gpu in ("h100", "h200"):
        _system = _folder.parent / "systems" / "data" / SYSTEMS[_gpu]
        for _fmt in ("fp8moe", "int4moe"):
            print(_gpu, _fmt, "(Marlin)", fit_marlin_experts(_system, load_hardware(_gpu), _fmt))
    sys.exit(0)


if __name__ == "__main__" and "--fit-priors" in sys.argv:
    _folder = aic_model_dir()
    for _gpu in ("h100", "h200", "b200"):
        _system = _folder.parent / "systems" / "data" / SYSTEMS[_gpu]
        print(_gpu, fit_priors(_system, load_hardware(_gpu)))
        if _gpu == "h200":
            print(_gpu, "gdn", fit_gdn(_system, load_hardware(_gpu)))
    sys.exit(0)


if __name__ == "__main__":
    main()
