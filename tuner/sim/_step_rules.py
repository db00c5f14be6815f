"""The arithmetic every scheduling path shares: how many tokens a request may compute
this step and how many new blocks that takes.

Why a module of its own: the plain running loop, the waiting loop, the decode group's plan
and ``KVCacheManager.allocate_slots`` all apply these rules; written once here, the fast
path cannot drift from the plain one by a differently clamped copy. Plain functions over
ints (no request objects), cheap enough for the hot path.
"""

from __future__ import annotations


def cdiv(num_tokens: int, block_size: int) -> int:
    """Blocks that ``num_tokens`` tokens occupy (ceiling division, vLLM's ``cdiv``)."""
    return -(-num_tokens // block_size)


def blocks_needed(num_tokens: int, num_held: int, block_size: int) -> int:
    """New blocks a request holding ``num_held`` blocks needs to cover ``num_tokens``
    tokens; 0 when it holds enough already."""
    need = -(-num_tokens // block_size) - num_held
    return need if need > 0 else 0


def clamp_new_tokens(num_new: int, threshold: int, budget: int, chunked: bool = True) -> int:
    """vLLM's per-request clamp of the tokens wanted this step (its running and its
    waiting loop both apply it).

    First ``long_prefill_token_threshold`` (``threshold``; 0 = off), then the step's
    remaining token ``budget``. With chunked prefill off (``chunked=False``, waiting
    requests only) a request the budget would cut is not scheduled at all: 0.
    """
    if 0 < threshold < num_new:
        num_new = threshold
    if num_new > budget:
        return budget if chunked else 0
    return num_new


def running_new_tokens(num_tokens: int, num_computed: int, threshold: int, budget: int,
                       max_model_len: int) -> int:
    """Tokens a running request computes this step (<= 0: it is skipped): the clamp of
    ``clamp_new_tokens``, then room below ``max_model_len`` (vLLM keeps one position
    for the token the step samples)."""
    num_new = clamp_new_tokens(num_tokens - num_computed, threshold, budget)
    room = max_model_len - 1 - num_computed
    return num_new if num_new < room else room
