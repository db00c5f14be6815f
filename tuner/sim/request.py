"""``SimRequest``: the twin's live, mutable request (``vllm/v1/request.py`` @ 0.33.0).

Only the fields the scheduler and the prefix cache need. The token ids themselves are
never known: a request carries the chained block hashes of its prompt (at the KV block
size, full blocks only) and, where the trace knows them, of the blocks its generated
tokens complete. ``block_hashes`` grows like vLLM's ``Request.block_hashes``: one hash
per *full* block of the tokens known so far (prompt + generated).

Hashes are *hash ids*: the trace's 64-bit hashes interned to dense ints (equal hash,
equal id; ``tuner.sim.hash_ids``), so the prefix cache can index arrays with them. Blocks
the trace does not hash (missing prompt hashes, generated blocks without a trace hash)
get synthetic ids, unique per (request, block index) and above every trace id, so they
never match another request, yet a preempted request that recomputes finds its own
generated blocks again. Their range is reserved by ``KVCacheManager.adopt``
(``bind_synthetic``) when the request first reaches the cache.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Sequence

import numpy as np


class RequestStatus(IntEnum):
    """Order matters: ``status >= FINISHED`` means done (one comparison, as in vLLM)."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3
    REJECTED = 4


def _as_int_list(values: Any) -> list[int]:
    """A fresh list of Python ints (the request extends it; the trace's stays intact)."""
    if values is None:
        return []
    if hasattr(values, "tolist"):  # numpy / pyarrow arrays give Python ints
        return list(values.tolist())
    out = list(values)  # trace hashes are ints already: no per-element conversion
    if out and out[0].__class__ is not int:
        out = [int(v) for v in out]
    return out


class SimRequest:
    """A request inside the twin, from arrival to finish.

    ``num_tokens = num_prompt_tokens + num_output_tokens`` (the tokens known so far);
    ``num_computed_tokens`` catches up with it step by step (vLLM's model: there are no
    prefill and decode phases). The last sampled token is never computed; the request
    finishes when ``num_output_tokens == max_tokens`` (``ignore_eos``).
    """

    __slots__ = (
        "request_id", "index", "arrival_s", "num_prompt_tokens", "max_tokens", "priority",
        "status", "num_computed_tokens", "num_output_tokens", "num_tokens", "num_preemptions",
        "is_prefill_chunk", "blocks", "num_cached_blocks", "block_hashes", "_output_hashes",
        "_block_size", "first_scheduled_s", "first_token_s", "last_token_s", "finish_s",
        "num_cached_tokens", "session_id", "seq", "steady", "g0", "next_event",
        "hit_memo", "hit_index", "hit_watched", "hash_array", "synthetic_base",
        "_num_known",
    )

    def __init__(self, *, request_id: str, index: int, arrival_s: float, num_prompt_tokens: int,
                 max_tokens: int, block_size: int, prompt_block_hashes: Sequence[int] | Any = (),
                 output_block_hashes: Sequence[int] | Any = None, priority: int = 0,
                 session_id: str | None = None) -> None:
        self.request_id = request_id
        self.index = index  # position in the input trace; seeds synthetic hashes
        self.arrival_s = arrival_s  # when it reached the engine (replay clock, s)
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens  # output tokens to generate (>= 1)
        self.priority = priority  # lower is served first under the "priority" policy
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.num_tokens = num_prompt_tokens
        self.num_preemptions = 0
        self.is_prefill_chunk = False  # set after each scheduling: computed < num_tokens
        self.blocks: list[int] = []  # block ids held, in sequence order (vLLM req_to_blocks)
        self.num_cached_blocks = 0  # leading blocks whose hashes are registered
        self._block_size = block_size
        n_full = num_prompt_tokens // block_size
        hashes = _as_int_list(prompt_block_hashes)[:n_full]
        self._num_known = len(hashes)  # prompt blocks the trace hashes; the rest: synthetic
        self.block_hashes: list[int] = hashes
        self._output_hashes = _as_int_list(output_block_hashes)
        self.synthetic_base = -1  # first synthetic id; -1 until bind_synthetic
        # block_hashes as an array for vectorised prefix lookups; rebuilt when a
        # lookup needs more of it (a preempted request's generated blocks).
        if isinstance(prompt_block_hashes, np.ndarray) and len(prompt_block_hashes) >= n_full:
            self.hash_array = prompt_block_hashes[:n_full].astype(np.int64, copy=False)
        else:
            self.hash_array = np.asarray(hashes, dtype=np.int64)
        self.first_scheduled_s = float("nan")
        self.first_token_s = float("nan")
        self.last_token_s = float("nan")
        self.finish_s = float("nan")
        self.num_cached_tokens = -1  # local prefix hit at first admission; -1 until then
        self.session_id = session_id
        # Decode-group bookkeeping (tuner.sim._decode_group): ``seq`` orders running
        # requests (admission order); a ``steady`` request's token counters lag the
        # group counter by ``G - g0`` steps; ``next_event`` is its next group step with
        # a block allocation, a block registration or its finish.
        self.seq = 0
        self.steady = False
        self.g0 = 0
        self.next_event = -1
        # Memoised prefix hit of a waiting request, in blocks (-1: none), kept exact by
        # the pool through ``hit_index`` (hash -> first block index of the memo's
        # hashes; None when not watched). See KVCacheManager.num_hit_blocks.
        self.hit_memo = -1
        self.hit_index: dict[int, int] | None = None
        self.hit_watched = 0  # leading block positions whose hashes are in hit_index

    def num_synthetic_ids(self) -> int:
        """How many synthetic ids this request can ever need (missing prompt hashes plus
        generated blocks past the trace's output hashes)."""
        bs = self._block_size
        n_full = self.num_prompt_tokens // bs
        generated = (self.num_prompt_tokens + self.max_tokens) // bs - n_full
        return (n_full - self._num_known) + max(0, generated - len(self._output_hashes))

    def bind_synthetic(self, base: int) -> None:
        """Take ids ``base ..`` for synthetic hashes and fill the missing prompt ones."""
        self.synthetic_base = base
        hashes = self.block_hashes
        n_full = self.num_prompt_tokens // self._block_size
        if len(hashes) < n_full:
            hashes.extend(range(base, base + n_full - len(hashes)))
            self.hash_array = np.asarray(hashes, dtype=np.int64)

    def synthetic_hash(self, block_index: int) -> int:
        """Unique, deterministic id of block ``block_index`` of this request."""
        assert self.synthetic_base >= 0, f"{self!r}: synthetic ids not bound (tuner bug)"
        n_full = self.num_prompt_tokens // self._block_size
        if block_index < n_full:
            offset = block_index - self._num_known
        else:
            offset = n_full - self._num_known + block_index - n_full - len(self._output_hashes)
        assert 0 <= offset < self.num_synthetic_ids(), (
            f"{self!r}: block {block_index} past its reserved synthetic ids (tuner bug)")
        return self.synthetic_base + offset

    def generated_block_hash(self, block_index: int) -> int:
        """Hash of block ``block_index`` completed by generated tokens."""
        j = block_index - self.num_prompt_tokens // self._block_size
        if 0 <= j < len(self._output_hashes):
            return self._output_hashes[j]
        return self.synthetic_hash(block_index)

    def hashes_upto(self, num_blocks: int) -> np.ndarray:
        """``block_hashes[:num_blocks]`` as an array (callers keep ``num_blocks`` within
        ``len(block_hashes)``)."""
        if len(self.hash_array) < num_blocks:
            self.hash_array = np.asarray(self.block_hashes, dtype=np.int64)
        return self.hash_array[:num_blocks]

    def append_output_token(self) -> None:
        """One sampled token: extend ``block_hashes`` when it completes a block."""
        self.num_output_tokens += 1
        self.num_tokens += 1
        if self.num_tokens % self._block_size == 0:
            self.block_hashes.append(self.generated_block_hash(len(self.block_hashes)))

    @property
    def is_finished(self) -> bool:
        return self.status >= RequestStatus.FINISHED

    def __repr__(self) -> str:
        return (f"SimRequest({self.request_id!r}, {self.status.name}, computed="
                f"{self.num_computed_tokens}/{self.num_tokens}, out={self.num_output_tokens}/"
                f"{self.max_tokens}, blocks={len(self.blocks)})")
