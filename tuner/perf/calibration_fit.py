"""Fit the roofline step-time model to measured step times (non-negative least squares).

Pure math, no I/O: ``tuner calibrate`` measures steps on a server and hands this module
``(StepBatch, seconds)`` pairs. The model is linear in its coefficient vector ``theta``
once the regime of each kernel group (memory- or compute-bound) is fixed
(:meth:`RooflineStepTimeModel.features`), so the fit alternates::

    features under the current coefficients -> NNLS for theta >= 0 -> new coefficients
    -> recompute features (regimes may flip) -> ... until the regimes stop changing

and keeps the round whose *rebuilt model* (``from_linear``) reproduces the probes best:
that is the model the twin will run, so it is what the reported error describes.

The least squares are relative (each row divided by its measured time): a 2 ms decode
step and a 200 ms prefill weigh the same, which is what "within X %" promises.

Efficiencies are fractions of the vendor peak and ``Coefficients`` refuses one above 1.5
(a weight below 1/1.5). A fitted weight in (0, 1/1.5) is pinned at 1/1.5 and the rest
refitted (an active-set step), rather than silently rejected.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tuner.sim.batch import StepBatch
from tuner.perf.hardware import HardwareSpec
from tuner.perf.models import ModelSpec
from tuner.perf.step_time import FEATURE_NAMES, Coefficients, RooflineStepTimeModel

#: Feature indices whose weight is ``1/efficiency`` (bounded: efficiency <= 1.5).
_EFFICIENCY_IDX = tuple(range(4, 11))
_MIN_EFF_WEIGHT = 1.0 / 1.5


def nnls(a: np.ndarray, b: np.ndarray, *, max_iter: int | None = None
         ) -> tuple[np.ndarray, float]:
    """Lawson-Hanson active-set NNLS: ``argmin ||a x - b||_2`` subject to ``x >= 0``.

    Lawson & Hanson, *Solving Least Squares Problems* (1974), ch. 23. The passive set P
    grows by the variable with the largest positive gradient ``w = a^T (b - a x)``; the
    inner loop steps back along the segment to the unconstrained solution on P until
    every passive variable is positive. Finite: each outer step strictly lowers the
    residual, and there are finitely many passive sets.

    Args:
        a: (m, n) matrix.
        b: (m,) right-hand side.
        max_iter: cap on inner iterations (default 3 n).

    Returns:
        ``(x, ||a x - b||)``.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m, n = a.shape
    if b.shape != (m,):
        raise ValueError(f"b has shape {b.shape}, expected ({m},)")
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(np.float64).eps * max(m, n) * max(float(np.abs(a).sum(axis=0).max(initial=0.0)), 1.0)
    max_iter = 3 * n if max_iter is None else max_iter
    w = a.T @ (b - a @ x)
    iterations = 0
    while (~passive).any() and (w[~passive] > tol).any():
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        s = _lstsq_on(a, b, passive)
        while (s[passive] <= tol).any():
            iterations += 1
            if iterations > max_iter:
                break
            neg = passive & (s <= tol)
            alpha = float(np.min(x[neg] / (x[neg] - s[neg])))
            x = x + alpha * (s - x)
            passive &= x > tol
            x[~passive] = 0.0
            s = _lstsq_on(a, b, passive)
        x = s
        w = a.T @ (b - a @ x)
        if iterations > max_iter:
            break
    return x, float(np.linalg.norm(a @ x - b))


def _lstsq_on(a: np.ndarray, b: np.ndarray, passive: np.ndarray) -> np.ndarray:
    s = np.zeros(a.shape[1])
    if passive.any():
        s[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
    return s


@dataclass(frozen=True, slots=True)
class StepTimeFit:
    """The outcome of :func:`fit_step_time`."""

    coefficients: Coefficients
    theta: tuple[float, ...]  # feature weights (FEATURE_NAMES order)
    predicted_s: tuple[float, ...]  # the rebuilt model's step time per probe
    rel_errors: tuple[float, ...]  # (predicted - measured) / measured per probe
    rounds: int  # regime rounds run
    regimes_stable: bool  # the last round's regimes equalled the previous round's
    pinned: tuple[str, ...] = ()  # efficiencies pinned at 1.5 (their weight fell below 1/1.5)
    unused: tuple[str, ...] = field(default=())  # features that were zero on every probe
    extra_weights: tuple[float, ...] = ()  # fitted weights of ``extra_features`` (>= 0)

    @property
    def rms_rel_error(self) -> float:
        return math.sqrt(sum(e * e for e in self.rel_errors) / max(len(self.rel_errors), 1))


def fit_step_time(hardware: HardwareSpec, model: ModelSpec, tp: int,
                  batches: Sequence[StepBatch], times_s: Sequence[float], *,
                  base: Coefficients | None = None, max_rounds: int = 12,
                  extra_features: Sequence[Sequence[float]] | None = None) -> StepTimeFit:
    """Fit ``Coefficients`` so the roofline reproduces ``times_s`` for ``batches``.

    Args:
        hardware, model, tp: the deployment the times were measured on.
        batches: one ``StepBatch`` per measured step (or per probe, averaged).
        times_s: measured seconds, > 0, same length.
        base: coefficients whose efficiencies are kept where the data never exercise
            them (a zero weight) and that pick the first round's regimes.
        max_rounds: cap on the regime iterations.
        extra_features: per probe, further non-negative columns that are part of the
            measurement but not of a step, fitted alongside (weights >= 0) and left out of
            the coefficients; e.g. 1.0 for a probe measured as TTFT, whose weight is then
            the request overhead in seconds. Predictions and errors include them.

    Raises:
        ValueError: lengths differ, no data, or a non-positive time.
    """
    if len(batches) != len(times_s) or not batches:
        raise ValueError(f"need equal, non-zero numbers of batches ({len(batches)}) and "
                         f"times ({len(times_s)})")
    y = np.asarray(times_s, dtype=np.float64)
    if not np.all(np.isfinite(y)) or (y <= 0).any():
        raise ValueError("measured step times must be finite and > 0")
    base = base or Coefficients()
    extra = np.zeros((len(y), 0)) if extra_features is None else np.asarray(
        extra_features, dtype=np.float64).reshape(len(y), -1)
    best: StepTimeFit | None = None
    # Several starting regimes: the alternation below finds a local optimum of a
    # max-of-linear model, so it starts from the base coefficients, from "every kernel
    # group memory-bound" and from "every group compute-bound", and keeps the best.
    for start in _starts(base):
        fit = _alternate(hardware, model, tp, batches, y, extra, start, base, max_rounds)
        if best is None or fit.rms_rel_error < best.rms_rel_error - 1e-12:
            best = fit
    assert best is not None
    return best


def _starts(base: Coefficients) -> list[Coefficients]:
    slow, fast = 0.01, 1.5
    memory_bound = dataclasses.replace(base, weight_bw_eff=slow, kv_bw_eff=slow, mfu_prefill=fast,
                                       mfu_decode=fast, attn_prefill_eff=fast, attn_decode_eff=fast)
    compute_bound = dataclasses.replace(base, weight_bw_eff=fast, kv_bw_eff=fast, mfu_prefill=slow,
                                        mfu_decode=slow, attn_prefill_eff=slow,
                                        attn_decode_eff=slow)
    return [base, memory_bound, compute_bound]


def _alternate(hardware: HardwareSpec, model: ModelSpec, tp: int, batches: Sequence[StepBatch],
               y: np.ndarray, extra: np.ndarray, start: Coefficients, base: Coefficients,
               max_rounds: int) -> StepTimeFit:
    """Regimes from the current coefficients -> NNLS -> rebuild, until regimes repeat."""
    current = RooflineStepTimeModel(hardware, model, tp, start)
    best: StepTimeFit | None = None
    seen: set[bytes] = set()
    stable = False
    rnd = 0
    for rnd in range(1, max_rounds + 1):
        f = np.array([current.features(b) for b in batches], dtype=np.float64)
        regimes = (f != 0).tobytes()  # which feature is on, per probe
        stable = regimes in seen
        seen.add(regimes)
        theta_all, pinned = _fit_theta(np.hstack([f, extra]), y)
        theta_f = tuple(float(t) for t in theta_all[:f.shape[1]])  # plain floats: YAML
        extra_w = theta_all[f.shape[1]:]
        rebuilt = RooflineStepTimeModel.from_linear(hardware, model, tp, theta_f, base=base)
        pred = np.array([rebuilt.step_time_s(b) for b in batches]) + extra @ extra_w
        rel = (pred - y) / y
        used = (f != 0).any(axis=0)
        fit = StepTimeFit(
            coefficients=rebuilt.coefficients, theta=theta_f,
            predicted_s=tuple(float(p) for p in pred), rel_errors=tuple(float(e) for e in rel),
            rounds=rnd, regimes_stable=stable,
            pinned=tuple(FEATURE_NAMES[i] for i in pinned),
            unused=tuple(FEATURE_NAMES[i] for i, u in enumerate(used) if not u),
            extra_weights=tuple(float(w) for w in extra_w))
        if best is None or fit.rms_rel_error < best.rms_rel_error - 1e-12:
            best = fit
        if stable:
            break
        current = rebuilt
    assert best is not None
    return dataclasses.replace(best, rounds=rnd, regimes_stable=stable)


def _fit_theta(f: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Relative NNLS with efficiency weights either 0 or >= 1/1.5 (pin and refit)."""
    a = f / y[:, None]
    scale = np.where(np.abs(a).max(axis=0) > 0, np.abs(a).max(axis=0), 1.0)
    a_scaled = a / scale  # column scaling: features span 1 to 1e-9 s
    rhs = np.ones_like(y)
    pinned: list[int] = []
    free = np.ones(f.shape[1], dtype=bool)
    theta = np.zeros(f.shape[1])
    for _ in range(len(_EFFICIENCY_IDX) + 1):
        fixed = np.zeros(f.shape[1])
        for i in pinned:
            fixed[i] = _MIN_EFF_WEIGHT
        x, _ = nnls(a_scaled[:, free], rhs - a @ fixed)
        theta = fixed.copy()
        theta[free] = x / scale[free]
        low = [i for i in _EFFICIENCY_IDX if free[i] and 0.0 < theta[i] < _MIN_EFF_WEIGHT]
        if not low:
            break
        pinned += low
        free[low] = False
    return theta, pinned
