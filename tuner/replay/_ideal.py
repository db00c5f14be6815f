"""The prefix-hit rate an unbounded KV cache would give, counted the way vLLM counts it.

``tuner trace stats`` reports the trace's *ideal* hit rate at the trace's hash-block
granularity. A replay at KV block size ``B`` can reach a little less, for two exact
reasons that this module accounts for (and a third, timing, that it leaves out on purpose):

1. **Full blocks only.** vLLM hashes and caches only full ``B``-token blocks, so the
   partial tail of a prompt is never a hit, and a trace hash block that is not full is
   never split into shared sub-blocks.
2. **The last-token rule.** ``KVCacheManager.get_computed_blocks`` looks up at most
   ``num_tokens - 1`` tokens, so a hit is capped at ``(input_len - 1) // B * B``: a prompt
   that is entirely cached still computes its last block.
3. Timing (not modelled here): a request admitted while the request that shares its
   prefix is still being prefilled hits only the blocks already *scheduled*. With a
   closed loop at concurrency 1 this effect vanishes, and the twin's rate equals
   ``attainable`` exactly (tests and bench/replay.py check it).

Generated tokens: the last sampled token of a request is never computed, so a finished
request leaves ``floor((input_len + output_len - 1) / B)`` blocks of its token stream in
the cache (prompt blocks, then the blocks of ``output_block_hashes``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class IdealHitRate:
    """Hit rates with an unbounded cache, requests served one at a time in arrival order."""

    block_size: int  # KV block size B the rates are counted at
    num_requests: int  # requests counted (those the engine would not reject)
    prefix_cache_queries: int  # Σ input_len of counted requests (vLLM's queries)
    full_block_hits: int  # Σ leading full-block hits, tokens (rule 1 only)
    attainable_hits: int  # ... capped by the last-token rule (rules 1 and 2)

    @property
    def full_block_rate(self) -> float:
        return self.full_block_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def attainable_rate(self) -> float:
        """What the twin (or vLLM) reaches with an unbounded cache and no overlap."""
        return self.attainable_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


def ideal_hit_rate(requests: Iterable[Any], *, block_size: int,
                   max_model_len: int | None = None) -> IdealHitRate:
    """Count hits of ``requests`` (hashes already at ``block_size``) against all earlier ones.

    Args:
        requests: ``TraceRequest``-like objects in arrival order with ``block_hashes`` and
            ``output_block_hashes`` at the KV block size (see ``reblock_request``).
        block_size: the KV block size ``B``.
        max_model_len: requests with ``input_len + output_len`` above it are skipped, as
            the twin rejects them before any cache lookup.
    """
    seen: set[int] = set()
    queries = full = capped = n = 0
    for r in requests:
        input_len, output_len = int(r.input_len), int(r.output_len)
        if input_len < 1 or output_len < 1:
            continue
        if max_model_len is not None and input_len + output_len > max_model_len:
            continue
        prompt = list(r.block_hashes)[: input_len // block_size]
        hit_blocks = 0
        for h in prompt:
            if h not in seen:
                break
            hit_blocks += 1
        n += 1
        queries += input_len
        full += hit_blocks * block_size
        capped += min(hit_blocks * block_size, (input_len - 1) // block_size * block_size)
        stream = prompt + list(r.output_block_hashes or ())
        seen.update(stream[: (input_len + output_len - 1) // block_size])
    return IdealHitRate(block_size=block_size, num_requests=n, prefix_cache_queries=queries,
                        full_block_hits=full, attainable_hits=capped)
