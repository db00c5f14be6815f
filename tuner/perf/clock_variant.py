"""Clock variants: the step-time model with its parts scaled, for picks that survive a
wrong clock.

The per-kernel clock is a fit: on series it never saw it is off by the error bands
(:mod:`tuner.perf.fit.bands`: TPOT about x0.65-1.54 on AMD, throughput x0.43-2.3), and a
scheduler setting that wins by a few per cent under the nominal clock may lose under a
clock that is as likely. A :class:`ClockVariant` scales the four parts of a step whose
errors are independent in the fit:

* ``prefill``: the GPU time of the prompt tokens of a step (compute-bound GEMMs and
  causal attention);
* ``decode``: the GPU time of its decode tokens (weight and KV reads);
* ``cpu``: the engine core's CPU time (scheduling, input preparation, output processing;
  what async scheduling overlaps);
* ``transfer``: the time on the GPU links (tensor-parallel all-reduce, the expert-parallel
  all-to-all).

A mixed step's GPU time (less its transfers) is split between prefill and decode by their
share of the step's tokens: the model prices the GEMMs of all tokens together, so there
is no finer split to scale. ``tuner.tune.robust`` draws the variants from the bands and
replays the front's best points under them; :func:`tuner.perf.presets.resolve_target`
wraps a target's model when ``Target.clock`` is set. Plain Python (tests/test_layering.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tuner.errors import ConfigError
from tuner.perf.step_time import StepTimeModel
from tuner.sim.batch import StepBatch

#: The parts a variant scales, in the order of :meth:`ClockVariant.factors`.
PARTS = ("prefill", "decode", "cpu", "transfer")


@dataclass(frozen=True, slots=True)
class ClockVariant:
    """Multiplicative factors on the parts of every step (1.0: the nominal clock)."""

    prefill: float = 1.0  # GPU time of prompt tokens
    decode: float = 1.0  # GPU time of decode tokens
    cpu: float = 1.0  # engine-core CPU time per step and per request
    transfer: float = 1.0  # all-reduce and all-to-all time

    def __post_init__(self) -> None:
        for name in PARTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"clock variant {name}={value!r}: must be a positive number")

    def factors(self) -> tuple[float, float, float, float]:
        return (self.prefill, self.decode, self.cpu, self.transfer)

    @property
    def nominal(self) -> bool:
        return self.factors() == (1.0, 1.0, 1.0, 1.0)

    def describe(self) -> str:
        """``prefill x1.45, decode x0.69, CPU x1.45, transfer x0.69``."""
        names = ("prefill", "decode", "CPU", "transfer")
        return ", ".join(f"{n} x{f:.2f}" for n, f in zip(names, self.factors()))

    def to_dict(self) -> dict[str, float]:
        return {name: round(float(getattr(self, name)), 4) for name in PARTS}


def transfer_s(model: Any, batch: StepBatch) -> float:
    """The link time inside ``model``'s step for ``batch`` (0 for a model without one)."""
    method = getattr(model, "transfer_s", None)
    return float(method(batch)) if method is not None else 0.0


class VariantStepTimeModel(StepTimeModel):
    """``inner`` with its step parts scaled by ``variant`` (see the module docstring).

    Only the replays of the robust check use it; every other replay prices with the
    inner model directly, so the golden digests and the hot path are untouched.
    """

    def __init__(self, inner: StepTimeModel, variant: ClockVariant) -> None:
        self.inner = inner
        self.variant = variant
        self.couples_ranks = bool(getattr(inner, "couples_ranks", False))
        # what resolve_target and the bands read off a model
        self.expert_layout = getattr(inner, "expert_layout", None)
        self.hardware = getattr(inner, "hardware", None)
        self.model = getattr(inner, "model", None)
        self.tp = getattr(inner, "tp", 1)

    def _scaled(self, batch: StepBatch, cpu: float, gpu: float) -> tuple[float, float]:
        v = self.variant
        npt, ndr = batch.num_prefill_tokens, batch.num_decode_reqs
        tokens = npt + ndr
        if tokens <= 0:
            return cpu * v.cpu, gpu
        link = transfer_s(self.inner, batch)
        if link > gpu:
            link = gpu
        share = npt / tokens
        compute = (gpu - link) * (v.decode + (v.prefill - v.decode) * share)
        return cpu * v.cpu, compute + link * v.transfer

    def step_parts_s(self, batch: StepBatch) -> tuple[float, float]:
        cpu, gpu = self.inner.step_parts_s(batch)
        return self._scaled(batch, cpu, gpu)

    def step_time_s(self, batch: StepBatch) -> float:
        cpu, gpu = self.step_parts_s(batch)
        return cpu + gpu

    def cpu_s(self, batch: StepBatch) -> float:
        return self.inner.cpu_s(batch) * self.variant.cpu

    def rank_step_time_s(self, batch: StepBatch, group_tokens: int) -> float:
        """The inner rank price, scaled as the rank's own step is."""
        base = self.inner.step_time_s(batch)
        rank = self.inner.rank_step_time_s(batch, group_tokens)
        if base <= 0:
            return rank
        return rank * self.step_time_s(batch) / base

    def describe(self) -> str:
        inner = getattr(self.inner, "describe", None)
        head = inner() if inner is not None else type(self.inner).__name__
        return f"{head}; clock variant {self.variant.describe()}"


def with_variant(model: StepTimeModel, variant: ClockVariant | None) -> StepTimeModel:
    """``model`` under ``variant`` (the model itself for None or the nominal clock)."""
    if variant is None or variant.nominal:
        return model
    return VariantStepTimeModel(model, variant)


__all__ = ["ClockVariant", "PARTS", "VariantStepTimeModel", "transfer_s", "with_variant"]
