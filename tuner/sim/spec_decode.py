"""Speculative decoding as the scheduler sees it: vLLM's ``--speculative-config`` and the
acceptance outcomes a replay draws.

What the scheduler of vLLM 0.33.0 knows of speculative decoding (file:line under
``vllm/``) is a handful of numbers, modelled here:

* ``num_speculative_tokens`` ``k`` (``VllmConfig.num_speculative_tokens``,
  config/vllm.py:612): the drafts a request carries into its next decode step
  (``Request.spec_token_ids``), counted in its demand (``num_tokens_with_spec``,
  v1/core/sched/scheduler.py:839-843);
* ``num_lookahead_tokens`` (config/vllm.py:626-653): KV slots reserved past the scheduled
  tokens in ``allocate_slots`` (kv_cache_manager.py:550-553): ``k`` for drafters with a
  forward pass of their own (eagle, eagle3, mtp), 0 for n-gram;
* the accepted count per verify, which the model runner reports as ``1 + accepted``
  sampled tokens (scheduler.py:2346-2364).

The acceptance is the twin's input: a per-position profile of *unconditional* rates
``a_i = P(num_accepted >= i)``, non-increasing, as vLLM's synthetic rejection sampler
takes it (``SpeculativeConfig.synthetic_acceptance_rates``, config/speculative.py:571) and
as its ``SpecDecoding metrics`` log line reports it ("Per-position acceptance rate",
v1/spec_decode/metrics.py:121). A mean acceptance length ``L`` becomes rates by vLLM's
own minimum-variance schedule (``_acceptance_length_to_rates``, config/speculative.py:590).

Each verify draws one uniform number from ``(seed, request_id, position)``, the position
being the request's known tokens when the output is applied, so the twin and the
vLLM-core driver, whose schedulers reach the same state, draw the same outcome; the
number of accepted drafts is how many rates exceed it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import ConfigError

#: Methods the twin schedules, and whether their drafter has a forward pass of its own
#: (then vLLM reserves ``k`` lookahead KV slots: config/vllm.py:646-652).
METHODS: dict[str, bool] = {"ngram": False, "eagle": True, "eagle3": True, "mtp": True}

#: ``--speculative-config`` keys the twin reads; any other key is refused by name (a
#: setting the twin cannot model must not be silently dropped).
_KNOWN_KEYS = {"method", "num_speculative_tokens", "model", "prompt_lookup_max",
               "prompt_lookup_min", "rejection_sample_method", "synthetic_acceptance_rates",
               "synthetic_acceptance_length", "draft_tensor_parallel_size", "quantization",
               "disable_padded_drafter_batch", "num_speculative_tokens_per_batch_size"}
#: Keys vLLM has whose scheduling effect the twin does not model yet.
_UNMODELLED = {"parallel_drafting": "parallel drafting (extra drafting slots)"}

#: ``num_speculative_tokens_per_batch_size`` normalised: ``(first, last, k)`` inclusive
#: batch-size ranges, sorted, the first starting at 1 (v1/spec_decode/dynamic/utils.py).
BatchSchedule = tuple[tuple[int, int, int], ...]


def parse_batch_schedule(raw: Any, where: str) -> BatchSchedule:
    """vLLM's ``validate_and_normalize_dynamic_sd_schedule`` (v1/spec_decode/dynamic/
    utils.py:7-75): the same checks, as one-line ConfigErrors naming the key."""
    key = f"{where}: num_speculative_tokens_per_batch_size"
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{key}: a non-empty list of [range_start, range_end, "
                          "num_speculative_tokens] entries")
    entries = []
    for i, entry in enumerate(raw):
        if (not isinstance(entry, (list, tuple)) or len(entry) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in entry)):
            raise ConfigError(f"{key}[{i}]: expected [range_start, range_end, "
                              f"num_speculative_tokens] integers, got {entry!r}")
        start, end, k = entry
        if start <= 0 or end <= 0 or start > end:
            raise ConfigError(f"{key}[{i}]: batch-size range ({start}, {end}) must be "
                              "positive with start <= end")
        if k < 0:
            raise ConfigError(f"{key}[{i}]: num_speculative_tokens {k} must be >= 0")
        entries.append((start, end, k))
    entries.sort(key=lambda e: e[0])
    previous_end = 0
    for start, end, _ in entries:
        if start <= previous_end:
            raise ConfigError(f"{key}: batch-size ranges must not overlap")
        previous_end = end
    if entries[0][0] != 1:
        raise ConfigError(f"{key}: the first batch-size range must start at 1 (every batch "
                          "size needs a k)")
    return tuple(entries)


def rates_from_length(length: float, k: int) -> tuple[float, ...]:
    """vLLM's minimum-variance schedule for a mean acceptance length (config/
    speculative.py:590-597): ``floor(L - 1)`` sure positions, one fractional, zeros."""
    if not 1.0 <= length <= k + 1:
        raise ConfigError(f"mean acceptance length {length} must be in [1, {k + 1}] "
                          f"for num_speculative_tokens={k}")
    drafts = length - 1.0
    full = int(drafts)
    return tuple(([1.0] * full + [drafts - full] + [0.0] * (k - full - 1))[:k])


def parse_acceptance(text: str, k: int) -> tuple[float, ...]:
    """``--spec-acceptance``: comma-separated per-position rates (``0.8,0.6,0.45``) or one
    mean acceptance length (``2.4``, a number above 1). Rates shorter than ``k`` are
    extended by their last ratio ``a_n / a_(n-1)`` (a geometric tail; one rate ``a``
    means ``a_i = a ** i``, a constant per-draft acceptance); longer are cut."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ConfigError(f"--spec-acceptance {text!r}: expected rates like 0.8,0.6,0.45 "
                          "or a mean acceptance length like 2.4") from None
    if not values or any(not math.isfinite(v) for v in values):
        raise ConfigError(f"--spec-acceptance {text!r}: no finite value")
    if len(values) == 1 and values[0] > 1.0:
        return rates_from_length(values[0], k)
    return check_rates(extend_rates(values, k), f"--spec-acceptance {text!r}")


def extend_rates(values: list[float], k: int) -> tuple[float, ...]:
    """``values`` cut or extended to ``k`` positions (geometric tail, see above)."""
    out = list(values[:k])
    ratio = out[-1] / out[-2] if len(out) >= 2 and out[-2] > 0 else out[-1]
    while len(out) < k:
        out.append(out[-1] * ratio)
    return tuple(out)


def check_rates(rates: tuple[float, ...], where: str) -> tuple[float, ...]:
    """Refuse what vLLM's synthetic sampler refuses (config/speculative.py:612-625)."""
    if any(not 0.0 <= r <= 1.0 for r in rates):
        raise ConfigError(f"{where}: acceptance rates must be in [0, 1], got {list(rates)}")
    if any(rates[i] > rates[i - 1] for i in range(1, len(rates))):
        raise ConfigError(f"{where}: acceptance rates must be non-increasing (position i "
                          f"counts drafts whose first i tokens were all accepted), "
                          f"got {list(rates)}")
    return rates


@dataclass(frozen=True, slots=True)
class SpecDecoding:
    """Speculative decoding of one deployment, as the twin schedules it.

    ``vllm_config`` is the ``--speculative-config`` JSON as given (exported unchanged, so
    the profile deploys what was replayed); the other fields are read from it or from
    ``--spec-acceptance``.
    """

    method: str  # vLLM's SpeculativeConfig.method: ngram, eagle, eagle3 or mtp
    num_speculative_tokens: int  # k: drafts per request per decode step (>= 1)
    acceptance: tuple[float, ...]  # P(num_accepted >= i) for i = 1..k, non-increasing
    seed: int = 0  # seeds the per-request, per-step acceptance draw
    vllm_config: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    #: ``num_speculative_tokens_per_batch_size`` (dynamic speculative decoding); () = a
    #: fixed k. Each step's k is :meth:`k_for_batch` of its scheduled requests.
    per_batch_size: BatchSchedule = ()

    def k_for_batch(self, num_reqs: int) -> int:
        """The drafts per request of a step that schedules ``num_reqs`` requests
        (``Scheduler.dynamic_sd_lookup[len(num_scheduled_tokens)]``, scheduler.py:
        1710-1714): the k of the last range starting at or below ``num_reqs`` (a gap or
        the tail carries the previous range's k, as ``build_dynamic_sd_schedule_lookup``
        fills it), at most ``num_speculative_tokens``; the fixed k without a schedule or
        with nothing scheduled."""
        if not self.per_batch_size or num_reqs <= 0:
            return self.num_speculative_tokens
        k = self.per_batch_size[0][2]
        for start, _, value in self.per_batch_size:
            if start > num_reqs:
                break
            k = value
        return min(k, self.num_speculative_tokens)

    def k_lookup(self, max_num_seqs: int) -> list[int] | None:
        """:meth:`k_for_batch` for batch sizes ``0..max_num_seqs`` (vLLM's dense table;
        index 0 is unused there), None without a schedule."""
        if not self.per_batch_size:
            return None
        return [self.k_for_batch(n) for n in range(max_num_seqs + 1)]

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots ``allocate_slots`` reserves past the scheduled tokens (config/
        vllm.py:626-653: ``k`` for eagle, eagle3 and mtp, none for n-gram)."""
        return self.num_speculative_tokens if METHODS[self.method] else 0

    @property
    def mean_acceptance_length(self) -> float:
        """Expected tokens per verify, bonus token included (metrics.py's convention)."""
        return 1.0 + sum(self.acceptance)

    def num_accepted(self, request_id: str, position: int, num_drafts: int) -> int:
        """Accepted drafts of the verify of ``request_id`` whose output is applied when
        it knows ``position`` tokens; at most ``num_drafts`` (the drafts scheduled)."""
        digest = hashlib.blake2b(f"{self.seed}:{request_id}:{position}".encode(),
                                 digest_size=8).digest()
        u = int.from_bytes(digest, "little") / 18446744073709551616.0
        accepted = 0
        for rate in self.acceptance:
            if accepted >= num_drafts or u >= rate:
                break
            accepted += 1
        return accepted

    def to_dict(self) -> dict[str, Any]:
        """What a profile records (``from_dict`` reads it back)."""
        return {"speculative_config": dict(self.vllm_config),
                "acceptance": list(self.acceptance), "seed": self.seed}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SpecDecoding":
        acceptance = ",".join(str(a) for a in data.get("acceptance") or []) or None
        return from_vllm_config(data["speculative_config"], acceptance,
                                seed=int(data.get("seed", 0)))

    def with_k(self, k: int) -> "SpecDecoding":
        """The same drafter and acceptance at ``k`` drafts per step (a search point of
        ``num_speculative_tokens``): the rates cut or continued geometrically
        (:func:`extend_rates`), the config's ``num_speculative_tokens`` set to ``k`` and
        its synthetic rates, if it had any, replaced by the new ones."""
        if k == self.num_speculative_tokens:
            return self
        rates = extend_rates(list(self.acceptance), k)
        config = {key: v for key, v in self.vllm_config.items()
                  if key not in ("synthetic_acceptance_rates", "synthetic_acceptance_length")}
        config["num_speculative_tokens"] = k
        if any(key in self.vllm_config for key in ("synthetic_acceptance_rates",
                                                   "synthetic_acceptance_length")):
            config["synthetic_acceptance_rates"] = list(rates)
        return SpecDecoding(method=self.method, num_speculative_tokens=k, acceptance=rates,
                            seed=self.seed, vllm_config=config,
                            per_batch_size=self.per_batch_size)

    def describe(self) -> str:
        rates = ",".join(f"{a:.3g}" for a in self.acceptance)
        dynamic = ""
        if self.per_batch_size:
            dynamic = " per batch size " + ", ".join(
                f"{a}-{b}: {min(k, self.num_speculative_tokens)}"
                for a, b, k in self.per_batch_size)
        return (f"{self.method} k={self.num_speculative_tokens}{dynamic}, acceptance {rates} "
                f"(mean acceptance length {self.mean_acceptance_length:.2f})")


def from_vllm_config(config: str | dict[str, Any], acceptance: str | None = None, *,
                     seed: int = 0, default_rates: Any = None,
                     where: str = "--speculative-config") -> SpecDecoding:
    """Read vLLM's ``--speculative-config`` (a JSON object or its text).

    The acceptance comes from ``acceptance`` (``--spec-acceptance``) if given, else from
    the config's own ``synthetic_acceptance_rates`` / ``synthetic_acceptance_length``,
    else from ``default_rates(method, k)`` (published measurements:
    ``tuner.perf.spec_decode.default_acceptance``); without any, it is refused.
    """
    data = _as_object(config, where)
    unknown = sorted(set(data) - _KNOWN_KEYS - set(_UNMODELLED))
    if unknown:
        raise ConfigError(f"{where}: unknown or unmodelled key(s) {unknown}; the twin reads "
                          f"{sorted(_KNOWN_KEYS)}")
    for key, what in _UNMODELLED.items():
        if data.get(key) not in (None, False):
            raise ConfigError(f"{where}: {key} ({what}) is not modelled by the twin yet")
    method = data.get("method")
    if method not in METHODS:
        raise ConfigError(f"{where}: method {method!r} is not modelled; one of "
                          f"{sorted(METHODS)}")
    k = data.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ConfigError(f"{where}: num_speculative_tokens must be an integer >= 1, got {k!r}")
    if acceptance is not None:
        rates = parse_acceptance(acceptance, k)
    elif data.get("synthetic_acceptance_rates") is not None:
        given = [float(v) for v in data["synthetic_acceptance_rates"]]
        if len(given) != k:
            raise ConfigError(f"{where}: synthetic_acceptance_rates must have length {k}")
        rates = check_rates(tuple(given), where)
    elif data.get("synthetic_acceptance_length") is not None:
        rates = rates_from_length(float(data["synthetic_acceptance_length"]), k)
    elif default_rates is not None:
        rates = extend_rates(list(default_rates(method, k)), k)
    else:
        raise ConfigError(f"{where}: no acceptance given (--spec-acceptance, or "
                          "synthetic_acceptance_rates in the config)")
    schedule: BatchSchedule = ()
    if data.get("num_speculative_tokens_per_batch_size") is not None:
        schedule = parse_batch_schedule(data["num_speculative_tokens_per_batch_size"], where)
    return SpecDecoding(method=method, num_speculative_tokens=k, acceptance=rates,
                        seed=seed, vllm_config=data, per_batch_size=schedule)


def _as_object(config: str | dict[str, Any], where: str) -> dict[str, Any]:
    if isinstance(config, dict):
        return dict(config)
    try:
        data = json.loads(config)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a JSON object like "
                          '{"method": "mtp", "num_speculative_tokens": 3}')
    return data


def spec_summary(counters: dict[str, float], num_output_tokens: int) -> dict[str, Any]:
    """Drafts, acceptance, mean acceptance length (vLLM's log line's convention) and
    output tokens per step, from a replay's counters; empty when spec decode was off."""
    if "spec_num_drafts" not in counters:
        return {}
    drafts = int(counters["spec_num_drafts"])
    draft_tokens = int(counters["spec_num_draft_tokens"])
    accepted = int(counters["spec_num_accepted_tokens"])
    per_pos = []
    i = 0
    while f"spec_num_accepted_tokens_pos{i}" in counters:
        per_pos.append(counters[f"spec_num_accepted_tokens_pos{i}"] / drafts if drafts else 0.0)
        i += 1
    steps = counters.get("num_steps", 0) or 0
    return {"num_drafts": drafts, "num_draft_tokens": draft_tokens,
            "num_accepted_tokens": accepted,
            "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
            "mean_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
            "acceptance_per_position": per_pos,
            "tokens_per_step": num_output_tokens / steps if steps else 0.0}
