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

_NO_IDS = np.zeros(0, dtype=np.int64)


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
        "is_prefill_chunk", "block_buf", "num_blocks", "num_cached_blocks", "gen_hashes",
        "_output_hashes", "_joined", "repeated_blocks",
        "_block_size", "first_scheduled_s", "first_token_s", "last_token_s", "finish_s",
        "num_cached_tokens", "session_id", "seq", "steady", "g0", "next_event",
        "hit_memo", "hit_epoch", "hit_watched", "hash_array", "synthetic_base",
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
        # Block ids held, in sequence order (vLLM req_to_blocks): the first num_blocks
        # of block_buf, an array so a whole prompt's blocks are freed in one call.
        self.block_buf = _NO_IDS
        self.num_blocks = 0
        # Whether a block occurs twice in block_buf (a hit over a hash repeated in the
        # chain; vLLM then holds the block twice too): freeing must count each.
        self.repeated_blocks = False
        self.num_cached_blocks = 0  # leading blocks whose hashes are registered
        self._block_size = block_size
        n_full = num_prompt_tokens // block_size
        # Hash ids of the full blocks known so far: the prompt's (an array, for
        # vectorised prefix lookups) then the generated ones (a list, appended to).
        if isinstance(prompt_block_hashes, np.ndarray):
            self.hash_array = prompt_block_hashes[:n_full].astype(np.int64, copy=False)
        else:
            self.hash_array = np.asarray(_as_int_list(prompt_block_hashes)[:n_full],
                                         dtype=np.int64)
        self._num_known = len(self.hash_array)  # the rest of the prompt: synthetic ids
        self.gen_hashes: list[int] = []
        self._joined = self.hash_array  # hash_array + gen_hashes when a lookup needs both
        self._output_hashes = _as_int_list(output_block_hashes)
        self.synthetic_base = -1  # first synthetic id; -1 until bind_synthetic
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
        # Memoised prefix hit of a waiting request, in blocks (-1: not watched), valid
        # while ``hit_epoch`` equals the pool's ``watch_epoch``; its first
        # ``hit_watched`` hash ids are marked in the pool's ``watched_mask``. See
        # KVCacheManager.num_hit_blocks.
        self.hit_memo = -1
        self.hit_epoch = -1
        self.hit_watched = 0

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
        n_full = self.num_prompt_tokens // self._block_size
        missing = n_full - len(self.hash_array)
        if missing > 0:
            self.hash_array = self._joined = np.concatenate(
                [self.hash_array, np.arange(base, base + missing, dtype=np.int64)])

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

    @property
    def num_hashes(self) -> int:
        """Full blocks whose hash is known (``len(block_hashes)``)."""
        return len(self.hash_array) + len(self.gen_hashes)

    @property
    def block_hashes(self) -> list[int]:
        """Hash ids of the full blocks known so far (a fresh list: for checks and tests)."""
        return self.hash_array.tolist() + self.gen_hashes

    def hash_at(self, block_index: int) -> int:
        n = len(self.hash_array)
        if block_index < n:
            return int(self.hash_array[block_index])
        return self.gen_hashes[block_index - n]

    def hashes_upto(self, num_blocks: int) -> np.ndarray:
        """``block_hashes[:num_blocks]`` as an array (``num_blocks <= num_hashes``)."""
        if num_blocks <= len(self.hash_array):
            return self.hash_array[:num_blocks]
        if len(self._joined) < num_blocks:  # a recompute reaches its generated blocks
            self._joined = np.concatenate(
                [self.hash_array, np.asarray(self.gen_hashes, dtype=np.int64)])
        return self._joined[:num_blocks]

    def add_generated_hashes(self, num_full_blocks: int) -> None:
        """Extend the known hashes to ``num_full_blocks`` full blocks."""
        n = len(self.hash_array) + len(self.gen_hashes)
        while n < num_full_blocks:
            self.gen_hashes.append(self.generated_block_hash(n))
            n += 1

    @property
    def blocks(self) -> list[int]:
        """Block ids held, in sequence order (a fresh list: for checks and tests)."""
        return self.block_buf[:self.num_blocks].tolist()

    def extend_blocks(self, block_ids: np.ndarray) -> None:
        n = self.num_blocks
        end = n + len(block_ids)
        if end > len(self.block_buf):
            self._grow_blocks(end)
        self.block_buf[n:end] = block_ids
        self.num_blocks = end

    def append_block(self, block_id: int) -> None:
        n = self.num_blocks
        if n == len(self.block_buf):
            self._grow_blocks(n + 1)
        self.block_buf[n] = block_id
        self.num_blocks = n + 1

    def _grow_blocks(self, needed: int) -> None:
        """Room for the longest sequence this request can reach (one allocation)."""
        longest = -(-(self.num_prompt_tokens + self.max_tokens) // self._block_size)
        buf = np.empty(max(needed, longest, 2 * len(self.block_buf)), dtype=np.int64)
        buf[:self.num_blocks] = self.block_buf[:self.num_blocks]
        self.block_buf = buf

    def release_memory(self) -> None:
        """Drop per-request arrays once finished (the replay keeps only the results)."""
        self.block_buf = _NO_IDS
        self.hash_array = self._joined = _NO_IDS
        self.gen_hashes = []

    def append_output_token(self) -> None:
        """One sampled token: extend the known hashes when it completes a block."""
        self.num_output_tokens += 1
        self.num_tokens += 1
        if self.num_tokens % self._block_size == 0:
            self.gen_hashes.append(self.generated_block_hash(self.num_hashes))

    @property
    def is_finished(self) -> bool:
        return self.status >= RequestStatus.FINISHED

    def __repr__(self) -> str:
        return (f"SimRequest({self.request_id!r}, {self.status.name}, computed="
                f"{self.num_computed_tokens}/{self.num_tokens}, out={self.num_output_tokens}/"
                f"{self.max_tokens}, blocks={self.num_blocks})")
