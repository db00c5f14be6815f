"""``DecodeGroup``: steady decoders advanced by one counter (the twin's fast path).

Why: at 100-300 running requests a pure decode step would cost a Python iteration per
request in ``schedule()`` and again in ``update_from_output``. Yet a decoding request
only *does* something observable every ``block_size`` steps: it takes a new block at
a block boundary, registers the hash of a block it filled, or finishes. Everything else
is "one more token", which a shared counter ``G`` expresses for all of them at once.

A running request is *steady* once it is decode-ready (``num_computed_tokens ==
num_tokens - 1``, its blocks exactly cover the computed tokens). Its counters are
stored as of group step ``g0``; the true values are ``stored + (G - g0)``. A calendar
maps each steady request to its next *event* step (allocation, registration or
finish), so a group step touches only the requests with an event, in running order
(admission ``seq``), and calls the same ``KVCacheManager.allocate_slots`` as the plain
path: block ids, evictions and hash registrations happen in exactly vLLM's order.

The scheduler uses a group step only when it can prove that every steady request is
scheduled with one token (the running loop's token budget reaches the last one) and
that no allocation can fail (the blocks needed this step fit in the free queue, so no
preemption). Otherwise it dissolves the group (materialising every request) and runs
the plain step, re-forming the group afterwards. ``tests/sim/test_fast_forward.py``
shows both paths give byte-identical results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.sim.request import SimRequest


class DecodeGroup:
    """The steady decoders and their event calendar.

    Invariants: ``size`` = steady requests; ``sum_tokens`` = sum of their *true*
    ``num_tokens`` at counter ``G``; every steady request is in ``calendar`` under
    its ``next_event`` (stale entries of requests that left are skipped);
    ``last_end_s`` = end time of the latest step, when every member that took part
    in it received its token.
    """

    __slots__ = ("G", "size", "sum_tokens", "calendar", "odd", "last_end_s",
                 "block_size", "caching")

    def __init__(self, block_size: int, caching: bool) -> None:
        self.G = 0  # group steps so far
        self.size = 0
        self.sum_tokens = 0
        self.calendar: dict[int, list["SimRequest"]] = {}
        # Members whose last token is older than the previous step's end (they joined
        # without being scheduled that step): their next gap is computed one by one.
        self.odd: list["SimRequest"] = []
        self.last_end_s = 0.0
        self.block_size = block_size
        self.caching = caching

    def next_event(self, r: "SimRequest") -> int:
        """First group step >= G where ``r`` (materialised at G) allocates, registers
        a full block or receives its last token."""
        bs = self.block_size
        t = r.num_tokens
        k = (1 - t) % bs  # the token computed this step starts a new block
        if self.caching:
            k_reg = (-t) % bs  # the computed tokens fill a block: register its hash
            if k_reg < k:
                k = k_reg
        k_fin = r.max_tokens - 1 - r.num_output_tokens
        if k_fin < k:
            k = k_fin
        return self.G + k

    def materialize(self, r: "SimRequest") -> None:
        """Bring ``r``'s counters (and block hashes) to group step ``G``."""
        d = self.G - r.g0
        if d:
            r.num_tokens += d
            r.num_output_tokens += d
            r.num_computed_tokens += d
            r.last_token_s = self.last_end_s
            hashes = r.block_hashes
            n_full = r.num_tokens // self.block_size
            while len(hashes) < n_full:
                hashes.append(r.generated_block_hash(len(hashes)))
            r.g0 = self.G

    def add(self, r: "SimRequest", now_s: float) -> None:
        r.steady = True
        r.g0 = self.G
        self.size += 1
        self.sum_tokens += r.num_tokens
        if r.last_token_s != now_s:
            self.odd.append(r)
        self.schedule(r)

    def schedule(self, r: "SimRequest") -> None:
        ev = self.next_event(r)
        r.next_event = ev
        bucket = self.calendar.get(ev)
        if bucket is None:
            self.calendar[ev] = [r]
        else:
            bucket.append(r)

    def remove(self, r: "SimRequest") -> None:
        """Take a (materialised) member out of the group."""
        r.steady = False
        r.next_event = -1
        self.size -= 1
        self.sum_tokens -= r.num_tokens

    def take_events(self) -> list["SimRequest"]:
        """Members with an event at step ``G``, in running order; clears the bucket."""
        bucket = self.calendar.pop(self.G, None)
        if not bucket:
            return []
        g = self.G
        events = [r for r in bucket if r.steady and r.next_event == g]
        events.sort(key=_seq)
        return events

    def clear(self) -> None:
        self.size = 0
        self.sum_tokens = 0
        self.calendar.clear()
        self.odd.clear()


def _seq(r: "SimRequest") -> int:
    return r.seq
