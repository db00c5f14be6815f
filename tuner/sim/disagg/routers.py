"""The P/D proxy's two choices: which prefill instance computes a prompt, which decode
instance serves it, as three routers people run in front of vLLM make them.

Every router answers the :class:`tuner.sim.disagg.loop.PDLoop` calls, in this order per
request: ``route(index, source, arrival_s)`` at the arrival (a prefill engine,
``0..P-1``), ``finished(index)`` when the prefill instance's one token is back,
``route_decode(index, source)`` at the handoff (a decode engine, ``P..P+D-1``) or
``refused(index)`` when the decode pool cannot hold it, and ``finished(index)`` again when
the decoder finishes it. Each sees only what its real counterpart sees (module doc of
``tuner.sim.fleet.router``):

* ``vllm-proxy``: vLLM's example P/D proxy
  (``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`` @ 0.33.0): prefill
  and decode clients each cycled in turn, the decoder chosen at the handoff;
* ``llm-d``: llm-d inference scheduler's P/D handler
  (``pkg/plugins/profile/pd_profile_handler.go``; the sample
  ``deploy/config/pd-epp-config.yaml``): the *decode* profile runs first, at the
  arrival; its ``prefix-based-pd-decider`` (``nonCachedTokens: 16``) sends a prompt the
  chosen decoder holds but for fewer than 16 tokens (or one shorter than that) to the
  decoder alone (``route`` then returns the decode engine: no prefill, no read), else
  the prefill profile runs; each scores its pool's endpoints with
  ``2 x prefix-cache-scorer + 1 x queue-scorer`` and the ``max-score-picker`` takes the
  highest. Prefix score: the share of the prompt's blocks the endpoint holds; queue
  score: ``(max - q) / (max - min)`` of the endpoints' waiting queues (1 when all are
  equal), as GIE's ``queue-scorer`` normalises it;
* ``dynamo``: NVIDIA Dynamo's ``PrefillRouter`` (``docs/design_docs/disagg_serving.md``):
  a prefill worker chosen KV-aware at the arrival, the decode worker after the prefill
  returns, each by the KV router's cost (``lib/kv-router/src/scheduling/selector.rs``:
  ``overlap_weight x prefill blocks + decode blocks``, lowest wins): the fleet's
  :class:`~tuner.sim.fleet.router.PrefixAwareRouter`, one per pool.

Deliberate divergences: llm-d's default ``prefix-cache-scorer`` indexes the prompts it
routed (an LRU per server) where this one reads the engines' caches (what its
``precise-prefix-cache-scorer`` does from KV events); its queue metric is scraped, here
it is exact; ties go to the lowest index (the picker shuffles); the decider counts
prompt tokens exactly (llm-d estimates them from the characters).

Plain Python: ``tuner.sim`` runs inside vLLM interpreters too.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from tuner.errors import ConfigError
from tuner.sim.fleet.router import PrefixAwareRouter, RouterSettings

__all__ = ["PD_ROUTERS", "DynamoPDRouter", "LlmdPDRouter", "PDRouter", "PDView",
           "VllmProxyRouter", "make_pd_router"]

#: llm-d's sample P/D profile weights (deploy/config/pd-epp-config.yaml)
LLMD_PREFIX_WEIGHT, LLMD_QUEUE_WEIGHT = 2.0, 1.0
#: the sample's ``prefix-based-pd-decider`` ``nonCachedTokens``: a prompt whose part the
#: chosen decoder does not hold is shorter than this goes to the decoder alone
LLMD_NON_CACHED_TOKENS = 16


class PDView:
    """What a router may read of the engines (global engine indices).

    Args:
        num_prefill, num_decode: the pools' sizes (prefill engines first).
        kv_block_size: the engines' KV block size in tokens.
        num_hash_ids: the dense hash-id space (the Dynamo router's refcounts).
        cached_blocks: ``(engine, source) ->`` leading prompt blocks in its prefix cache.
        waiting: ``engine ->`` requests queued there (input queue + scheduler waiting).
        first_token: ``(engine, index) ->`` whether the request's first token is back.
    """

    def __init__(self, num_prefill: int, num_decode: int, *, kv_block_size: int,
                 num_hash_ids: int, cached_blocks: Callable[[int, Any], int],
                 waiting: Callable[[int], int],
                 first_token: Callable[[int, int], bool]) -> None:
        self.num_prefill, self.num_decode = num_prefill, num_decode
        self.kv_block_size, self.num_hash_ids = kv_block_size, num_hash_ids
        self.cached_blocks, self.waiting, self.first_token = cached_blocks, waiting, first_token


class PDRouter(abc.ABC):
    """Base: the call order in the module doc."""

    targets_engines = True  # the fleet loop's router protocol: it returns engine indices
    name = ""

    def __init__(self, view: PDView) -> None:
        self.view = view
        self.num_prefill, self.num_decode = view.num_prefill, view.num_decode

    @abc.abstractmethod
    def route(self, index: int, source: Any, arrival_s: float) -> int:
        """The prefill engine for a new request."""

    @abc.abstractmethod
    def route_decode(self, index: int, source: Any) -> int:
        """The decode engine (global index) for a request whose prefill finished."""

    def finished(self, index: int) -> None:
        """The prefill's response, then the decoder's, came back."""

    def refused(self, index: int) -> None:
        """The decode pool refused the request at the handoff."""


class VllmProxyRouter(PDRouter):
    """vLLM's example P/D proxy: prefill and decode clients each cycled in turn."""

    name = "vllm-proxy"

    def __init__(self, view: PDView) -> None:
        super().__init__(view)
        self._next_prefill = 0
        self._next_decode = 0

    def route(self, index: int, source: Any, arrival_s: float) -> int:
        engine = self._next_prefill
        self._next_prefill = (engine + 1) % self.num_prefill
        return engine

    def route_decode(self, index: int, source: Any) -> int:
        engine = self._next_decode
        self._next_decode = (engine + 1) % self.num_decode
        return self.num_prefill + engine


class LlmdPDRouter(PDRouter):
    """llm-d's P/D profiles (module doc): decode picked at the arrival, then prefill."""

    name = "llm-d"

    def __init__(self, view: PDView) -> None:
        super().__init__(view)
        self._decode_of: dict[int, int] = {}  # trace index -> decode engine, until handoff

    def scores(self, engines: range, source: Any) -> list[float]:
        """``2 x prefix share + 1 x normalised queue score`` of each engine."""
        view = self.view
        blocks = len(source.block_hashes) or 1
        queues = [view.waiting(e) for e in engines]
        low, high = min(queues), max(queues)
        out = []
        for e, q in zip(engines, queues):
            prefix = view.cached_blocks(e, source) / blocks
            queue = 1.0 if high == low else (high - q) / (high - low)
            out.append(LLMD_PREFIX_WEIGHT * prefix + LLMD_QUEUE_WEIGHT * queue)
        return out

    def _pick(self, engines: range, source: Any) -> int:
        scores = self.scores(engines, source)
        best = max(range(len(scores)), key=scores.__getitem__)  # first maximum
        return engines[best]

    def disaggregate(self, decode: int, source: Any) -> bool:
        """``prefix-based-pd-decider.decide`` (pkg/plugins/profile/prefix_based_pd_decider.go):
        prefill remotely unless the prompt, or its part ``decode`` does not hold, is
        shorter than ``nonCachedTokens``."""
        threshold = LLMD_NON_CACHED_TOKENS
        if threshold <= 0:
            return True
        isl = int(source.input_len)
        hit = self.view.cached_blocks(decode, source) * self.view.kv_block_size
        return isl >= threshold and isl - hit >= threshold

    def route(self, index: int, source: Any, arrival_s: float) -> int:
        """The prefill engine, or the decode engine itself (decode only: the decoder
        computes the prompt, no KV moves)."""
        p = self.num_prefill
        decode = self._pick(range(p, p + self.num_decode), source)
        if not self.disaggregate(decode, source):
            return decode
        self._decode_of[index] = decode
        return self._pick(range(p), source)

    def route_decode(self, index: int, source: Any) -> int:
        return self._decode_of.pop(index)

    def refused(self, index: int) -> None:
        self._decode_of.pop(index, None)


class DynamoPDRouter(PDRouter):
    """Dynamo's ``PrefillRouter`` (module doc): one KV router per pool."""

    name = "dynamo"

    def __init__(self, view: PDView, settings: RouterSettings = RouterSettings(
            policy="prefix-aware")) -> None:
        super().__init__(view)
        p = view.num_prefill
        self.prefill = PrefixAwareRouter(
            settings, view.num_prefill, 1, kv_block_size=view.kv_block_size,
            num_hash_ids=view.num_hash_ids, cached_blocks=view.cached_blocks,
            first_token=view.first_token)
        self.decode = PrefixAwareRouter(
            settings, view.num_decode, 1, kv_block_size=view.kv_block_size,
            num_hash_ids=view.num_hash_ids,
            cached_blocks=lambda e, s: view.cached_blocks(p + e, s),
            first_token=lambda e, i: view.first_token(p + e, i))

    def route(self, index: int, source: Any, arrival_s: float) -> int:
        return self.prefill.route(index, source, arrival_s)

    def route_decode(self, index: int, source: Any) -> int:
        return self.num_prefill + self.decode.route(index, source, 0.0)

    def finished(self, index: int) -> None:
        if index in self.prefill._sent:  # the prefill's response
            self.prefill.finished(index)
        elif index in self.decode._sent:
            self.decode.finished(index)


#: the registry other packages (the P/D layout search) choose from: name -> router class
PD_ROUTERS: dict[str, type[PDRouter]] = {
    "vllm-proxy": VllmProxyRouter, "llm-d": LlmdPDRouter, "dynamo": DynamoPDRouter}


def make_pd_router(name: str, view: PDView) -> PDRouter:
    """The router called ``name`` (``PD_ROUTERS``); ConfigError names the choices."""
    cls = PD_ROUTERS.get(name)
    if cls is None:
        raise ConfigError(f"--pd-router {name!r}: use one of {', '.join(PD_ROUTERS)}")
    return cls(view)
