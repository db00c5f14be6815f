"""Publish or keep: a paired bootstrap over requests of two replays.

Both settings (the current profile's and the candidate's) replay the same requests, so
results pair by ``request_id``. One bootstrap draw resamples request ids with
replacement and recomputes each decision objective for both replays on that sample; the
relative improvement is ``(candidate - current) / |current|`` (sign flipped for ``min``
objectives). Over ``n_boot`` draws, the lower confidence bound is the ``1 - confidence``
quantile (one-sided).

Rule (docs/retune.md): publish iff, for every decision objective, the lower bound exceeds
``margin`` on the held-out slice **and** on the whole window, and the candidate's
settings differ from the current ones. Otherwise keep.

Objectives computed per request (the definitions in docs/metrics.md):

* ``p90_interactivity``: 1 / the 90th percentile of per-request mean inter-token latency;
* ``output_throughput_per_gpu`` / ``total_throughput_per_gpu``: finished output (or
  input + output) tokens / (last finish - first arrival) / GPUs;
* ``ttft_p90_s`` (min): 90th percentile of time to first token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tuner.errors import ConfigError

#: objective -> direction (+1 = larger is better)
BOOTSTRAP_OBJECTIVES = {"p90_interactivity": 1, "output_throughput_per_gpu": 1,
                        "total_throughput_per_gpu": 1, "ttft_p90_s": -1}


@dataclass(frozen=True)
class Comparison:
    """One objective on one slice: point estimates and the bootstrap bound."""

    objective: str
    current: float
    candidate: float
    improvement: float  # relative, on all requests (sign: + = better)
    lower: float  # one-sided lower confidence bound of the improvement
    upper: float  # the matching upper bound (1 - lower's quantile)

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else
                    (None if isinstance(v, float) else v))
                for k, v in self.__dict__.items()}


def check_objectives(names: Sequence[str]) -> None:
    for name in names:
        if name not in BOOTSTRAP_OBJECTIVES:
            raise ConfigError(f"decide_on: {name!r} cannot be bootstrapped per request; use "
                              f"{', '.join(BOOTSTRAP_OBJECTIVES)}")


def _arrays(result: Any, ids: list[str]) -> dict[str, np.ndarray]:
    by_id = {r.request_id: r for r in result.requests}
    rows = [by_id[i] for i in ids]
    return {
        "arrival": np.array([r.arrival_s for r in rows]),
        "finish": np.array([r.finish_s for r in rows]),
        "first": np.array([r.first_token_s for r in rows]),
        "itl": np.array([r.mean_itl_s for r in rows]),
        "out": np.array([r.output_len if r.status == "finished" else 0 for r in rows], float),
        "inp": np.array([r.input_len if r.status == "finished" else 0 for r in rows], float),
    }


def _metric(name: str, a: dict[str, np.ndarray], idx: np.ndarray, gpus: int) -> np.ndarray:
    """``name`` for each row of the index matrix ``idx`` (draws x requests)."""
    if name == "p90_interactivity":
        return 1.0 / np.nanquantile(a["itl"][idx], 0.9, axis=1)
    if name == "ttft_p90_s":
        return np.nanquantile(a["first"][idx] - a["arrival"][idx], 0.9, axis=1)
    span = np.nanmax(a["finish"][idx], axis=1) - np.min(a["arrival"][idx], axis=1)
    tokens = a["out"][idx].sum(axis=1)
    if name == "total_throughput_per_gpu":
        tokens = tokens + a["inp"][idx].sum(axis=1)
    return tokens / span / gpus


def compare_replays(current: Any, candidate: Any, objectives: Sequence[str], *,
                    confidence: float, n_boot: int = 1000, seed: int = 0,
                    num_gpus: int = 1) -> list[Comparison]:
    """Paired bootstrap of ``objectives`` between two ``ReplayResult`` of one trace."""
    ids = sorted({r.request_id for r in current.requests}
                 & {r.request_id for r in candidate.requests})
    if len(ids) < 2:
        raise ConfigError("too few requests in the evaluation slice to compare (need >= 2)")
    a, b = _arrays(current, ids), _arrays(candidate, ids)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(ids), size=(n_boot, len(ids)))
    every = np.arange(len(ids))[None, :]
    out = []
    with np.errstate(all="ignore"):
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for name in objectives:
                sign = BOOTSTRAP_OBJECTIVES[name]
                cur0 = float(_metric(name, a, every, num_gpus)[0])
                cand0 = float(_metric(name, b, every, num_gpus)[0])
                cur, cand = _metric(name, a, draws, num_gpus), _metric(name, b, draws, num_gpus)
                rel = sign * (cand - cur) / np.abs(cur)
                rel = rel[np.isfinite(rel)]
                point = sign * (cand0 - cur0) / abs(cur0) if cur0 else float("nan")
                lo = float(np.quantile(rel, 1 - confidence)) if len(rel) else float("nan")
                hi = float(np.quantile(rel, confidence)) if len(rel) else float("nan")
                out.append(Comparison(name, cur0, cand0, float(point), lo, hi))
    return out


def decide(window: list[Comparison], holdout: list[Comparison], *, margin: float,
           same_settings: bool) -> tuple[str, str]:
    """``("publish" | "keep", reason)`` by the rule in the module docstring."""
    if same_settings:
        return "keep", "the candidate's settings equal the current profile's"
    for where, comps in (("held-out slice", holdout), ("window", window)):
        for c in comps:
            if not (math.isfinite(c.lower) and c.lower > margin):
                return "keep", (f"{c.objective} on the {where}: improvement lower bound "
                                f"{c.lower:+.2%} does not clear the margin {margin:+.2%}")
    names = ", ".join(c.objective for c in window)
    return "publish", f"{names}: lower bounds clear the margin {margin:+.2%} on both slices"
