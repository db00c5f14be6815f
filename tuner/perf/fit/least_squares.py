"""Bounded, prior-regularised least squares over named physical parameters.

Both fits of the step-time model use it: ``tuner calibrate --launch/--endpoint``
(measured step times of one server, :mod:`tuner.perf.fit.to_probes`) and ``tuner
calibrate --from-benchmarks`` (serving benchmark rows,
:mod:`tuner.perf.fit.to_benchmarks`); :func:`nnls` solves the linear, non-negative case.
Every parameter is physical and bounded (an efficiency in (0, 1], a floor in seconds),
so the fit runs in a squashed log space: ``v = lo * (hi/lo) ** sigmoid(z)`` keeps every
iterate inside its bounds, and a Gaussian prior on ``log v`` (width ``sigma``, in
e-folds) keeps parameters the data barely touch near their physical priors instead of
letting them absorb noise. The solver is Levenberg-Marquardt with a forward-difference
Jacobian: the models are cheap to evaluate vectorised, and a handful of parameters needs
no analytic gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Param:
    """One fitted quantity: its name, bounds, prior value and prior width (e-folds)."""

    name: str
    lo: float
    hi: float
    prior: float
    sigma: float = 1.0  # log-space prior width; math.inf = no prior

    def __post_init__(self) -> None:
        if not 0 < self.lo < self.hi:
            raise ValueError(f"{self.name}: bounds must satisfy 0 < lo < hi, got "
                             f"{self.lo}, {self.hi}")

    def clip(self, value: float) -> float:
        span = self.hi / self.lo
        return min(max(value, self.lo * span ** 1e-6), self.hi / span ** 1e-6)


@dataclass(frozen=True, slots=True)
class FitResult:
    values: dict[str, float]
    residuals: np.ndarray  # data residuals at the optimum (no prior terms)
    iterations: int
    converged: bool
    at_bounds: tuple[str, ...]  # parameters within 1 % (log) of a bound


def _to_z(p: Param, v: float) -> float:
    u = math.log(p.clip(v) / p.lo) / math.log(p.hi / p.lo)
    return math.log(u / (1.0 - u))


def _from_z(p: Param, z: float) -> float:
    u = 1.0 / (1.0 + math.exp(-max(-40.0, min(40.0, z))))
    return p.lo * (p.hi / p.lo) ** u


def fit_params(residual: Callable[[Mapping[str, float]], np.ndarray], params: Sequence[Param],
               start: Mapping[str, float] | None = None, *, max_iter: int = 60,
               tol: float = 1e-9) -> FitResult:
    """Minimise ``|residual(v)|^2 + sum(((log v - log prior) / sigma)^2)`` within bounds.

    Args:
        residual: named values -> data residuals (e.g. log(predicted / measured)).
        params: what to fit; start from ``start`` (default: the priors).
    """
    params = list(params)
    z = np.array([_to_z(p, (start or {}).get(p.name, p.prior)) for p in params])

    def values(zv: np.ndarray) -> dict[str, float]:
        return {p.name: _from_z(p, float(zi)) for p, zi in zip(params, zv)}

    def full(zv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        v = values(zv)
        r = np.asarray(residual(v), dtype=np.float64)
        prior = np.array([0.0 if math.isinf(p.sigma) else
                          math.log(v[p.name] / p.prior) / p.sigma for p in params])
        return np.concatenate([r, prior]), r

    res, data = full(z)
    cost = float(res @ res)
    lam = 1e-2
    converged = False
    it = 0
    for it in range(1, max_iter + 1):
        jac = np.empty((res.size, z.size))
        for j in range(z.size):
            dz = z.copy()
            dz[j] += 1e-5
            jac[:, j] = (full(dz)[0] - res) / 1e-5
        jtj, jtr = jac.T @ jac, jac.T @ res
        improved = False
        for _ in range(12):
            step = np.linalg.solve(jtj + lam * np.diag(np.diag(jtj) + 1e-12), -jtr)
            z_new = z + step
            res_new, data_new = full(z_new)
            cost_new = float(res_new @ res_new)
            if cost_new < cost:
                improved = True
                rel = (cost - cost_new) / max(cost, 1e-300)
                z, res, data, cost = z_new, res_new, data_new, cost_new
                lam = max(lam / 3.0, 1e-9)
                break
            lam *= 4.0
        if not improved or rel < tol:
            converged = True
            break
    v = values(z)
    at_bounds = tuple(p.name for p in params
                      if min(math.log(v[p.name] / p.lo), math.log(p.hi / v[p.name]))
                      < 0.01 * math.log(p.hi / p.lo))
    return FitResult(values=v, residuals=data, iterations=it, converged=converged,
                     at_bounds=at_bounds)


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
