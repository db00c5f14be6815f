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
(``bind_synthetic``) when the request first reaches the cache; from then on
``hash_array`` holds the id of every block the request can ever fill (prompt and
generated), so a block becoming full never builds a hash in Python: the first
``num_tokens // block_size`` entries are vLLM's ``block_hashes``.
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

    # Slot order is layout: the decode group reads and writes the first sixteen for each
    # member with an event (~700k events an hour, each on a request not touched since
    # its previous one), so they sit together (two or three cache lines of the object,
    # instead of five when they were spread over the tuple).
    __slots__ = (
        "steady", "phase", "share_end", "finish_step", "seq", "g0", "s0", "num_tokens",
        "num_output_tokens", "max_tokens", "num_prompt_tokens", "num_shared_hash_blocks",
        "num_cached_blocks", "block_buf", "num_blocks", "output_hashes", "status",
        "num_computed_tokens", "last_token_s",
        "request_id", "index", "arrival_s", "priority", "num_preemptions",
        "is_prefill_chunk", "repeated_blocks",
        "_block_size", "first_scheduled_s", "first_token_s", "finish_s",
        "num_cached_tokens", "session_id",
        "hit_memo", "hit_epoch", "hit_slot", "hit_watched", "hash_array", "synthetic_base",
        "_num_known",
        "num_output_placeholders", "num_in_flight_tokens", "num_stale_output_tokens",
        "num_spec_tokens",
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
        # Async scheduling (vLLM's Request fields of these names; always 0 in sync mode):
        # tokens sampled by a scheduled step whose output is not applied yet
        # (AsyncScheduler._update_after_schedule, async_scheduler.py:24-56), tokens
        # scheduled and not yet applied (scheduler.py:1855-1856), and the in-flight
        # share a preemption marked stale (scheduler.py:1830): delivered at update
        # without touching the reset counters (2311-2320, 2766).
        self.num_output_placeholders = 0
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        # Speculative decoding: len(spec_token_ids), the drafts the request carries into
        # its next step (tuner.sim.spec_update); always 0 without speculative decoding.
        self.num_spec_tokens = 0
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
        # Hash ids of the prompt's full blocks (the trace's; an array, for vectorised
        # prefix lookups); bind_synthetic completes it with every later block's id.
        if isinstance(prompt_block_hashes, np.ndarray):
            self.hash_array = prompt_block_hashes[:n_full].astype(np.int64, copy=False)
        else:
            self.hash_array = np.asarray(_as_int_list(prompt_block_hashes)[:n_full],
                                         dtype=np.int64)
        self._num_known = len(self.hash_array)  # the rest of the prompt: synthetic ids
        self.output_hashes = _as_int_list(output_block_hashes)
        # Blocks below this index can carry a trace hash, which another request may look
        # up; generated blocks from it on get synthetic ids only this request can hit,
        # so the decode group may register them late (see tuner.sim._decode_group).
        self.num_shared_hash_blocks = n_full + len(self.output_hashes)
        self.synthetic_base = -1  # first synthetic id; -1 until bind_synthetic
        self.first_scheduled_s = float("nan")
        self.first_token_s = float("nan")
        self.last_token_s = float("nan")
        self.finish_s = float("nan")
        self.num_cached_tokens = -1  # local prefix hit at first admission; -1 until then
        self.session_id = session_id
        # Decode-group bookkeeping (tuner.sim._decode_group): ``seq`` orders running
        # requests (admission order); a ``steady`` request's token counters lag the
        # group counter by ``G - g0`` steps; ``phase`` is the residue (mod block size) of
        # the group steps at which it opens a block (its ring), ``share_end`` the last
        # step at which it fills a block with a shareable hash (-1: none left), and
        # ``finish_step`` the step that gives it its last token (tuner.sim.member_calendar).
        self.seq = 0
        self.steady = False
        self.g0 = 0
        self.s0 = 0  # the group's scheduled-step count when computed was last stored
        self.phase = -1
        self.share_end = -1
        self.finish_step = -1
        # Memoised prefix hit of a waiting request, in blocks (-1: not watched), valid
        # while ``hit_epoch`` equals the pool's epoch of its watch slot ``hit_slot``;
        # its first ``hit_watched`` hash ids carry the slot's bit in the pool's
        # ``watch_bits``. See KVCacheManager.num_hit_blocks.
        self.hit_memo = -1
        self.hit_epoch = -1
        self.hit_slot = 0
        self.hit_watched = 0

    def num_synthetic_ids(self) -> int:
        """How many synthetic ids this request can ever need (missing prompt hashes plus
        generated blocks past the trace's output hashes)."""
        bs = self._block_size
        n_full = self.num_prompt_tokens // bs
        generated = (self.num_prompt_tokens + self.max_tokens) // bs - n_full
        return (n_full - self._num_known) + max(0, generated - len(self.output_hashes))

    def bind_synthetic(self, base: int) -> None:
        """Take ids ``base ..`` for synthetic hashes and fill the missing prompt ones."""
        self.synthetic_base = base
        n_full = self.num_prompt_tokens // self._block_size
        missing = n_full - len(self.hash_array)
        if missing > 0:
            self.hash_array = np.concatenate(
                [self.hash_array, np.arange(base, base + missing, dtype=np.int64)])

    def lay_out_hashes(self) -> None:
        """Make ``hash_array`` hold every block's id (idempotent)."""
        if len(self.hash_array) < (self.num_prompt_tokens + self.max_tokens) // self._block_size:
            self._lay_out_generated()

    def _lay_out_generated(self) -> None:
        """Append the ids of every block generated tokens can complete: the trace's
        output ids, then synthetic ones. Done once, when a lookup first reaches past the
        prompt (a preempted request's, or a registration over prompt and generated blocks
        together); registrations of generated blocks alone read ``hash_at`` /
        ``hashes_between`` and copy nothing. Not at arrival: a waiting prompt's array may
        be a view into the trace's, and copying thousands of waiting prompts would cost
        memory."""
        assert self.synthetic_base >= 0, f"{self!r}: synthetic ids not bound (tuner bug)"
        bs = self._block_size
        n_full = self.num_prompt_tokens // bs
        n_all = (self.num_prompt_tokens + self.max_tokens) // bs
        traced = self.output_hashes[:n_all - n_full]
        start = self.synthetic_base + n_full - self._num_known
        untraced = np.arange(start, start + n_all - n_full - len(traced), dtype=np.int64)
        self.hash_array = np.concatenate(
            [self.hash_array[:n_full], np.asarray(traced, dtype=np.int64), untraced])

    def hash_at(self, block_index: int) -> int:
        """``hashes_upto(block_index + 1)[block_index]`` without laying out the generated
        ids: a generated block's id is the trace's output id or its synthetic one.

        Why: registering one generated block (a decode step's fill) used to lay out the
        whole array, a copy of the ~3,000 prompt ids per agentic request (2.5 % of a
        window-16 replay, py-spy), for one id that ``output_hashes`` holds already.
        """
        known = self.hash_array
        if block_index < len(known):
            return known.item(block_index)
        assert self.synthetic_base >= 0, f"{self!r}: synthetic ids not bound (tuner bug)"
        n_full = self.num_prompt_tokens // self._block_size
        j = block_index - n_full  # >= 0: the prompt's ids are bound (bind_synthetic)
        traced = self.output_hashes
        if j < len(traced):
            return traced[j]
        return self.synthetic_base + n_full - self._num_known + j - len(traced)

    def hashes_between(self, start: int, end: int) -> np.ndarray:
        """``hashes_upto(end)[start:]``; when the range is generated blocks only, built
        from ``output_hashes`` and the synthetic range without laying out (``hash_at``
        says why)."""
        known = self.hash_array
        n_full = self.num_prompt_tokens // self._block_size
        if end <= len(known) or start < n_full:
            return self.hashes_upto(end)[start:]
        assert self.synthetic_base >= 0, f"{self!r}: synthetic ids not bound (tuner bug)"
        j0, j1 = start - n_full, end - n_full
        traced = self.output_hashes
        base = self.synthetic_base + n_full - self._num_known - len(traced)
        untraced = np.arange(base + max(j0, len(traced)), base + j1, dtype=np.int64)
        if j0 >= len(traced):
            return untraced
        return np.concatenate([np.asarray(traced[j0:j1], dtype=np.int64), untraced])

    def synthetic_hash(self, block_index: int) -> int:
        """Unique, deterministic id of block ``block_index`` of this request."""
        assert self.synthetic_base >= 0, f"{self!r}: synthetic ids not bound (tuner bug)"
        n_full = self.num_prompt_tokens // self._block_size
        if block_index < n_full:
            offset = block_index - self._num_known
        else:
            offset = n_full - self._num_known + block_index - n_full - len(self.output_hashes)
        assert 0 <= offset < self.num_synthetic_ids(), (
            f"{self!r}: block {block_index} past its reserved synthetic ids (tuner bug)")
        return self.synthetic_base + offset

    @property
    def num_hashes(self) -> int:
        """Full blocks whose hash is known (``len(block_hashes)``): all of them once the
        synthetic ids are bound."""
        n = self.num_tokens // self._block_size
        if self.synthetic_base < 0 and n > len(self.hash_array):
            return len(self.hash_array)
        return n

    @property
    def block_hashes(self) -> list[int]:
        """Hash ids of the full blocks known so far (a fresh list: for checks and tests)."""
        return self.hashes_upto(self.num_tokens // self._block_size).tolist()

    def hashes_upto(self, num_blocks: int) -> np.ndarray:
        """``block_hashes[:num_blocks]`` as an array (``num_blocks <= num_hashes``)."""
        if num_blocks > len(self.hash_array) and self.synthetic_base >= 0:
            self._lay_out_generated()
        return self.hash_array[:num_blocks]

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

    def mark_hash_ids(self, mask: np.ndarray) -> None:
        """Set ``mask`` at every hash id this request holds or can still reach (laid-out
        ids, the trace's output ids, its whole synthetic range): what a renumbering of
        the id space must keep (``tuner.sim.hash_space``)."""
        mask[self.hash_array] = True
        if self.output_hashes:
            mask[np.asarray(self.output_hashes, dtype=np.int64)] = True
        if self.synthetic_base >= 0:
            mask[self.synthetic_base:self.synthetic_base + self.num_synthetic_ids()] = True

    def renumber_hash_ids(self, live: np.ndarray) -> None:
        """Hash id ``live[i]`` becomes ``i`` (``live`` sorted, covering
        :meth:`mark_hash_ids`): monotone, so the synthetic range stays contiguous."""
        if len(self.hash_array):
            self.hash_array = np.searchsorted(live, self.hash_array)
        if self.output_hashes:
            self.output_hashes = np.searchsorted(
                live, np.asarray(self.output_hashes, dtype=np.int64)).tolist()
        if self.synthetic_base >= 0:
            self.synthetic_base = int(np.searchsorted(live, self.synthetic_base))

    def release_memory(self) -> None:
        """Drop per-request arrays once finished (the replay keeps only the results)."""
        self.block_buf = _NO_IDS
        self.hash_array = _NO_IDS

    def append_output_token(self) -> None:
        """One sampled token (its block's hash id is laid out already)."""
        self.num_output_tokens += 1
        self.num_tokens += 1

    def deliver_output_token(self, now_s: float, gaps: dict[float, int]) -> None:
        """One sampled token delivered at ``now_s``: appended, and its time recorded as
        the first token's or as an inter-token gap pooled into ``gaps`` (gap_s -> count).
        The one copy both update paths (sync ``Scheduler.update_from_output`` and
        ``tuner.sim.async_update``) use."""
        self.num_output_tokens += 1
        self.num_tokens += 1
        last = self.last_token_s
        if last != last:  # nan: the first token
            self.first_token_s = now_s
        else:
            gap = now_s - last
            gaps[gap] = gaps.get(gap, 0) + 1
        self.last_token_s = now_s

    @property
    def is_finished(self) -> bool:
        return self.status >= RequestStatus.FINISHED

    def __repr__(self) -> str:
        return (f"SimRequest({self.request_id!r}, {self.status.name}, computed="
                f"{self.num_computed_tokens}/{self.num_tokens}, out={self.num_output_tokens}/"
                f"{self.max_tokens}, blocks={self.num_blocks})")
