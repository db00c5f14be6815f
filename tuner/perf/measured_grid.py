"""Measured attention as a 2-D lookup over (requests, tokens per request).

Attention depends on two variables per step, how many requests and how long each one's
context is, so aiconfigurator-core measures it on a 2-D grid (batch x sequence length)
and interpolates in both. :func:`attention_grids` evaluates the model's attention ops
through aiconfigurator-core's engine (its interpolation, clamping and SOL floor) on a
grid that contains the engine's own collection points plus midpoints, and
:class:`Grid2D` interpolates bilinearly between them in plain Python, so the tables
pickle into a vLLM interpreter without aiconfigurator-core and a lookup costs two
``bisect`` calls and a few multiplications.

Outside the grid: below the first point the first row or column holds (a step has at
least one request and one token); beyond the last batch point the time scales with the
batch (``t(b) = t(b_max) x b / b_max``, attention work is per request); beyond the last
length point the last segment is extended linearly.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from tuner.errors import ConfigError

#: Requests per step: aiconfigurator-core's collection points (powers of two) and the
#: midpoints between them, so a bilinear lookup follows the engine closely.
GEN_BATCH = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
             1024, 1536, 2048)
CTX_BATCH = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
#: KV length per decode request (the collection's ``step + 1`` points and midpoints).
GEN_LEN = tuple(sorted({2 ** i for i in range(1, 18)} | {3 * 2 ** i for i in range(0, 16)}))
#: Tokens per prefill request (the collection's isl points, then doubling to 128k).
CTX_LEN = (1, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
           6144, 8192, 10240, 12288, 16384, 24576, 32768, 49152, 65536, 98304, 131072)


class Grid2D:
    """Bilinear interpolation on a rectangular grid; values in seconds, row-major."""

    __slots__ = ("xs", "ys", "values", "_p")

    def __init__(self, xs: list[float], ys: list[float], values: list[float]) -> None:
        if len(xs) < 2 or len(ys) < 2 or len(values) != len(xs) * len(ys):
            raise ConfigError(f"a measured grid needs >= 2 x 2 points and {len(xs)} x "
                              f"{len(ys)} values, got {len(values)}")
        # tuples, not arrays: indexing a tuple hands back the stored float object, an
        # array builds a new one per read (the hot path reads six)
        self.xs = tuple(float(x) for x in xs)
        self.ys = tuple(float(y) for y in ys)
        self.values = tuple(float(v) for v in values)
        # everything at() reads, in one tuple: one attribute load and an unpack
        self._p = (self.xs, self.ys, self.values, len(ys), len(xs) - 2, len(ys) - 2,
                   self.xs[-1], self.ys[0])

    def __getstate__(self) -> dict[str, Any]:
        return {"xs": list(self.xs), "ys": list(self.ys), "values": list(self.values)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["xs"], state["ys"], state["values"])  # type: ignore[misc]

    def at(self, x: float, y: float) -> float:
        """Seconds at ``x`` (requests) and ``y`` (tokens per request)."""
        xs, ys, v, ny, x_last, y_last, x_max, y_min = self._p
        if x >= x_max:
            i = x_last
            fx = 1.0
            scale = x / x_max
        else:
            i = bisect_right(xs, x) - 1
            if i < 0:
                i, fx = 0, 0.0
            else:
                fx = (x - xs[i]) / (xs[i + 1] - xs[i])
            scale = 1.0
        if y <= y_min:
            j, fy = 0, 0.0
        else:
            j = bisect_right(ys, y) - 1
            if j > y_last:
                j = y_last
            fy = (y - ys[j]) / (ys[j + 1] - ys[j])
        r0 = i * ny + j
        a = v[r0]
        a += (v[r0 + 1] - a) * fy
        r1 = r0 + ny
        b = v[r1]
        b += (v[r1 + 1] - b) * fy
        return (a + (b - a) * fx) * scale


def evaluate(engine: Any, ops_json: str, label: str, *, is_context: bool, batch_size: int,
             s: int, accept: tuple[str, ...] = ("silicon",)) -> float:
    """Seconds of one op list at one point through aiconfigurator-core's engine; a
    shape its tables do not hold (the engine raises, or answers from a non-measured
    provenance) becomes a one-line ``ConfigError`` naming ``label``."""
    try:
        ((name, ms, _energy, provenance),) = engine.evaluate_ops_json(
            ops_json, is_context=is_context, batch_size=batch_size, s=s)
    except Exception as exc:  # the engine's own error types are not public API
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"aiconfigurator-core cannot price {label}: {first}") from exc
    if provenance not in accept:
        raise ConfigError(f"aiconfigurator-core has no measured data for {name} of {label} "
                          f"({provenance})")
    return ms * 1e-3


def _kv_mode(common: Any, kv_dtype: str) -> Any:
    return common.KVCacheQuantMode.fp8 if kv_dtype == "fp8" else common.KVCacheQuantMode.bfloat16


def attention_grids(engine: Any, *, heads: int, kv_heads: int, head_dim: int, kv_dtype: str,
                    layers: float, window: int = 0, label: str) -> dict[str, Any]:
    """Measured seconds of ``layers`` attention layers on one rank, on the grids above.

    Returns ``{"gen": (xs, ys, values), "ctx": (xs, ys, values)}``: generation attention
    at (decode requests, KV tokens per request), context attention at (prefill
    requests, tokens per request, nothing cached). Raises ``ConfigError`` when the
    engine has no measured rows for the shape (provenance not silicon-based).
    """
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk.engine import build_ops_json
    from aiconfigurator_core.sdk.operations.attention import ContextAttention, GenerationAttention

    kv = _kv_mode(common, kv_dtype)
    gen = GenerationAttention("generation_attention", layers, heads, kv_heads, kv,
                              window_size=window, head_size=head_dim)
    ctx = ContextAttention("context_attention", layers, heads, kv_heads, kv,
                           common.FMHAQuantMode.bfloat16, window_size=window, head_size=head_dim)
    out: dict[str, Any] = {}
    for key, op, is_context, xs, ys in (("gen", gen, False, GEN_BATCH, GEN_LEN),
                                        ("ctx", ctx, True, CTX_BATCH, CTX_LEN)):
        js = build_ops_json([op])
        # context attention is "mixed": the measured FMHA kernel plus aiconfigurator's
        # analytic RoPE/KV-write memory ops around it
        values = [evaluate(engine, js, f"{key} attention of {label}", is_context=is_context,
                           batch_size=b, s=s, accept=("silicon", "mixed"))
                  for b in xs for s in ys]
        out[key] = ([float(x) for x in xs], [float(y) for y in ys], values)
    return out


def moe_column(engine: Any, points: list[int], *, hidden: int, inter: int, top_k: int,
               experts: int, tp: int, ep: int, dp: int, quant: str, distribution: str,
               layers: float, label: str) -> list[float]:
    """Measured seconds of ``layers`` fused-MoE layers on one rank at each token count of
    ``points`` (tokens of this rank; with EP the engine adds the other DP ranks' share)."""
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk.engine import build_ops_json
    from aiconfigurator_core.sdk.operations.moe import MoE

    op = MoE("moe", layers, hidden, inter, top_k, experts, tp, ep,
             getattr(common.MoEQuantMode, quant), distribution, dp)
    js = build_ops_json([op])
    return [evaluate(engine, js, f"{quant} MoE of {label}", is_context=True, batch_size=1, s=m)
            for m in points]
