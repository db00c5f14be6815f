"""``num_speculative_tokens`` (and on/off) as a dimension of a study, and what speculative
decoding buys the pick.

Why a deployment dimension and not a ``SchedulerSettings`` field: vLLM reads ``k`` from
``--speculative-config``, not from ``SchedulerConfig``, and the twin from
``SimOptions.speculative``; so the drawn value travels with the point's deployment
(``Deployment.num_speculative_tokens``, recorded in the study beside the split and the
router) and the evaluator turns it into the replay's ``SpecDecoding``
(:func:`spec_at`). The drafter (method) and its acceptance are the study's
``--speculative-config`` / ``--spec-acceptance``; a point at ``k`` keeps them, the rates cut
or continued geometrically (``SpecDecoding.with_k``), and ``k = 0`` replays the engine
without speculative decoding. The baseline runs the config's own ``k``.

After the pick, :func:`spec_gain` replays it once more with speculative decoding toggled
(``k = 0`` for a pick that drafts, the config's ``k`` for one that does not), same
scheduler settings and split, on the held-out window: the difference is what speculative
decoding itself buys on this traffic, apart from the scheduler settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tuner.errors import ConfigError
from tuner.tune.space import SPEC_TOKENS, Param, SearchSpace

#: The metrics the gain line reports beside the study's objectives.
GAIN_KEYS = ("p90_interactivity", "output_throughput_per_gpu", "ttft_p90_s")


def spec_at(base: Any, k: int | None) -> Any:
    """The replay's ``SpecDecoding`` at ``k`` drafts: ``base`` for None (the study's own),
    off for 0, ``base`` at ``k`` otherwise."""
    if k is None:
        return base
    if k == 0:
        return None
    if base is None:
        raise ConfigError(f"num_speculative_tokens={k} needs --speculative-config (the "
                          "drafter and its acceptance)")
    return base.with_k(int(k))


def spec_from_record(raw: Any) -> Any:
    """A study's recorded ``speculative`` (``SpecDecoding.to_dict``) back, or None."""
    if raw is None:
        return None
    from tuner.sim.spec_decode import SpecDecoding

    return SpecDecoding.from_dict(raw)


def parse_spec_tokens(text: str | None) -> tuple[int, ...] | None:
    """``--spec-tokens 0,1,2,3``: the ``num_speculative_tokens`` values a study searches."""
    if text is None:
        return None
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"--spec-tokens {text!r}: integers like 0,1,2,3 (0 = off)") from None
    if not values or any(v < 0 for v in values) or len(set(values)) != len(values):
        raise ConfigError(f"--spec-tokens {text!r}: distinct integers >= 0 (0 = off)")
    if values == (0,):
        raise ConfigError("--spec-tokens 0: only 'off' is no search; drop "
                          "--speculative-config instead")
    return values


def with_spec_tokens(space: SearchSpace, speculative: Any,
                     choices: Sequence[int] | None) -> SearchSpace:
    """``space`` with ``num_speculative_tokens`` searched over ``choices`` (None: not,
    unless the space file names it). Either way a searched ``k`` needs ``speculative``."""
    if choices is not None:
        if SPEC_TOKENS in space.names:
            raise ConfigError(f"--spec-tokens: the search space {space.name!r} already "
                              f"varies {SPEC_TOKENS}")
        space = SearchSpace(space.name + "+spec", space.params + (
            Param(SPEC_TOKENS, "categorical", choices=tuple(int(c) for c in choices)),))
    if SPEC_TOKENS not in space.names:
        return space
    if speculative is None:
        raise ConfigError(f"searching {SPEC_TOKENS} needs --speculative-config (the "
                          "drafter and its acceptance), e.g. '{\"method\": \"mtp\", "
                          "\"num_speculative_tokens\": 1}'")
    per_batch = speculative.vllm_config.get("num_speculative_tokens_per_batch_size")
    if per_batch:
        raise ConfigError(f"searching {SPEC_TOKENS} with num_speculative_tokens_per_batch_"
                          "size in --speculative-config: the map fixes k per batch size; "
                          "search one or the other")
    return space


@dataclass(frozen=True, slots=True)
class SpecGain:
    """The pick replayed with speculative decoding toggled (see the module docstring)."""

    method: str  # the drafter: mtp, eagle, eagle3 or ngram
    k: int  # the pick's num_speculative_tokens (0: the pick does not draft)
    other_k: int  # the k of the comparison replay (0 when the pick drafts)
    window: str  # "holdout" or "train": where both were replayed
    with_spec: dict[str, Any] = field(default_factory=dict)  # metrics with drafts (k > 0)
    without: dict[str, Any] = field(default_factory=dict)  # metrics at k = 0

    def delta_pct(self, key: str) -> float | None:
        a, b = self.with_spec.get(key), self.without.get(key)
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not b:
            return None
        return round((a - b) / abs(b) * 100.0, 2)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "num_speculative_tokens": self.k,
                "compared_with": self.other_k, "window": self.window,
                "with_spec": dict(self.with_spec), "without": dict(self.without),
                "delta_pct": {k: self.delta_pct(k) for k in self.with_spec
                              if self.delta_pct(k) is not None}}

    def line(self) -> str:
        """``speculative decoding (mtp k=2) against k = 0 on the held-out window: ...``"""
        drafting = max(self.k, self.other_k)
        parts = []
        for key in GAIN_KEYS:
            d = self.delta_pct(key)
            if d is not None:
                parts.append(f"{key} {self.without[key]:.4g} -> {self.with_spec[key]:.4g} "
                             f"({d:+.1f} %)")
        where = "held-out" if self.window == "holdout" else "training"
        head = (f"speculative decoding ({self.method} k={drafting}) against k = 0 at the "
                f"pick's settings, {where} window: ")
        tail = "" if self.k else " -- the pick does not draft"
        return head + "; ".join(parts) + tail


def spec_gain(evaluator: Any, point: Any, *, window: str) -> SpecGain | None:
    """:class:`SpecGain` of ``point`` (a ``tuner.tune.select.Point``), or None when the
    study has no speculative decoding or its evaluator replays no deployment."""
    from tuner.tune.deployment_space import split_settings

    base = getattr(evaluator, "speculative", None)
    if base is None or not hasattr(evaluator, "default_deployment"):
        return None
    settings, deployment = split_settings(point.settings)
    deployment = deployment or evaluator.default_deployment
    k = deployment.num_speculative_tokens
    k = base.num_speculative_tokens if k is None else int(k)
    other = 0 if k else base.num_speculative_tokens
    mine = point.holdout if window == "holdout" else point.metrics
    if not mine:
        mine = evaluator.evaluate(settings, window, deployment=replace(
            deployment, num_speculative_tokens=k))
    theirs = evaluator.evaluate(settings, window, deployment=replace(
        deployment, num_speculative_tokens=other))
    with_spec, without = (mine, theirs) if k else (theirs, mine)
    keys = dict.fromkeys(GAIN_KEYS)
    return SpecGain(method=base.method, k=k, other_k=other, window=window,
                    with_spec={key: with_spec.get(key) for key in keys},
                    without={key: without.get(key) for key in keys})


def profile_speculative(evaluator_spec: dict[str, Any],
                        deployment: dict[str, Any]) -> dict[str, Any] | None:
    """A profile's ``target.speculative`` for the pick: the study's config at the pick's
    ``k`` (None: off, or a study without speculative decoding)."""
    raw = evaluator_spec.get("speculative")
    if raw is None:
        return None
    spec = spec_at(spec_from_record(raw), deployment.get("num_speculative_tokens"))
    return None if spec is None else spec.to_dict()


__all__ = ["GAIN_KEYS", "SpecGain", "parse_spec_tokens", "profile_speculative", "spec_at",
           "spec_from_record", "spec_gain", "with_spec_tokens"]
