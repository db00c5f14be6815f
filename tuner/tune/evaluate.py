"""Evaluators: settings + a time window of the trace -> the replay's ``Summary`` dict.

The study never replays anything itself; it asks an :class:`Evaluator`. The real one,
:class:`ReplayEvaluator`, replays a trace window with ``tuner.replay.run`` and measures it
with ``tuner.metrics.summarize``. Tests use an analytic evaluator with the same interface.

Windows (``Windows``; times on the trace clock)::

    t0                    t_stage1          t_split                 t1
    |---- stage1 ---------|                 |                       |
    |---- train ----------------------------|---- holdout ----------|

* ``stage1``: the first ``stage1_fraction`` of the training window (cheap screening).
* ``train``: the whole training window (stage 2, the survivors).
* ``holdout``: the last ``holdout`` fraction of the trace, never used to rank. It is
  replayed from ``t_split - warm-up`` (warm-up = half the held-out length, at most the
  training window), so the prefix cache and the queues arrive warm as they would in
  production, and measured only over ``[t_split, t1]``. Replaying from ``t0`` instead
  would cost the whole trace per point for little change: a session's cached prefix is
  rebuilt by its next turn, seconds to minutes later.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import math
import pathlib
import struct
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Sequence

import numpy as np

from tuner.errors import ConfigError
from tuner.sim.settings import SchedulerSettings
from tuner.perf.target import Target
from tuner.perf.deployment import Deployment, default_router, router_settings
from tuner.sim.fleet import RouterSettings
from tuner.sim.settings import SimOptions
from tuner.tune.early_stop import StopRule, watch
from tuner.tune.kv_tier_space import tier_metrics
from tuner.tune.spec_space import spec_at, spec_from_record

WindowName = Literal["stage1", "train", "holdout"]

#: The metrics key holding one summary per engine of a multi-engine deployment
#: (``EngineSummary.to_dict`` forms); absent for one engine.
ENGINES_KEY = "engines"

#: Warm-up replayed before the held-out window, as a fraction of its length.
HOLDOUT_WARMUP = 0.5


@dataclass(frozen=True, slots=True)
class Windows:
    """The three windows of a tuning run, in seconds on the trace clock."""

    t0: float
    t_stage1: float
    t_split: float
    t1: float

    @classmethod
    def split(cls, t0: float, t1: float, *, holdout: float, stage1_fraction: float) -> "Windows":
        if not 0.0 <= holdout < 1.0:
            raise ConfigError(f"holdout={holdout}: must be in [0, 1) (fraction of the trace)")
        if not 0.0 < stage1_fraction <= 1.0:
            raise ConfigError(f"stage1_fraction={stage1_fraction}: must be in (0, 1]")
        if not t1 > t0:
            raise ConfigError(f"the trace spans no time ({t0}..{t1}); nothing to tune on")
        t_split = t0 + (t1 - t0) * (1.0 - holdout)
        return cls(t0, t0 + (t_split - t0) * stage1_fraction, t_split, t1)

    @property
    def staged(self) -> bool:
        return self.t_stage1 < self.t_split

    @property
    def has_holdout(self) -> bool:
        return self.t_split < self.t1

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


class Evaluator(Protocol):
    """What the study needs from a replay.

    Call order: the study reads ``default_settings`` (the baseline), ``max_model_len``,
    ``known_metrics`` and ``spec()`` once, then calls ``evaluate`` once per trial and window,
    possibly from several processes (each holds its own evaluator).
    """

    windows: Windows
    default_settings: SchedulerSettings  # vLLM's defaults for the target: the baseline
    max_model_len: int | None  # for SchedulerConfig's max_model_len checks
    known_metrics: Sequence[str] | None  # Summary keys, to validate objectives early

    def spec(self) -> dict[str, Any]:
        """JSON-safe description stored in the study so a joiner can rebuild the evaluator."""
        ...

    def evaluate(self, settings: SchedulerSettings, window: WindowName) -> dict[str, Any]:
        """``Summary.to_dict()`` of replaying ``window`` under ``settings``."""
        ...


def clean_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Scalars only, NaN/inf as ``None``: what Optuna user attrs and YAML can hold."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or value is None or isinstance(value, str):
            out[key] = value
        elif isinstance(value, (int, float)):
            out[key] = float(value) if math.isfinite(value) else None
        elif hasattr(value, "item"):
            v = value.item()
            out[key] = v if not isinstance(v, float) or math.isfinite(v) else None
    return out


def _engine_dict(engine: Any) -> dict[str, Any]:
    """One engine's summary as stored: counts stay integers, NaN becomes None."""
    return {k: (v if isinstance(v, int) or v is None else
                float(v) if math.isfinite(float(v)) else None)
            for k, v in engine.to_dict().items()}


def target_to_dict(target: Target) -> dict[str, Any]:
    return dataclasses.asdict(target)


def target_from_dict(data: dict[str, Any]) -> Target:
    known = {f.name for f in dataclasses.fields(Target)}
    return Target(**{k: v for k, v in data.items() if k in known})


class ReplayEvaluator:
    """Replays windows of one trace on a backend (``sim`` by default) for one target.

    The trace is read once; each window's slice is cut once and kept, so a trial costs one
    replay. The trace fingerprint is checked against ``expect_fingerprint`` (a joiner passes
    the study's), so a worker never mixes results from a different trace into a study.
    """

    FACTORY = "tuner.tune.evaluate:ReplayEvaluator"

    def __init__(self, trace: Any, *, target: Target, backend: str = "sim",
                 holdout: float = 0.25, stage1_fraction: float = 0.25,
                 expect_fingerprint: str | None = None,
                 baseline: SchedulerSettings | None = None,
                 slo_ms: dict[str, float] | None = None,
                 router: RouterSettings | None = None,
                 speculative: Any = None) -> None:
        from tuner.perf.presets import resolve_target
        from tuner.trace import read_trace

        self.trace_path = (str(trace) if not hasattr(trace, "requests")
                           else getattr(trace, "source", None))
        self._trace = read_trace(trace) if not hasattr(trace, "requests") else trace
        self.target = target
        self.backend = backend
        self.resolved = resolve_target(target)
        #: The baseline and trial 0: vLLM's defaults, or what the operator runs (--baseline,
        #: --set), so every comparison is against the deployment being replaced.
        self.default_settings: SchedulerSettings = (
            self.resolved.default_settings if baseline is None else baseline)
        self.slo_ms = dict(slo_ms or {})
        #: The deployment a point replays unless it carries its own (a searched split or
        #: router): the target's, with ``router`` in front of its replicas.
        self.default_deployment = Deployment.of_target(target, router or default_router())
        #: ``--speculative-config`` of every trial (a ``tuner.sim.spec_decode.SpecDecoding``,
        #: None: off); a point's ``num_speculative_tokens`` varies its k (spec_space)
        self.speculative = speculative
        if speculative is not None:
            self.default_deployment = dataclasses.replace(
                self.default_deployment, num_speculative_tokens=speculative.num_speculative_tokens)
        self.max_model_len = int(self.resolved.cache.max_model_len)
        self.num_gpus = int(self.resolved.num_gpus)
        t0, t1 = (float(x) for x in self._trace.time_range())
        self.windows = Windows.split(t0, t1, holdout=holdout, stage1_fraction=stage1_fraction)
        self.block_size = int(self.resolved.cache.block_size)
        self.known_metrics = _summary_keys()
        self._all: list[Any] | None = None
        self._arrivals: list[float] = []
        # Load now: polars must not run in a forked worker (its thread pool does not
        # survive fork and the child would hang), so workers only read this list.
        self._requests("holdout")
        if expect_fingerprint is not None and expect_fingerprint != self.fingerprint:
            raise ConfigError(
                f"trace {self.trace_path} has fingerprint {self.fingerprint[:16]}..., but the "
                f"study was created on a trace with fingerprint {expect_fingerprint[:16]}...; "
                "join with the same trace file (pass it as TRACE)")

    def spec(self) -> dict[str, Any]:
        return {
            "factory": self.FACTORY,
            "trace_path": self.trace_path,
            # The path as given is relative to where tune ran; a report or a joiner run
            # elsewhere finds the file through this one (and checks the fingerprint).
            "trace_resolved": (str(pathlib.Path(self.trace_path).resolve())
                               if self.trace_path else None),
            "trace_fingerprint": self.fingerprint,
            # the source that priced the study ("aic"/"analytic"), not "auto": a joiner
            # without aiconfigurator-core must refuse rather than price trials differently
            "target": {**target_to_dict(self.target),
                       "step_time_source": self.resolved.step_time_source.split()[0]},
            "backend": self.backend,
            "windows": self.windows.to_dict(),
            "baseline": self.default_settings.to_dict(),
            "slo_ms": self.slo_ms,
            "router": (None if self.default_deployment.router is None
                       else self.default_deployment.router.to_dict()),
            # only when on: a study without speculative decoding keeps its spec (and key)
            **({} if self.speculative is None else {"speculative": self.speculative.to_dict()}),
        }

    @classmethod
    def from_spec(cls, spec: dict[str, Any], *, trace: Any = None) -> "ReplayEvaluator":
        """Rebuild from a study's stored spec; ``trace`` overrides the stored path."""
        w = spec["windows"]
        # the study's record forms, read once into the objects the evaluator holds
        router = None if spec.get("router") is None else router_settings(spec["router"])
        baseline = spec.get("baseline")
        span = w["t1"] - w["t0"]
        holdout = (w["t1"] - w["t_split"]) / span
        stage1 = (w["t_stage1"] - w["t0"]) / (w["t_split"] - w["t0"])
        return cls(trace if trace is not None else spec["trace_path"],
                   target=target_from_dict(spec["target"]), backend=spec.get("backend", "sim"),
                   holdout=holdout, stage1_fraction=stage1,
                   expect_fingerprint=spec["trace_fingerprint"],
                   baseline=None if baseline is None else SchedulerSettings.from_dict(baseline),
                   slo_ms=spec.get("slo_ms"),
                   router=router, speculative=spec_from_record(spec.get("speculative")))

    def _requests(self, window: WindowName) -> list[Any]:
        """The requests ``window`` replays: a prefix of the whole trace (arrival < end).

        The trace is loaded and re-blocked to the KV block size once; every window is a
        list slice of the same request objects (a 1-hour agentic trace holds tens of
        millions of block hashes, so copies per window would cost gigabytes). Windows start
        at the first arrival, so no re-basing is needed.
        """
        from tuner.replay import intern_requests, load_requests, reblock_request

        if self._all is None:
            # the twin's path interns arrays (fast); other backends take tuples of ints
            requests, size = load_requests(self._trace, arrays=self.backend == "sim")
            self.fingerprint = requests_fingerprint(requests, size)
            self._arrivals = [r.arrival_s for r in requests]
            if self.backend == "sim":  # hash ids at the KV block size, interned once here
                self._all = intern_requests(requests, self.block_size, hash_block_size=size)
            else:
                if size is not None and size != self.block_size:
                    requests = [reblock_request(r, size, self.block_size) for r in requests]
                self._all = requests
        if window == "holdout":
            w = self.windows
            warmup_s = min((w.t1 - w.t_split) * HOLDOUT_WARMUP, w.t_split - w.t0)
            return self._slice(bisect.bisect_left(self._arrivals, w.t_split - warmup_s), None)
        if window == "train" and not self.windows.has_holdout:
            return self._all
        end_s = self.windows.t_split if window == "train" else self.windows.t_stage1
        return self._slice(None, bisect.bisect_left(self._arrivals, end_s))

    def window_counts(self) -> dict[str, int]:
        """Requests arriving in each window (stage 1, training, held-out) and in all."""
        w = self.windows
        n_split = bisect.bisect_left(self._arrivals, w.t_split)
        return {"total": len(self._arrivals),
                "stage1": bisect.bisect_left(self._arrivals, w.t_stage1) if w.staged else n_split,
                "train": n_split if w.has_holdout else len(self._arrivals),
                "holdout": len(self._arrivals) - n_split if w.has_holdout else 0}

    def _slice(self, start: int | None, stop: int | None) -> list[Any]:
        """``_all[start:stop]``, keeping the hash-id space of interned requests."""
        assert self._all is not None
        if hasattr(self._all, "window"):
            return self._all.window(start, stop)
        return self._all[start:stop]

    #: The robust check may replay this evaluator's windows under clock variants
    #: (``evaluate(..., clock=ClockVariant)``, :mod:`tuner.tune.robust`): the sim prices
    #: steps with the target's step-time model, which a variant scales.
    supports_clock_variants = True
    #: A stage-1 trial may pass ``stop=`` rules (:mod:`tuner.tune.early_stop`): a
    #: one-engine twin replay then raises ``ReplayStopped`` once one is proven violated.
    supports_early_stop = True

    def evaluate(self, settings: SchedulerSettings, window: WindowName, *,
                 deployment: Deployment | None = None,
                 clock: Any = None, stop: Sequence[StopRule] = ()) -> dict[str, Any]:
        """Replay ``window`` under ``settings`` (on ``deployment``'s split and router, else
        the target's) and summarise it; ``clock``, a ``tuner.perf.clock_variant.
        ClockVariant``, scales the step-time model's parts (the robust check).

        ``stage1``/``train`` replay the requests arriving before their end and are measured
        whole; ``holdout`` replays from its warm-up start and measures from ``t_split``.
        ``stop`` (windows measured whole only) ends the replay with ``ReplayStopped`` as
        soon as one of the rules is proven violated.
        """
        use = deployment or self.default_deployment
        target = use.apply(self.target)
        if clock is not None:
            target = dataclasses.replace(target, clock=clock)
        return self._replay(self._requests(window), settings, window, target,
                            router=use.router,
                            speculative=spec_at(self.speculative, use.num_speculative_tokens),
                            pd=use.pd, stop=stop if window != "holdout" else ())

    def _replay(self, requests: list[Any], settings: SchedulerSettings, window: WindowName,
                target: Target, *, router: RouterSettings | None = None,
                speculative: Any = None, pd: Any = None,
                stop: Sequence[StopRule] = ()) -> dict[str, Any]:
        from tuner import metrics, replay

        extra: dict[str, Any] = {} if router is None else {"router": router}
        if pd is not None:  # a P/D layout (tuner.tune.pd_space): the sim's P/D replay
            extra = {"pd": pd}
        if speculative is not None:
            extra["options"] = SimOptions(speculative=speculative)
        if stop:  # replay.run's two halves, with the twin watched between them
            instance = replay.prepare(requests, settings, backend=self.backend, target=target,
                                      hash_block_size=self.block_size, **extra)
            try:
                watch(instance, stop, len(requests))
            except BaseException:
                instance.close()
                raise
            result = replay.run_prepared(instance)
        else:
            result = replay.run(requests, settings, backend=self.backend, target=target,
                                hash_block_size=self.block_size, **extra)
        measure_from = self.windows.t_split if window == "holdout" else None
        from tuner.perf.api_server import replay_api_server

        summary = metrics.summarize(result, measure_from_s=measure_from,
                                    slo_ms=self.slo_ms or None,
                                    api_server=replay_api_server(target, self.backend))
        out = clean_metrics(summary.to_dict())
        if summary.api_server is not None:  # the API server's load (trial records, report)
            out.update({f"api_server_{k}": float(summary.api_server[k])
                        for k in ("servers", "utilisation", "wait_s", "stretch")})
        out.update(metrics.trial_band_keys(summary, result, target))  # error bands (reporting)
        out.update(tier_metrics(result.counters))  # GPU + CPU hit rate (kv_tier_space)
        if len(summary.engines) > 1:
            # Per-engine balance for the report and the profile: who got how much of the
            # window's traffic, and how each engine's cache and queue fared.
            out[ENGINES_KEY] = [_engine_dict(e) for e in summary.engines]
        return out

    def evaluate_deployment(self, settings: SchedulerSettings, window: WindowName, *,
                            tp: int, replicas: int) -> list[dict[str, Any]]:
        """Replay ``window`` on ``replicas`` copies of the target's deployment (TP x DP,
        one replica) at tensor-parallel size ``tp``, each given whole sessions (a stable hash of the session id, else the
        request id, picks the copy: session affinity, as a prefix-aware load balancer
        does). One summary per copy; the capacity search asks whether each keeps up.

        A ``num_gpu_blocks`` override is scaled by ``tp / target.tp`` (a lower bound:
        sharded weights leave more than proportionally more memory for KV).
        """
        requests = self._requests(window)
        blocks = self.target.num_gpu_blocks
        # one copy = one deployment of the target's TP x DP (its replicas are the copies)
        # a calibration file is fitted at one TP (resolve_target refuses it at another):
        # other sizes are priced by the GPU's own coefficients
        target = dataclasses.replace(
            self.target, tp=tp, replicas=1,
            num_gpu_blocks=None if blocks is None else int(blocks * tp / self.target.tp),
            calibration=self.target.calibration if tp == self.target.tp else None)
        spec = self.speculative
        if replicas == 1:
            return [self._replay(requests, settings, window, target, speculative=spec)]
        shares: list[list[Any]] = [[] for _ in range(replicas)]
        for r in requests:
            key = getattr(r, "session_id", None) or r.request_id
            digest = hashlib.blake2b(str(key).encode(), digest_size=8).digest()
            shares[int.from_bytes(digest, "little") % replicas].append(r)
        out = []
        for share in shares:
            if not share:
                continue
            if hasattr(requests, "window"):
                part = requests.window(0, 0)
                part.extend(share)
                share = part
            out.append(self._replay(share, settings, window, target, speculative=spec))
        return out


def requests_fingerprint(requests: Sequence[Any], hash_block_size: int | None) -> str:
    """blake2b-128 (hex) over the requests in arrival order: ids, times, lengths, block
    hashes. It identifies what a study replays, independent of how the file is laid out.

    NOTE(tuner): ``Trace.fingerprint()`` (tuner.trace) returned a different value on every
    call for the bundled 1-hour trace when this was written, which made studies on it
    impossible to resume or join; this one is computed from the request records only.
    """
    h = hashlib.blake2b(digest_size=16, person=b"tuner-tune-fp")
    h.update(f"hbs={hash_block_size};n={len(requests)};".encode())
    for r in requests:
        h.update(r.request_id.encode() + b"\0")
        h.update(struct.pack("<dqqii", float(r.arrival_s), int(r.input_len), int(r.output_len),
                             len(r.block_hashes), len(r.output_block_hashes)))
        # Native uint64 bytes, as array("Q") gives, without a Python loop over numpy views.
        h.update(np.asarray(r.block_hashes, dtype=np.uint64).tobytes())
        h.update(np.asarray(r.output_block_hashes, dtype=np.uint64).tobytes())
    return h.hexdigest()


def _summary_keys() -> tuple[str, ...]:
    """Numeric ``Summary`` fields: the names objectives and constraints may use."""
    from tuner.metrics import Summary

    return tuple(f.name for f in dataclasses.fields(Summary)
                 if f.type in ("int", "float", int, float))


def evaluator_from_spec(spec: dict[str, Any], *, trace: Any = None) -> Evaluator:
    """Rebuild a study's evaluator; only tuner's own evaluators are constructed this way
    (a study in a shared database must not make a joiner import arbitrary code)."""
    factory = spec.get("factory")
    if factory != ReplayEvaluator.FACTORY:
        raise ConfigError(f"the study's evaluator {factory!r} cannot be rebuilt by a joiner; "
                          "only trace-replay studies created by `tuner tune` can be joined")
    return ReplayEvaluator.from_spec(spec, trace=trace)
