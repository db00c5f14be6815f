"""A trace streamed into the twin: requests read lazily, hashes interned as they are read.

Why: interning a whole trace up front (``tuner.replay.intern_requests``) holds
every request's KV-block ids for the whole replay (a 16-token replay of the Mooncake
sample holds ~960 ids a request, 8 bytes each) and sizes the prefix cache's id arrays by
every distinct hash the trace ever has. Replay memory then grows with trace length
(1.75 GB for six hours of the Mooncake sample's traffic on the README's replay) instead
of with what is live. :class:`TraceArrivals` is the twin's ``ArrivalSource`` for a
``Trace``:

* one pass over the small columns (ids, times, lengths) orders the requests by arrival
  (ties: storage order, as ``Trace.lazy``) and gives the result table its identity
  columns;
* the hash columns are read in storage-order row ranges of ``CHUNK_ROWS`` (a quarter of
  a Parquet row group) and dropped once every request in the range has been issued; for
  a trace stored in arrival order that is one or two ranges at a time (a trace stored
  grouped by session keeps its ranges until their last request: at worst the whole
  trace, at the trace's own block size);
* requests are built ``window`` at a time in issue order: their raw hashes are interned
  (a sorted map from raw hash to the first of its ids; a hash new to the map takes ``k``
  consecutive ids from the twin's id space, one per KV block it splits into) and split to
  KV-block ids (``tuner.trace.reblock_vec.reblock_id_ranges``);
* before a window is built, when the id space has outgrown twice its live part (and
  ``min_compact_ids``), the live ids are renumbered (``tuner.sim.hash_space``): map
  entries none of whose ids is still referenced are forgotten.

Equal KV hashes get equal ids and different ones different ids, as with whole-trace
interning; only the id values differ, and no decision of the twin depends on them.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from tuner.records import RequestTable
from tuner.replay._heap import release_free_heap
from tuner.replay._kv_requests import dense_hash_ids, flat_hash_column
from tuner.sim.hash_space import FleetIdSpace, HashIdSpace
from tuner.trace.reblock_vec import (reblock_arrays, reblock_id_ranges,
                                      reblock_joined_id_ranges)

__all__ = ["CHUNK_ROWS", "TraceArrivals"]

#: Storage rows a hash read: a quarter of a Parquet row group (``tuner.trace.store``'s
#: ROW_GROUP_SIZE). A chunk is held until its last request is issued, and a trace stored
#: grouped by session issues a chunk's last rows after the next chunk's first: a synthetic
#: day held two whole row groups' hashes (~21 MB each) at each of its 24 hours' four
#: boundaries, where its 6 hours have one (docs/performance.md, third and fourth memory
#: rounds). Quarter reads hold a subset of those rows (a smaller chunk is held only where
#: its row group would be), for ~0.3 CPU s more of a day's ~500.
CHUNK_ROWS = 16_384
_NO_IDS = np.zeros(0, dtype=np.int64)
_NO_HASHES = np.zeros(0, dtype=np.uint64)


class StreamedRequest:
    """One request as the twin reads it: trace fields, hashes as KV-block ids."""

    __slots__ = ("request_id", "arrival_s", "input_len", "output_len", "block_hashes",
                 "output_block_hashes", "priority", "session_id")

    def __init__(self, request_id: str, arrival_s: float, input_len: int, output_len: int,
                 block_hashes: np.ndarray, output_block_hashes: np.ndarray, priority: int,
                 session_id: str | None) -> None:
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.input_len = input_len
        self.output_len = output_len
        self.block_hashes = block_hashes
        self.output_block_hashes = output_block_hashes
        self.priority = priority
        self.session_id = session_id


class _HashMap:
    """Raw 64-bit hash -> first of its ``k`` ids, as sorted arrays: a large run and a
    small one of recent entries, merged into the large one when it passes an eighth of
    it.

    Why two: a window's new hashes used to be inserted into the one sorted run
    (``np.insert``, a copy of the whole map, keys and ids, every window: 0.24 of the
    agentic hour's 16.5 CPU s at load average ~9); inserted into the small run, the
    large one is copied about once per eighth of its growth. Lookups search both; the
    ids a hash gets do not depend on which run holds it.
    """

    _MERGE_FRACTION = 8  # merge when the recent run exceeds 1/8 of the large one

    def __init__(self, k: int) -> None:
        self.k = k
        self.keys = _NO_HASHES
        self.firsts = _NO_IDS
        self.recent_keys = _NO_HASHES
        self.recent_firsts = _NO_IDS

    def lookup(self, raw: np.ndarray, space: HashIdSpace | FleetIdSpace) -> np.ndarray:
        """First ids of ``raw``'s hashes; hashes new to the map take fresh ranges."""
        if not len(raw):
            return _NO_IDS
        # Distinct hashes first (a window's prompts share most of theirs): the map is
        # searched with sorted, unique needles, which walks it in order (cache friendly),
        # and the new ones come out sorted and unique already. The dense rank is numpy's
        # below 2**22 hashes (``dense_hash_ids``: on the agentic hour's windows as fast as
        # polars' on one core, and the replay does not import polars).
        inverse, n = dense_hash_ids(raw)
        distinct = np.empty(n, dtype=np.uint64)
        distinct[inverse] = raw
        out = np.empty(n, dtype=np.int64)
        missing = _find(self.keys, self.firsts, distinct, out)
        if len(missing):
            rest = distinct[missing]
            still = _find(self.recent_keys, self.recent_firsts, rest, out, missing)
            if len(still):
                new = rest[still]  # sorted and unique: ranges reserved in hash order
                k = self.k
                firsts = space.reserve(k * len(new)) + k * np.arange(len(new), dtype=np.int64)
                out[missing[still]] = firsts
                at = np.searchsorted(self.recent_keys, new)
                self.recent_keys = np.insert(self.recent_keys, at, new)
                self.recent_firsts = np.insert(self.recent_firsts, at, firsts)
                if len(self.recent_keys) * self._MERGE_FRACTION > len(self.keys):
                    self._merge()
        return out[inverse]

    def _merge(self) -> None:
        """The recent run into the large one (both sorted, no key in both)."""
        if not len(self.recent_keys):
            return
        at = np.searchsorted(self.keys, self.recent_keys)
        self.keys = np.insert(self.keys, at, self.recent_keys)
        self.firsts = np.insert(self.firsts, at, self.recent_firsts)
        self.recent_keys, self.recent_firsts = _NO_HASHES, _NO_IDS

    def keep_live(self, mask: np.ndarray) -> None:
        """Forget entries none of whose ids is set in ``mask``; set all ids of the rest
        (a range is renumbered whole, so ``first + j`` stays its ``j``-th id)."""
        self._merge()
        if not len(self.keys):
            return
        k = self.k
        # Any id of each range set: k gathers of the map's size. (A running count over
        # the mask, 8 bytes an id twice, was the renumbering's largest transient: ~67 MB
        # at a synthetic day's 4.2 M ids, its 24-hour peak; docs/performance.md.)
        alive = mask[self.firsts]
        for j in range(1, k):
            alive |= mask[self.firsts + j]
        self.keys, self.firsts = self.keys[alive], self.firsts[alive]
        for j in range(k):  # one scatter an offset: no (entries x k) index array
            mask[self.firsts + j] = True

    def renumber(self, live: np.ndarray) -> None:
        self._merge()
        self.firsts = np.searchsorted(live, self.firsts)


def _find(keys: np.ndarray, firsts: np.ndarray, needles: np.ndarray, out: np.ndarray,
          where: np.ndarray | None = None) -> np.ndarray:
    """Write the first ids of the ``needles`` (sorted) found in ``keys`` into ``out`` (at
    ``where``, or in needle order) and return the indices into ``needles`` not found."""
    if not len(keys):
        return np.arange(len(needles), dtype=np.int64)
    pos = np.searchsorted(keys, needles)
    np.minimum(pos, len(keys) - 1, out=pos)
    known = keys[pos] == needles
    if where is None:
        out[known] = firsts[pos[known]]
    else:
        out[where[known]] = firsts[pos[known]]
    return np.flatnonzero(~known)


class _TurnPrefixes:
    """Each session's latest turn (raw hashes and their map ids), so the next turn's
    shared prefix skips the map.

    Why: a turn's prompt usually starts with the previous turn's prompt and output (93 %
    of the bundled agentic hour's prompt hashes), and interning a window's ~780k raw
    hashes (a dense rank, a sorted search, gathers) was ~10 % of that replay. Comparing
    a prompt with the previous turn is one sequential pass; only the rest is looked up.

    The ids are those the map gives: an entry's ids came from the same map, which never
    changes a known hash's id between renumberings (``clear`` is called at each); a
    shared hash is either known to the map or in the window's lookup through the
    earlier turn, so the window's new hashes, and the ids they take, are unchanged.
    Entries older than the previous window are dropped (memory stays bounded by two
    windows' sessions on a day of traffic).
    """

    __slots__ = ("_latest", "_window", "enabled")

    def __init__(self, enabled: bool = True) -> None:
        # session -> [window, raw prompt + output, their first ids (None until looked up)]
        self._latest: dict[str, list[Any]] = {}
        self._window = 0
        self.enabled = enabled

    def clear(self) -> None:
        self._latest.clear()

    def start_window(self) -> None:
        self._window += 1
        old = self._window - 2
        if len(self._latest) > 256:
            self._latest = {k: v for k, v in self._latest.items() if v[0] > old}

    def begin(self, session: str | None, prompt: np.ndarray, output: np.ndarray
              ) -> tuple[int, list[Any] | None, list[Any] | None]:
        """A turn read in issue order: (leading raw hashes of ``prompt`` shared with the
        session's latest turn, that turn's entry, this turn's entry, now the latest)."""
        if session is None or not self.enabled:
            return 0, None, None
        source = self._latest.get(session)
        shared = 0
        if source is not None:
            raw = source[1]
            m = min(len(raw), len(prompt))
            if m:
                differ = raw[:m] != prompt[:m]
                first = int(differ.argmax())
                shared = first if differ[first] else m
        entry = [self._window, np.concatenate([prompt, output]), None]
        self._latest[session] = entry
        return shared, source, entry

    @staticmethod
    def finish(shared: int, source: list[Any] | None, entry: list[Any] | None,
               tail_ids: np.ndarray) -> np.ndarray:
        """The turn's ids as one array, prompt then output: the ``shared`` ones from
        ``source``, then ``tail_ids`` (the rest of the prompt's and the output's, as
        looked up), stored in ``entry`` (one concatenation: the split reads the joined
        array, ``reblock_joined_id_ranges``); turns are finished in the order begun, so
        ``source``'s ids are known. Without an entry, ``tail_ids`` itself."""
        if entry is None:
            return tail_ids
        if shared:
            assert source is not None and source[2] is not None
            ids = np.concatenate([source[2][:shared], tail_ids])
        else:
            ids = tail_ids.copy()  # tail_ids is a view of the window's lookup
        entry[2] = ids
        return ids


class TraceArrivals:
    """A ``Trace`` as the twin's ``tuner.sim.engine.ArrivalSource`` (see the module doc).

    Args:
        trace: a ``tuner.trace.Trace`` (file, directory or in memory).
        block_size: the KV block size to replay at.
        window: requests built (hashes interned and split) at a time.
        min_compact_ids: no renumbering while the id space is smaller than this. The
            default, 2**21 (2.1 M ids; the per-id arrays stop at ~24 MB), bounds a
            synthetic day's 6 and 24 hours alike (2**22 let the 24-hour day's arrays reach
            54 MB against the 6-hour day's 34: docs/performance.md, fourth memory round);
            the agentic hour (3.8 M ids) then renumbers where it did not.
        reuse_turns: a session's turn takes the ids of the prefix it shares with the
            session's latest turn from that turn (``_TurnPrefixes``); False looks every
            hash up (the oracle tests/replay/test_stream.py holds it equal to).
    """

    def __init__(self, trace: Any, block_size: int, *, window: int = 1024,
                 min_compact_ids: int = 1 << 21, reuse_turns: bool = True) -> None:
        from tuner.replay._issue_columns import read_issue_columns  # pyarrow: when used

        self.block_size = block_size
        self.hash_block_size = f = int(trace.metadata.hash_block_size)
        self.window = window
        self.min_compact_ids = min_compact_ids
        self._split = f > 0 and block_size > 0 and f % block_size == 0
        self._map = _HashMap(f // block_size if self._split else 1)
        # Hashes by storage-row range: through pyarrow for a trace read from files (no
        # polars in the replay), a polars slice otherwise (``Trace.row_reader``).
        self._hash_rows = trace.row_reader(("block_hashes", "output_block_hashes"), CHUNK_ROWS)
        # Issue order and the compact per-request columns (no Python object a request: a
        # day of traffic is millions), read without polars (``_issue_columns``).
        columns = read_issue_columns(trace)
        self.num_requests = len(columns)
        self.num_hash_ids = 0  # ids are reserved as windows are read
        self._rows = columns.rows
        self._request_ids = columns.request_ids
        self._session_ids = columns.session_ids
        self._arrivals = columns.arrivals
        self._input_lens = columns.input_lens
        self._output_lens = columns.output_lens
        self._priorities = columns.priorities
        del columns
        # The last issue position of each storage chunk: when its hashes can be dropped.
        chunks = self._rows // CHUNK_ROWS
        self._chunk_last = np.zeros(int(chunks.max()) + 1, dtype=np.int64)
        np.maximum.at(self._chunk_last, chunks, np.arange(self.num_requests, dtype=np.int64))
        del chunks
        self._chunks: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self._space: HashIdSpace | FleetIdSpace | None = None
        self._next_compact = min_compact_ids
        self.num_renumberings = 0
        self._holders: list[Any] = []  # hold_hash_ids: besides the engines' schedulers
        self._turns = _TurnPrefixes(enabled=reuse_turns)

    # ----------------------------------------------------------------- ArrivalSource
    def table(self) -> RequestTable:
        return RequestTable(self._request_ids, self._input_lens, self._session_ids)

    def bind(self, scheduler: Any) -> None:
        """Read into ``scheduler``'s id space; a second scheduler (a fleet's engines, each
        bound in turn) makes it one space over all of them (``FleetIdSpace``)."""
        space = HashIdSpace(scheduler)
        if self._space is None:
            self._space = space
        elif isinstance(self._space, FleetIdSpace):
            self._space.spaces.append(space)
        else:
            self._space = FleetIdSpace([self._space, space])

    def hold_in_transit(self, sources: Any) -> None:
        """``sources() ->`` the requests a fleet routed and has not yet delivered to an
        engine: a renumbering rewrites their ids too. A fleet loop of one engine
        (``FleetSimulator``'s defaults) has such a queue as well, so its one space takes
        the fleet's form; ignored there, the queued requests kept stale ids and hit the
        wrong hashes after a renumbering."""
        if isinstance(self._space, HashIdSpace):
            self._space = FleetIdSpace([self._space])
        if isinstance(self._space, FleetIdSpace):
            self._space.in_transit = sources

    def hold_hash_ids(self, holder: Any) -> None:
        """``holder`` keeps hash ids of its own (a prefix-aware router's block counts):
        a renumbering asks it to ``mark_hash_ids(mask)`` what it holds, then to
        ``renumber_hash_ids(live)``, as it asks the engines."""
        self._holders.append(holder)

    def __iter__(self) -> Iterator[tuple[int, StreamedRequest]]:
        assert self._space is not None, "bind() the scheduler first"
        self._space.bound_capacity(self._id_capacity())
        for start in range(0, self.num_requests, self.window):
            yield from self._build(start, min(start + self.window, self.num_requests))

    # ----------------------------------------------------------------- reading
    def _chunk(self, chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Raw hashes of storage rows ``chunk * CHUNK_ROWS ..`` as flat arrays + offsets."""
        cached = self._chunks.get(chunk)
        if cached is None:
            table = self._hash_rows.read(chunk * CHUNK_ROWS, (chunk + 1) * CHUNK_ROWS)
            cached = self._chunks[chunk] = (*flat_hash_column(table, "block_hashes"),
                                            *flat_hash_column(table, "output_block_hashes"))
        return cached

    def _raw(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        row = int(self._rows[position])
        pv, po, ov, oo = self._chunk(row // CHUNK_ROWS)
        i = row % CHUNK_ROWS
        return pv[po[i]:po[i + 1]], ov[oo[i]:oo[i + 1]]

    def _build(self, start: int, stop: int) -> list[tuple[int, StreamedRequest]]:
        """Requests ``start .. stop - 1`` (issue order) with KV-block ids."""
        done = [c for c in self._chunks if self._chunk_last[c] < start]
        for chunk in done:
            del self._chunks[chunk]  # every request of it has been issued
        if done:  # its columns' pages, before the next chunk is read (``_heap``)
            release_free_heap()
        space = self._space
        assert space is not None
        f, t = self.hash_block_size, self.block_size
        reads = []
        for position in range(start, stop):
            prompt, output = self._raw(position)
            if not self._split:  # KV blocks group hash blocks: re-block the hashes first
                prompt, output = reblock_arrays(prompt, output, self._input_lens[position],
                                                self._output_lens[position], f, t)
            reads.append((prompt, output))
        # The most ids this window can reserve: ``k`` a raw hash it reads.
        bound = self._map.k * sum(len(prompt) + len(output) for prompt, output in reads)
        if self._compact_due(space.size, bound):
            self._renumber(space)
            self._turns.clear()  # their ids are renumbered (some forgotten)
        turns = self._turns
        turns.start_window()
        sessions = self._session_ids[start:stop]  # one list a window, not a call a request
        raws = []
        tails = []
        for session, (prompt, output) in zip(sessions, reads):
            shared, source, entry = turns.begin(session, prompt, output)
            raws.append((len(prompt), len(output), shared, source, entry))
            tails.append(prompt[shared:] if shared else prompt)
            tails.append(output)
        flat = np.concatenate(tails) if raws else _NO_HASHES
        del tails
        firsts = self._map.lookup(flat, space)
        request_ids = self._request_ids[start:stop]
        # Split with the joined form only where it splits (k > 1): at k = 1 its results
        # are views of the ids, which without a session are the window's whole lookup.
        joined_split = self._split and self._map.k > 1
        out = []
        at = 0
        for position, request_id, session, (n_prompt, n_output, shared, source, entry) in zip(
                range(start, stop), request_ids, sessions, raws):
            end = at + n_prompt - shared + n_output
            ids = turns.finish(shared, source, entry, firsts[at:end])
            at = end
            input_len, output_len = self._input_lens[position], self._output_lens[position]
            if joined_split:
                p, o = reblock_joined_id_ranges(ids, n_prompt, input_len, output_len, f, t)
            elif self._split:
                p, o = reblock_id_ranges(ids[:n_prompt], ids[n_prompt:], input_len,
                                         output_len, f, t)
            else:
                p, o = ids[:n_prompt], ids[n_prompt:]
            out.append((position, StreamedRequest(
                request_id, self._arrivals[position], input_len, output_len, p, o,
                self._priorities[position], session)))
        return out

    def _id_capacity(self) -> int:
        """Room in the per-id arrays: the next renumbering's threshold and an eighth for
        the requests' own synthetic ranges (reserved outside the windows)."""
        return self._next_compact + self._next_compact // 8

    def _compact_due(self, size: int, bound: int) -> bool:
        """Renumber before this window? When the id space has reached the threshold, or
        would pass it while the window reserves (at most ``bound`` ids), unless one
        window could reserve a quarter of the threshold (then only once reached, so a
        renumbering is not repeated every window).

        Why before it passes: the per-id arrays grow by doubling, and a window that ran
        past the threshold doubled them first: on a synthetic day's 24 hours, from ~0.7 M
        live ids to 5.6 M ids' worth for the then default threshold of 2**22 (4.19 M; 56 MB
        of arrays; docs/performance.md, third memory round). Stopping short, with the
        arrays' growth bounded at :meth:`_id_capacity`, keeps them at the threshold."""
        threshold = self._next_compact
        return size >= threshold or (4 * bound <= threshold and size + bound > threshold)

    def _renumber(self, space: HashIdSpace | FleetIdSpace) -> None:
        """Keep only the ids still referenced (twin state and this map), renumbered; the
        per-id arrays keep their buffers (compacted in place, ``hash_space._kept``) where
        those are within :meth:`_id_capacity`, and grow no further than it. (Not
        reallocated at that size: that made the renumbering hold the old arrays and
        full-size new ones together.)"""
        release_free_heap()  # what the cycle freed, before the renumbering's transients
        mask = space.live_mask()
        for holder in self._holders:
            holder.mark_hash_ids(mask)
        self._map.keep_live(mask)
        live = mask.nonzero()[0].astype(np.int64)
        del mask
        self._next_compact = max(self.min_compact_ids, 2 * len(live))
        space.bound_capacity(self._id_capacity())  # first: the arrays keep buffers within it
        space.renumber(live)
        self._map.renumber(live)
        for holder in self._holders:
            holder.renumber_hash_ids(live)
        self.num_renumberings += 1
        del live
        release_free_heap()  # the mask, the map's old runs, the requests' old id arrays
