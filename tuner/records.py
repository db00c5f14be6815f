"""Records every replay backend produces and ``tuner.metrics`` consumes.

These plain frozen dataclasses are the contract between backends (the ``sim`` twin,
vLLM's own ``Scheduler``, a live ``vllm serve``) and everything downstream: metrics read
records, never backend objects, so every backend is measured the same way.
Times are seconds on the replay clock (``arrival_s`` of the trace = the same clock).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar, overload

RequestStatus = Literal["finished", "rejected", "aborted", "unfinished", "error"]


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What happened to one request."""

    request_id: str
    arrival_s: float  # when it reached the engine
    input_len: int  # prompt tokens
    output_len: int  # tokens actually generated
    first_scheduled_s: float  # first admission (nan if never)
    first_token_s: float  # first output token (nan if none)
    finish_s: float  # last output token / end (nan if not finished)
    num_cached_tokens: int  # local prefix-cache hit at first admission (tokens)
    num_preemptions: int = 0
    status: RequestStatus = "finished"
    session_id: str | None = None

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def mean_itl_s(self) -> float:
        """(last token - first token) / (output tokens - 1); nan with < 2 tokens."""
        if self.output_len < 2:
            return float("nan")
        return (self.finish_s - self.first_token_s) / (self.output_len - 1)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One scheduler step (one forward pass), for parity checks and time series."""

    step: int  # executed-step index, from 0
    start_s: float
    duration_s: float
    num_scheduled_tokens: dict[str, int]  # request id -> tokens scheduled this step
    preempted: tuple[str, ...]  # request ids preempted during this step's scheduling
    num_running: int  # after scheduling
    num_waiting: int  # after scheduling
    kv_usage: float  # KV usage (vLLM definition) after scheduling
    cached_tokens: dict[str, int] = field(default_factory=dict)  # admitted this step -> hit
    #: KV usage when the step's outputs were applied: the gauge vLLM samples at the end
    #: of ``update_from_output`` (``make_stats``, v1/core/sched/scheduler.py:3294). In
    #: async mode it includes the next step's allocations; None where not measured.
    kv_usage_at_update: float | None = None
    #: requests waiting for their KV to load (vLLM's ``WAITING_FOR_REMOTE_KVS``) after
    #: scheduling, sorted; empty without a KV connector
    waiting_for_kv: tuple[str, ...] = ()


@dataclass(slots=True)
class ReplayResult:
    """A backend's full output for one replay."""

    backend: str
    #: One record per request, in trace order (a list, or a columnar ``RequestTable``).
    requests: Sequence[RequestResult]
    #: Pooled inter-token gaps as (gap_s, count) pairs: exact ITL percentiles without one
    #: float per token (a fast-forwarded decode stretch adds one pair per step); a list,
    #: or columnar ``GapSamples``.
    itl_samples: Sequence[tuple[float, int]]
    #: Time series sampled per step: columns t_s, kv_usage, num_running, num_waiting,
    #: num_scheduled_tokens (equal-length lists).
    timeseries: dict[str, list[float]]
    counters: dict[str, float]  # prefix_cache_queries, prefix_cache_hits, preemptions, num_steps...
    simulated_s: float  # replay-clock span
    wall_s: float  # wall time the replay took
    num_gpus: int = 1
    steps: list[StepRecord] | None = None
    notes: list[str] = field(default_factory=list)
    #: the engine's scheduling mode the replay ran (vLLM's resolved ``async_scheduling``);
    #: None when the backend cannot say (a server attached to, not launched)
    async_scheduling: bool | None = None
    #: One summary per engine of a data-parallel deployment or a fleet (engine index =
    #: ``replica * dp + dp_rank``); empty for a single engine (``tuner.metrics`` then
    #: derives the one entry from the whole result).
    engines: list["EngineSummary"] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class EngineSummary:
    """What one engine of a deployment did over the whole replay.

    Why per engine: a load balancer or router that splits traffic badly shows up as one
    engine with a long queue and a cold cache while the others idle; the deployment's
    averages hide it. ``num_requests`` counts the requests routed to the engine;
    ``kv_usage_*`` are over its executed steps (vLLM's definition, as ``Summary``);
    ``num_dummy_steps`` are the steps a data-parallel MoE rank ran with no request of
    its own, to keep in lockstep with the other ranks (vLLM's ``execute_dummy_batch``).
    """

    engine: int  # global index: replica * dp + dp_rank
    replica: int
    dp_rank: int
    num_requests: int
    num_finished: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    preemptions: int
    kv_usage_mean: float
    kv_usage_max: float
    num_steps: int
    num_dummy_steps: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        q = self.prefix_cache_queries
        return self.prefix_cache_hits / q if q > 0 else float("nan")

    def to_dict(self) -> dict[str, float | int]:
        """Plain dict (the JSON form, with the hit rate)."""
        out: dict[str, float | int] = {name: getattr(self, name) for name in self.__slots__}
        out["prefix_cache_hit_rate"] = self.prefix_cache_hit_rate
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, float | int]) -> "EngineSummary":
        """Inverse of :meth:`to_dict` (the derived hit rate is ignored)."""
        ints = ("engine", "replica", "dp_rank", "num_requests", "num_finished",
                "prefix_cache_queries", "prefix_cache_hits", "preemptions", "num_steps",
                "num_dummy_steps")
        kwargs: dict[str, float | int] = {}
        for name in cls.__slots__:
            if name in raw:
                kwargs[name] = int(raw[name]) if name in ints else float(raw[name])
        return cls(**kwargs)  # type: ignore[arg-type]


_Item = TypeVar("_Item")


def _pick(index: int | slice, n: int, get: Callable[[int], _Item],
          what: str) -> _Item | list[_Item]:
    """``list`` indexing over ``n`` entries that ``get(i)`` builds on demand (for
    ``0 <= i < n``): negative ints count from the end, slices give a list, and an int out
    of range raises ``IndexError`` naming ``what`` ("request 7 of 5")."""
    if isinstance(index, slice):
        return [get(i) for i in range(*index.indices(n))]
    if not -n <= index < n:
        raise IndexError(f"{what} {index} of {n}")
    return get(index % n)


class StringColumn(Sequence["str | None"]):
    """Strings (or None) packed in one UTF-8 buffer with offsets: ~1 byte a character
    plus 4 an entry, where a list of ``str`` costs ~60 bytes an entry. For the request and
    session ids of long replays (``RequestTable``).

    The offsets are int32 while the buffer is under 2 GiB (int64 past it): 4 bytes an
    entry less, ~1.7 MB of a synthetic day's 24-hour peak against its 6-hour one for the
    two id columns (docs/performance.md, round "pdmem"); :meth:`buffers` hands Arrow
    int64 offsets either way."""

    __slots__ = ("_data", "_offsets", "_null")

    def __init__(self, data: bytes, offsets: "Sequence[int] | bytes",
                 null: bytes | bytearray | None = None) -> None:
        """``offsets``: ``len + 1`` int64 positions into ``data`` (or their native bytes);
        ``null``: one byte an entry, non-zero for None (or None: no None)."""
        self._data = bytes(data)
        wide = array("q")
        if isinstance(offsets, bytes):
            wide.frombytes(offsets)
        else:
            wide.extend(offsets)
        self._offsets = array("i", wide) if len(self._data) < 1 << 31 else wide
        self._null = bytes(null) if null is not None and any(null) else None

    @classmethod
    def of(cls, values: Iterable["str | None"]) -> "StringColumn":
        parts, offsets, null = [], [0], bytearray()
        at = 0
        for value in values:
            raw = b"" if value is None else str(value).encode()
            parts.append(raw)
            at += len(raw)
            offsets.append(at)
            null.append(value is None)
        return cls(b"".join(parts), offsets, null)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def _get(self, i: int) -> "str | None":
        if self._null is not None and self._null[i]:
            return None
        return self._data[self._offsets[i]:self._offsets[i + 1]].decode()

    @overload
    def __getitem__(self, index: int) -> "str | None": ...

    @overload
    def __getitem__(self, index: slice) -> "list[str | None]": ...

    def __getitem__(self, index: "int | slice") -> "str | None | list[str | None]":
        return _pick(index, len(self), self._get, "string")

    def __repr__(self) -> str:
        return f"StringColumn({len(self)} strings)"

    def buffers(self, start: int, stop: int) -> "tuple[bytes, array, bytes | None]":
        """Entries ``start .. stop - 1`` as (UTF-8 data, ``stop - start + 1`` int64 offsets
        from 0, one null byte an entry or None): what an Arrow string array is built from
        without a Python string an entry (``tuner.metrics.parquet``)."""
        offsets = self._offsets[start:stop + 1]
        first = offsets[0] if len(offsets) else 0
        data = self._data[first:offsets[-1]] if len(offsets) else b""
        if first or offsets.typecode != "q":
            rebased = array("q", (o - first for o in offsets))
        else:
            rebased = offsets
        null = self._null[start:stop] if self._null is not None else None
        return data, rebased, null


_STATUS_CODES: tuple[RequestStatus, ...] = ("finished", "rejected", "aborted", "unfinished",
                                            "error")
_NAN = float("nan")


_Record = TypeVar("_Record")


class _ListStandIn(Sequence[_Record], Generic[_Record]):
    """Column storage that replaces a ``list`` of records in a result, and so compares
    like one: equal to any sequence (not ``str``/``bytes``) holding equal records in the
    same order, and unhashable because it is mutable.

    Why a base: ``RequestTable`` and ``GapSamples`` must keep the exact equality the lists
    they replaced had (tests and callers compare results with ``==``).
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable, like the list it replaces


class RequestTable(_ListStandIn[RequestResult]):
    """Per-request records as columns: what a long replay keeps instead of objects.

    Why: a replay of a production day holds millions of requests; a ``RequestResult`` (and
    the live request it came from) costs hundreds of bytes, a row here about 70 plus its
    ids. The identity columns (request id, prompt length, session) are given up front;
    the outcome of request ``i`` is written once with :meth:`record` (``"unfinished"``
    until then). Reading it (index, slice, iteration) builds ``RequestResult``s on the fly.
    """

    __slots__ = ("request_id", "input_len", "session_id", "arrival_s", "first_scheduled_s",
                 "first_token_s", "finish_s", "output_len", "num_cached_tokens",
                 "num_preemptions", "status", "engine")

    def __init__(self, request_ids: Sequence[str], input_lens: Iterable[int],
                 session_ids: Sequence[str | None] | None = None) -> None:
        """Ids may be any sequence (a list, a ``StringColumn``).

        The token counts (prompt and output lengths, cached tokens) and preemptions are
        int32: a trace's lengths are bounded at read (``tuner.trace``'s ``MAX_TOKENS``,
        2**24) and a count past 2**31 raises ``OverflowError`` at :meth:`record` rather
        than wrapping. Why not int64: 16 bytes a row over a synthetic day's 285k
        requests, ~3.4 MB of its 24-hour peak against the 6-hour one's (docs/performance.md,
        round "pdmem"); readers widen a chunk at a time (``tuner.metrics.record_columns``).
        """
        n = len(request_ids)
        self.request_id = request_ids
        self.input_len = array("i", input_lens)
        self.session_id = session_ids
        nans = array("d", [_NAN]) * n
        self.arrival_s = nans
        self.first_scheduled_s = array("d", nans)
        self.first_token_s = array("d", nans)
        self.finish_s = array("d", nans)
        self.output_len = array("i", bytes(4 * n))
        self.num_cached_tokens = array("i", bytes(4 * n))
        self.num_preemptions = array("i", bytes(4 * n))
        self.status = bytearray([_STATUS_CODES.index("unfinished")]) * n
        #: The engine each request ran on (``replica * dp + dp_rank``; 0 on a single
        #: engine, -1 for a request refused at the front end of a fleet before routing).
        #: Not part of ``RequestResult`` rows: written by whoever routes (the fleet).
        self.engine = array("i", bytes(4 * n))

    def record(self, index: int, status: RequestStatus, arrival_s: float, *,
               output_len: int = 0, first_scheduled_s: float = _NAN,
               first_token_s: float = _NAN, finish_s: float = _NAN,
               num_cached_tokens: int = 0, num_preemptions: int = 0) -> None:
        """The outcome of request ``index`` (trace position)."""
        self.status[index] = _STATUS_CODES.index(status)
        self.arrival_s[index] = arrival_s
        self.output_len[index] = output_len
        self.first_scheduled_s[index] = first_scheduled_s
        self.first_token_s[index] = first_token_s
        self.finish_s[index] = finish_s
        self.num_cached_tokens[index] = num_cached_tokens
        self.num_preemptions[index] = num_preemptions

    def __len__(self) -> int:
        return len(self.input_len)

    def _row(self, i: int) -> RequestResult:
        return RequestResult(
            request_id=self.request_id[i], arrival_s=self.arrival_s[i],
            input_len=self.input_len[i], output_len=self.output_len[i],
            first_scheduled_s=self.first_scheduled_s[i], first_token_s=self.first_token_s[i],
            finish_s=self.finish_s[i], num_cached_tokens=self.num_cached_tokens[i],
            num_preemptions=self.num_preemptions[i], status=_STATUS_CODES[self.status[i]],
            session_id=None if self.session_id is None else self.session_id[i])

    @overload
    def __getitem__(self, index: int) -> RequestResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[RequestResult]: ...

    def __getitem__(self, index: int | slice) -> RequestResult | list[RequestResult]:
        return _pick(index, len(self), self._row, "request")

    def __iter__(self) -> Iterator[RequestResult]:
        row = self._row
        return (row(i) for i in range(len(self)))

    def __repr__(self) -> str:
        return f"RequestTable({len(self)} requests)"


class GapSamples(_ListStandIn[tuple[float, int]]):
    """Pooled inter-token gaps ``(gap_s, count)`` as two columns (16 bytes a pair, not
    ~120 for a tuple of a float and an int): a day's replay appends one or two per step.

    Why :meth:`compact`: appended as they come, a 24-hour replay's pairs are ~9 million
    (140 MB, the largest thing a long replay grew; docs/performance.md), yet the twin's
    step times repeat: an hour of chat traffic had 366k pairs over only 13k distinct
    gaps. The metrics read the pool as a multiset (a token-weighted percentile,
    ``tuner.metrics.percentiles``), so pairs with the same gap can be summed without
    changing any figure. A producer calls :meth:`maybe_compact` once per step: past
    ``COMPACT_PAIRS`` pairs the pool is sorted by gap and equal gaps merged, and the next
    compaction waits until the pool has doubled again. Below the threshold (every test
    replay, every golden digest) the pairs stay in step order, exactly as appended.
    """

    __slots__ = ("gap_s", "count", "compact_at")

    #: Pairs held before the first compaction (16 MB).
    COMPACT_PAIRS = 1 << 20

    def __init__(self) -> None:
        self.gap_s = array("d")
        self.count = array("q")
        self.compact_at = self.COMPACT_PAIRS

    def append(self, pair: tuple[float, int]) -> None:
        self.gap_s.append(pair[0])
        self.count.append(pair[1])

    def maybe_compact(self) -> None:
        """:meth:`compact` once the pool holds ``compact_at`` pairs (one length check)."""
        if len(self.gap_s) >= self.compact_at:
            self.compact()

    def compact(self) -> None:
        """Sort the pairs by gap and merge equal gaps (counts summed): the same multiset of
        gaps per token, in ascending gap order. Pairs with count <= 0 carry no token and
        are dropped (the percentiles ignore them).

        One full-size temporary at a time besides the order (the pool's columns are read
        in place, the sorted gaps dropped before the counts are gathered): at the
        threshold's 2**20 pairs the transient was the pool's size again plus 40 MB (the
        kept copies, the order and both gathered columns; docs/performance.md, fourth
        memory round), now 16 MB."""
        import numpy as np  # the records module stays importable without numpy loaded

        gaps = np.frombuffer(self.gap_s, dtype=np.float64) if len(self.gap_s) else np.zeros(0)
        counts = (np.frombuffer(self.count, dtype=np.int64) if len(self.count)
                  else np.zeros(0, dtype=np.int64))
        if len(counts) and counts.min() <= 0:  # rare: copies without the empty pairs
            keep = counts > 0
            gaps, counts = gaps[keep], counts[keep]
            del keep
        order = np.argsort(gaps, kind="stable")
        if len(order):
            ordered = gaps[order]
            starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
            values = ordered[starts]
            del ordered
            sums = np.add.reduceat(counts[order], starts)
        else:
            values, sums = np.zeros(0), np.zeros(0, dtype=np.int64)
        del gaps, counts, order
        gap_s, count = array("d"), array("q")
        gap_s.frombytes(values.tobytes())
        count.frombytes(sums.tobytes())
        self.gap_s, self.count = gap_s, count
        self.compact_at = max(self.COMPACT_PAIRS, 2 * len(gap_s))

    def __len__(self) -> int:
        return len(self.gap_s)

    @overload
    def __getitem__(self, index: int) -> tuple[float, int]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[float, int]]: ...

    def __getitem__(self, index: int | slice) -> tuple[float, int] | list[tuple[float, int]]:
        if isinstance(index, slice):
            return list(zip(self.gap_s[index], self.count[index]))
        return self.gap_s[index], self.count[index]

    def __iter__(self) -> Iterator[tuple[float, int]]:
        return zip(self.gap_s, self.count)

    def __repr__(self) -> str:
        return f"GapSamples({len(self)} pairs)"
