"""The router in front of a fleet: which replica (or which engine) serves a request.

A fleet is ``replicas`` copies of one deployment (each ``tp x dp`` GPUs) behind a
router. Each policy here is modelled on a router people run, and sees only what that
router sees: request counts and tokens it tracked itself (it proxies every request and
sees it finish), the session id in the request, and for ``prefix-aware`` the engines'
KV events (which blocks each engine holds). docs/twin-vs-vllm.md ("Fleets and routers")
cites the source of each rule.

* ``round-robin`` (vLLM production-stack ``RoundRobinRouter``,
  src/vllm_router/routers/routing_logic.py): replica ``n % replicas`` for the n-th
  request.
* ``least-loaded`` (llm-d inference scheduler ``active-request-scorer`` /
  ``pending-tokens-scorer``, pkg/plugins/scorer/active_request.go, pending_tokens.go):
  the replica with the fewest requests in flight (``load_metric="requests"``) or the
  fewest prompt tokens in flight (``"tokens"``), as counted by the router; ties go to
  the lowest index.
* ``session`` (production-stack ``SessionRouter``): a consistent-hash ring over the
  replicas keyed by the session id; a request without one goes to the least-loaded
  replica (production-stack takes the lowest-QPS one; the router's own in-flight count
  stands in for its QPS window here).
* ``prefix-aware`` (NVIDIA Dynamo KV router, docs/design_docs/router_design.md and
  lib/kv-router/src/scheduling/selector.rs): for every engine (replica x DP rank; Dynamo
  routes to a ``(worker, dp_rank)`` pair, which vLLM honours through the request's
  ``data_parallel_rank``), ``cost = overlap_weight x potential prefill blocks +
  potential decode blocks``; the lowest cost wins (Dynamo's ``--router-temperature 0``),
  ties to the lowest index. Prefill blocks: the router's in-flight prefill tokens on the
  engine plus this prompt's tokens not covered by the engine's cached prefix (from KV
  events), over the block size; decode blocks: the distinct prompt blocks of the
  requests in flight there (Dynamo's ``ActiveSequences`` counts a shared block once)
  plus this prompt's blocks they do not hold. (Dynamo also adds output blocks as a
  request decodes; the router here counts prompts only.)

Plain Python: ``tuner.sim`` runs inside vLLM interpreters too.
"""

from __future__ import annotations

import abc
import hashlib
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from tuner.errors import ConfigError

__all__ = ["ROUTER_PARAMS", "ROUTER_POLICIES", "Router", "RouterParam", "RouterSettings",
           "make_router"]

ROUTER_POLICIES = ("round-robin", "least-loaded", "session", "prefix-aware")
LOAD_METRICS = ("requests", "tokens")
_RING_POINTS = 160  # virtual nodes per replica on the session ring (uhashring's default)


@dataclass(frozen=True, slots=True)
class RouterParam:
    """One named router parameter: which policies read it and its search range."""

    name: str
    policies: tuple[str, ...]
    default: float | int | str
    choices: tuple[str, ...] = ()  # categorical
    low: float = 0.0  # numeric range for a search (inclusive)
    high: float = 0.0
    integer: bool = False
    help: str = ""


#: Every router parameter with the policies that use it (the search space reads these).
ROUTER_PARAMS: tuple[RouterParam, ...] = (
    RouterParam("load_metric", ("least-loaded", "session"), "requests", choices=LOAD_METRICS,
                help="least-loaded (and session's fallback): in-flight requests or "
                     "in-flight prompt tokens, as the router counts them"),
    RouterParam("overlap_weight", ("prefix-aware",), 1.0, low=0.0, high=4.0,
                help="prefix-aware: weight of the prefill blocks in the cost (Dynamo "
                     "--kv-overlap-score-weight); 0 = load only"),
    RouterParam("block_size", ("prefix-aware",), 0, low=0, high=512, integer=True,
                help="prefix-aware: the router's block size in tokens (Dynamo "
                     "--kv-cache-block-size), a multiple of the KV block size; 0 = the "
                     "engines' KV block size"),
)


@dataclass(frozen=True, slots=True)
class RouterSettings:
    """Which router sits in front of the replicas, and its parameters (named as the
    modelled router names them where it has a flag; see :data:`ROUTER_PARAMS`)."""

    policy: str = "round-robin"
    load_metric: str = "requests"
    overlap_weight: float = 1.0
    block_size: int = 0

    def validate(self, *, kv_block_size: int | None = None) -> None:
        """Raise ``ConfigError`` naming the field for a bad value."""
        if self.policy not in ROUTER_POLICIES:
            raise ConfigError(f"router policy {self.policy!r}: use one of "
                              f"{', '.join(ROUTER_POLICIES)}")
        if self.load_metric not in LOAD_METRICS:
            raise ConfigError(f"router load_metric {self.load_metric!r}: use "
                              f"{' or '.join(LOAD_METRICS)}")
        if not (self.overlap_weight >= 0.0 and self.overlap_weight < float("inf")):
            raise ConfigError(f"router overlap_weight={self.overlap_weight!r} must be a "
                              "finite number >= 0")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) \
                or self.block_size < 0:
            raise ConfigError(f"router block_size={self.block_size!r} must be an integer >= 0")
        if kv_block_size and self.block_size and self.block_size % kv_block_size:
            raise ConfigError(f"router block_size={self.block_size} must be a multiple of "
                              f"the KV block size {kv_block_size} (KV events report whole "
                              "KV blocks)")

    def to_dict(self) -> dict[str, Any]:
        """Only the fields the policy reads, plus ``policy`` (a profile stores this)."""
        used = {p.name for p in ROUTER_PARAMS if self.policy in p.policies}
        return {"policy": self.policy,
                **{f.name: getattr(self, f.name) for f in fields(self)
                   if f.name in used}}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "RouterSettings":
        """Inverse of :meth:`to_dict`; unknown keys are an error naming the key."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"router: unknown field {unknown[0]!r} (known: "
                              f"{', '.join(sorted(known))})")
        kwargs: dict[str, Any] = dict(raw)
        try:
            if "overlap_weight" in kwargs:
                kwargs["overlap_weight"] = float(kwargs["overlap_weight"])
            if "block_size" in kwargs:
                value = kwargs["block_size"]
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                kwargs["block_size"] = int(value) if isinstance(value, str) else value
        except (TypeError, ValueError):
            raise ConfigError(f"router: bad number in {dict(raw)!r}") from None
        settings = cls(**kwargs)
        settings.validate()
        return settings


# ---------------------------------------------------------------------------- routers


class Router(abc.ABC):
    """Base: the router's own bookkeeping of what it sent where.

    ``route`` returns a replica index (the replica's own front end then picks a DP rank)
    or, for routers that see ranks (``targets_engines``), a global engine index
    ``replica * dp + rank``. ``finished`` is called when the router sees the response
    end. ``num_targets`` is what ``route`` indexes.
    """

    targets_engines = False

    def __init__(self, settings: RouterSettings, num_replicas: int, dp: int) -> None:
        self.settings = settings
        self.num_replicas = num_replicas
        self.dp = dp
        self.num_targets = num_replicas * dp if self.targets_engines else num_replicas
        self.in_flight = [0] * self.num_targets  # requests sent, response not finished
        self.in_flight_tokens = [0] * self.num_targets  # their prompt tokens
        self._sent: dict[int, tuple[int, int]] = {}  # request index -> (target, tokens)

    def route(self, index: int, source: Any, now_s: float) -> int:
        target = self.pick(index, source, now_s)
        tokens = int(source.input_len)
        self.in_flight[target] += 1
        self.in_flight_tokens[target] += tokens
        self._sent[index] = (target, tokens)
        return target

    @abc.abstractmethod
    def pick(self, index: int, source: Any, now_s: float) -> int:
        """The policy's choice (before the bookkeeping of :meth:`route`)."""

    def finished(self, index: int) -> None:
        target, tokens = self._sent.pop(index)
        self.in_flight[target] -= 1
        self.in_flight_tokens[target] -= tokens

    def least_loaded(self) -> int:
        load = self.in_flight if self.settings.load_metric == "requests" \
            else self.in_flight_tokens
        best = 0
        for i in range(1, len(load)):
            if load[i] < load[best]:
                best = i
        return best


class RoundRobinRouter(Router):
    def __init__(self, settings: RouterSettings, num_replicas: int, dp: int) -> None:
        super().__init__(settings, num_replicas, dp)
        self.next_id = 0

    def pick(self, index: int, source: Any, now_s: float) -> int:
        target = self.next_id % self.num_replicas
        self.next_id += 1
        return target


class LeastLoadedRouter(Router):
    def pick(self, index: int, source: Any, now_s: float) -> int:
        return self.least_loaded()


def _ring_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class SessionRouter(Router):
    """Consistent hashing: a session keeps its replica for the whole replay."""

    def __init__(self, settings: RouterSettings, num_replicas: int, dp: int) -> None:
        super().__init__(settings, num_replicas, dp)
        points = sorted((_ring_hash(f"replica-{r}#{v}"), r)
                        for r in range(num_replicas) for v in range(_RING_POINTS))
        self._keys = [k for k, _ in points]
        self._owners = [r for _, r in points]

    def owner(self, session_id: str) -> int:
        at = bisect_left(self._keys, _ring_hash(session_id))
        return self._owners[at % len(self._owners)]

    def pick(self, index: int, source: Any, now_s: float) -> int:
        session = getattr(source, "session_id", None)
        if not session:
            return self.least_loaded()
        return self.owner(str(session))


class PrefixAwareRouter(Router):
    """Dynamo's KV router cost over every engine (see the module doc).

    ``cached_blocks(engine, source)`` is the KV-event view: how many leading KV blocks
    of the prompt the engine holds. ``first_token(engine, index)`` says whether the
    request's first token has streamed back (its prefill tokens then stop counting).
    Active blocks are counted as Dynamo's ``ActiveSequences`` counts them: a block that
    several in-flight requests on the engine share counts once, so a request adds only
    its blocks the engine's in-flight requests do not hold yet (refcounts by dense hash
    id, ``num_hash_ids`` of them to start with; a prompt's partial last block is its own).

    Over a streamed trace (``tuner.replay._stream``) ids are reserved as the trace is
    read and renumbered from time to time: the refcount arrays grow to the largest id
    seen, and the stream asks the router to mark the ids it holds
    (:meth:`mark_hash_ids`: the prompts of its in-flight requests, which their engines
    hold too) and then to :meth:`renumber_hash_ids` them, as it asks the engines.
    """

    targets_engines = True

    def __init__(self, settings: RouterSettings, num_replicas: int, dp: int, *,
                 kv_block_size: int, num_hash_ids: int,
                 cached_blocks: Callable[[int, Any], int],
                 first_token: Callable[[int, int], bool]) -> None:
        super().__init__(settings, num_replicas, dp)
        self.kv_block_size = kv_block_size
        self.block_size = settings.block_size or kv_block_size
        self.ratio = self.block_size // kv_block_size
        self.cached_blocks = cached_blocks
        self.first_token = first_token
        n = self.num_targets
        self.prefill_tokens = [0] * n  # in-flight, first token not yet seen
        self.active_kv_blocks = [0] * n  # distinct KV blocks of in-flight requests
        self._refs = [np.zeros(max(1, num_hash_ids), dtype=np.int32) for _ in range(n)]
        self._prefilling: list[dict[int, int]] = [{} for _ in range(n)]  # index -> tokens
        self._held: dict[int, tuple[Any, int]] = {}  # index -> (hash ids, partial blocks)

    def _settle_prefills(self) -> None:
        """Prefills whose first token has streamed back stop counting as prefill load."""
        for engine, pending in enumerate(self._prefilling):
            if not pending:
                continue
            done = [i for i in pending if self.first_token(engine, i)]
            for i in done:
                self.prefill_tokens[engine] -= pending.pop(i)

    def _request_blocks(self, source: Any) -> tuple[Any, int]:
        ids = np.asarray(source.block_hashes, dtype=np.int64)
        partial = 1 if int(source.input_len) % self.kv_block_size else 0
        if ids.size and int(ids.max()) >= len(self._refs[0]):
            self._grow(int(ids.max()) + 1)
        return ids, partial

    def _grow(self, needed: int) -> None:
        """Refcount arrays covering ids ``0 .. needed - 1`` (doubling: amortised O(1))."""
        size = max(needed, 2 * len(self._refs[0]))
        for engine, refs in enumerate(self._refs):
            grown = np.zeros(size, dtype=refs.dtype)
            grown[:len(refs)] = refs
            self._refs[engine] = grown

    def mark_hash_ids(self, mask: np.ndarray) -> None:
        """Set the ids of the in-flight requests' prompts in ``mask`` (a renumbering
        keeps them; the engines holding those requests mark them too)."""
        for unique, _ in self._held.values():
            mask[unique] = True

    def renumber_hash_ids(self, live: np.ndarray) -> None:
        """Give the sorted ids ``live`` the ids ``0 .. len(live) - 1`` (the stream's
        renumbering, monotone): refcounts move with their ids, held prompts are rewritten."""
        for engine, refs in enumerate(self._refs):
            kept = live[live < len(refs)]
            grown = np.zeros(max(1, len(live)), dtype=refs.dtype)
            grown[:len(kept)] = refs[kept]
            assert int(grown.sum()) == int(refs.sum()), (
                "renumbering drops an id the router counts (tuner bug)")
            self._refs[engine] = grown
        for index, (unique, partial) in self._held.items():
            self._held[index] = (np.searchsorted(live, unique), partial)

    def _terms(self, engine: int, source: Any, ids: Any, partial: int) -> tuple[int, float]:
        """(new prefill tokens, potential decode blocks) of ``source`` on ``engine``."""
        isl = int(source.input_len)
        overlap = self.cached_blocks(engine, source) // self.ratio
        new_tokens = max(0, isl - overlap * self.block_size)
        added = int((self._refs[engine][ids] == 0).sum()) + partial if ids.size else partial
        decode = (self.active_kv_blocks[engine] + added) / self.ratio
        return new_tokens, decode

    def costs(self, source: Any) -> list[float]:
        """The cost of sending ``source`` to each engine (lower is better)."""
        self._settle_prefills()
        ids, partial = self._request_blocks(source)
        weight, size = self.settings.overlap_weight, self.block_size
        out = []
        for engine in range(self.num_targets):
            new_tokens, decode = self._terms(engine, source, ids, partial)
            out.append(weight * (self.prefill_tokens[engine] + new_tokens) / size + decode)
        return out

    def pick(self, index: int, source: Any, now_s: float) -> int:
        costs = self.costs(source)
        best = min(range(len(costs)), key=costs.__getitem__)  # first minimum: lowest index
        ids, partial = self._request_blocks(source)
        new_tokens, _ = self._terms(best, source, ids, partial)
        refs = self._refs[best]
        if ids.size:
            unique = np.unique(ids)
            self.active_kv_blocks[best] += int((refs[unique] == 0).sum())
            refs[unique] += 1
        else:
            unique = ids
        self.active_kv_blocks[best] += partial
        self.prefill_tokens[best] += new_tokens
        self._prefilling[best][index] = new_tokens
        self._held[index] = (unique, partial)
        return best

    def finished(self, index: int) -> None:
        target = self._sent[index][0]
        super().finished(index)
        unique, partial = self._held.pop(index)
        refs = self._refs[target]
        if unique.size:
            refs[unique] -= 1
            self.active_kv_blocks[target] -= int((refs[unique] == 0).sum())
        self.active_kv_blocks[target] -= partial
        tokens = self._prefilling[target].pop(index, None)
        if tokens is not None:
            self.prefill_tokens[target] -= tokens


def make_router(settings: RouterSettings, num_replicas: int, dp: int, *,
                kv_block_size: int, num_hash_ids: int = 0,
                cached_blocks: Callable[[int, Any], int] | None = None,
                first_token: Callable[[int, int], bool] | None = None,
                sources: Sequence[Any] | None = None) -> Router:
    """The router for ``settings``.

    ``cached_blocks``/``first_token``: the KV-event and response views the prefix-aware
    router needs. ``sources``: the requests, when known up front, to refuse a session
    router over a trace without any session id (it would be least-loaded in disguise).
    """
    settings.validate(kv_block_size=kv_block_size)
    policy = settings.policy
    if policy == "session" and sources is not None and not any(
            getattr(s, "session_id", None) for s in sources):
        raise ConfigError("--router session: the trace has no session ids (no request "
                          "carries one); use --router prefix-aware or least-loaded")
    if policy == "prefix-aware":
        if cached_blocks is None or first_token is None:
            raise ValueError("the prefix-aware router needs the KV-event view "
                             "(cached_blocks) and first_token")
        return PrefixAwareRouter(settings, num_replicas, dp, kv_block_size=kv_block_size,
                                 num_hash_ids=num_hash_ids, cached_blocks=cached_blocks,
                                 first_token=first_token)
    cls = {"round-robin": RoundRobinRouter, "least-loaded": LeastLoadedRouter,
           "session": SessionRouter}[policy]
    return cls(settings, num_replicas, dp)
