"""The twin as a :class:`tuner.sim.loop.StepEngine`, and ``Simulator``, its replay.

``TwinEngine`` adapts ``tuner.sim.scheduler.Scheduler`` to the shared loop
(``tuner.sim.loop``): arrivals become ``SimRequest``s, a scheduled step is priced from
its ``StepBatch`` and its tokens are produced at the step's end. ``Simulator`` builds
both and runs the loop; its results:

Records: one ``RequestResult`` per input request (trace order; a columnar
``RequestTable``: a request's live state is dropped when it finishes), pooled inter-token
gaps as ``(gap_s, count)`` pairs (``GapSamples``, one pair per distinct gap per step),
counters as vLLM counts them, a per-step time series (downsampled by 2 whenever it exceeds
``TIMESERIES_MAX_POINTS``; the kept stride is in ``notes``) and, with
``SimOptions.record_steps``, one ``StepRecord`` per step.

Requests that can never run are rejected at arrival (status ``"rejected"``) by
``tuner.sim.loop.AdmissionRules``, the rules the vLLM-core driver applies too.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Protocol

from tuner.records import GapSamples, ReplayResult, RequestTable, StepRecord
from tuner.sim.batch import StepBatch
from tuner.sim.clock import batch_queue_depth
from tuner.sim.hash_ids import intern_hashes
from tuner.sim.kv_connector.hooks import wait_for_transfers
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.loop import AdmissionRules, ReplayLoop, StepTime
from tuner.sim.request import SimRequest
from tuner.sim.scheduler import Scheduler, SchedulerOutput
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions
from tuner.sim.spec_update import spec_counters

TIMESERIES_MAX_POINTS = 200_000


class ArrivalSource(Protocol):
    """Where the twin's requests come from, read lazily (``tuner.replay`` streams a
    Parquet trace in windows; :class:`ListArrivals` serves an in-memory list).

    ``num_hash_ids``: the hash-id space the sources' dense ids start in. ``bind`` hands
    over the scheduler before the first request is read, so a source that interns hashes
    as it reads can reserve ids in (and compact) the scheduler's id space.
    """

    num_requests: int
    num_hash_ids: int

    def table(self) -> RequestTable:
        """The per-request records, identity columns filled in (trace order)."""

    def bind(self, scheduler: Scheduler) -> None:
        """The scheduler the sources' hash ids are for."""

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        """``(index, source)`` in issue order; sources carry dense hash ids."""


class ListArrivals:
    """An in-memory request list as an :class:`ArrivalSource`.

    Hashes are raw (interned here, ``tuner.sim.hash_ids``) unless ``num_hash_ids`` is
    given: then they are dense ids below it already.
    """

    def __init__(self, requests: Iterable[Any], num_hash_ids: int | None = None) -> None:
        self.sources = list(requests)
        self.num_requests = len(self.sources)
        self._hash_ids: list[tuple[Any, Any]] | None = None
        if num_hash_ids is None:
            self._hash_ids, num_hash_ids = intern_hashes(self.sources)
        self.num_hash_ids = num_hash_ids

    def table(self) -> RequestTable:
        sources = self.sources
        return RequestTable([str(r.request_id) for r in sources],
                            [int(r.input_len) for r in sources],
                            [getattr(r, "session_id", None) for r in sources])

    def bind(self, scheduler: Scheduler) -> None:
        """Ids are fixed before the replay: nothing to reserve."""

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        sources, hash_ids = self.sources, self._hash_ids
        # Issue order: by arrival time, ties by trace position (stable).
        order = sorted(range(len(sources)), key=lambda i: (float(sources[i].arrival_s), i))
        if hash_ids is None:
            return ((i, sources[i]) for i in order)
        return ((i, _Interned(sources[i], *hash_ids[i])) for i in order)


class _Interned:
    """A source request seen through its interned hash ids."""

    __slots__ = ("source", "block_hashes", "output_block_hashes")

    def __init__(self, source: Any, prompt: Any, output: Any) -> None:
        self.source = source
        self.block_hashes = prompt
        self.output_block_hashes = output

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


class TwinEngine:
    """The twin's scheduler behind the loop's ``StepEngine`` calls.

    A request's ``SimRequest`` lives from its arrival to its finish; its outcome then goes
    to the columnar ``table`` and the object is dropped, so memory follows the live
    requests, not the trace.
    """

    def __init__(self, scheduler: Scheduler, block_size: int, options: SimOptions,
                 table: RequestTable) -> None:
        self.scheduler = scheduler
        self.block_size = block_size
        self.check = options.check_invariants
        self.table = table
        #: The record hook: called with a request's trace position right after its
        #: outcome is written to ``table`` (finished, rejected at arrival, or unfinished
        #: when the replay ends), while a finishing request is still in ``live``. Why
        #: here: every step path (plain, decode group, async, speculative) hands its
        #: finished requests to :meth:`update`, which records them with :meth:`_record`,
        #: so no path can skip it. An observer reads the row from ``table`` and may raise
        #: to end the replay (``tuner.tune.early_stop``). None: not called; a replay
        #: without it pays one ``is None`` test per recorded request, none per step. (The
        #: P/D decode pool writes its own rows and does not call it: nothing watches a
        #: P/D replay.)
        self.on_record: Callable[[int], None] | None = None
        self.live: dict[int, SimRequest] = {}  # trace position -> live request
        self.num_rejected = 0
        self.num_finished = 0
        self.num_steps = 0
        self.itl_samples = GapSamples()
        self.steps: list[StepRecord] | None = [] if options.record_steps else None
        # Steps scheduled and not yet updated (the batch queue: at most 2 in async mode);
        # with records on, the indices of their StepRecords, completed at update.
        self.num_in_flight = 0
        self._pending_records: deque[int] = deque()
        self.timeseries: dict[str, list[float]] = {k: [] for k in (
            "t_s", "kv_usage", "num_running", "num_waiting", "num_scheduled_tokens")}
        self.ts_stride = 1
        # A KV connector: empty steps wait for transfers (ReplayLoop asks), and each
        # launched step hands its transfers to the connector's fake worker.
        self.connector = scheduler.connector
        self.empty_step_s = (None if self.connector is None else
                             lambda now, nxt: wait_for_transfers(scheduler, now, nxt))

    # ----------------------------------------------------------------- arrivals
    def add_request(self, index: int, source: Any, arrival_s: float, *,
                    prompt_only: bool = False) -> None:
        """A request arrives. ``prompt_only``: as vLLM's P/D proxy sends it to a prefill
        instance (``max_tokens=1``, so no output hashes); a flag rather than a wrapper
        around ``source``, whose attribute forwarding cost a Python call per field."""
        request = SimRequest(
            request_id=str(source.request_id), index=index, arrival_s=arrival_s,
            num_prompt_tokens=int(source.input_len),
            max_tokens=1 if prompt_only else int(source.output_len),
            block_size=self.block_size, prompt_block_hashes=source.block_hashes,
            output_block_hashes=(None if prompt_only
                                 else getattr(source, "output_block_hashes", None)),
            priority=int(getattr(source, "priority", 0) or 0),
            session_id=getattr(source, "session_id", None))
        self.live[index] = request
        self.scheduler.add_request(request)

    def reject_request(self, index: int, source: Any, arrival_s: float) -> None:
        self.table.record(index, "rejected", arrival_s)
        if self.on_record is not None:
            self.on_record(index)
        self.num_rejected += 1

    def has_requests(self) -> bool:
        return self.scheduler.has_requests()

    def idle(self) -> None:
        self.scheduler.dp_step_counter = 0  # idle engine: the next DP wave starts at 0

    def _record(self, request: SimRequest, status: Any) -> None:
        self.table.record(
            request.index, status, request.arrival_s, output_len=request.num_output_tokens,
            first_scheduled_s=request.first_scheduled_s, first_token_s=request.first_token_s,
            finish_s=request.finish_s, num_cached_tokens=max(0, request.num_cached_tokens),
            num_preemptions=request.num_preemptions)
        if self.on_record is not None:
            self.on_record(request.index)

    def finish(self) -> None:
        """The replay ended: record the requests still live as unfinished."""
        for request in self.live.values():
            self._record(request, "unfinished")

    # ----------------------------------------------------------------- steps
    def schedule(self, now_s: float) -> tuple[SchedulerOutput, float, float]:
        scheduler = self.scheduler
        connector = self.connector
        # A connector's empty step is progress only if something was pending before it
        # (a transfer to report, finished requests to finalize, a load to promote) or
        # it issued a transfer; otherwise it would repeat forever (a stall: raised).
        pending = connector is not None and (connector.can_progress()
                                             or bool(scheduler.finished_recving))
        out = scheduler.schedule()
        # Async: a step may schedule nothing while the previous one is in flight (its
        # only runnable requests wait for their last token, the max_tokens skip); vLLM
        # queues that empty batch too (engine/core.py:740-757). With nothing in flight
        # an empty step would repeat forever.
        if (out.total_num_scheduled_tokens == 0 and not out.preempted
                and not self.num_in_flight
                and not pending and not (connector is not None
                                         and connector.can_progress())):
            raise RuntimeError(f"step at t={now_s} scheduled nothing with "
                               f"{len(scheduler.running)} running and "
                               f"{len(scheduler.waiting)} waiting (tuner bug)")
        for request, hit in out.admitted:
            if request.first_scheduled_s != request.first_scheduled_s:
                request.first_scheduled_s = now_s
                request.num_cached_tokens = hit
        return out, now_s, scheduler.kv_cache_manager.usage

    def batch(self, step: tuple[SchedulerOutput, float, float]) -> StepBatch | None:
        # A step can schedule nothing: the first running request that needed a block
        # preempted itself (priority policy; the sync twin then ends the running loop)
        # and, having preempted, admits nobody; or, in async mode, every running request
        # waits for its last token (the max_tokens skip). vLLM's runner returns at once
        # on an empty batch.
        out = step[0]
        return out.batch if out.total_num_scheduled_tokens else None

    def start(self, step: tuple[SchedulerOutput, float, float], start_s: float,
              duration_s: float) -> None:
        out, _, usage = step
        scheduler = self.scheduler
        if self.connector is not None:
            self.connector.launch(start_s, duration_s)
        self.append_timeseries(start_s, usage, len(scheduler.running), len(scheduler.waiting),
                               out.total_num_scheduled_tokens)
        self.num_in_flight += 1
        if self.steps is not None:
            self._pending_records.append(len(self.steps))
            self.steps.append(StepRecord(
                step=self.num_steps, start_s=start_s, duration_s=duration_s,
                num_scheduled_tokens=scheduler.scheduled_tokens(out),
                preempted=tuple(r.request_id for r in out.preempted),
                num_running=len(scheduler.running),
                num_waiting=len(scheduler.waiting) + len(scheduler.kv_holding),
                kv_usage=usage,
                cached_tokens={r.request_id: hit for r, hit in out.admitted},
                **({} if self.connector is None
                   else {"waiting_for_kv": tuple(sorted(scheduler.loading))})))
        self.num_steps += 1

    def update(self, step: tuple[SchedulerOutput, float, float], end_s: float) -> int:
        gaps: dict[float, int] = {}
        scheduler = self.scheduler
        finished = scheduler.update_from_output(step[0], end_s, gaps)
        self.num_in_flight -= 1
        if self.steps is not None:  # the gauge vLLM samples at the end of the update
            index = self._pending_records.popleft()
            self.steps[index] = dataclasses.replace(
                self.steps[index], kv_usage_at_update=scheduler.kv_cache_manager.usage)
        samples = self.itl_samples
        for gap in sorted(gaps):  # sorted: the same pairs whichever path ran the step
            samples.append((gap, gaps[gap]))
        samples.maybe_compact()  # a long replay's pool stays bounded (GapSamples)
        live = self.live
        for request in finished:
            self._record(request, "finished")
            del live[request.index]
            request.release_memory()  # drop per-request arrays early
        self.num_finished += len(finished)
        if self.check:
            self.scheduler.check_invariants()
        return len(finished)

    def append_timeseries(self, t: float, usage: float, num_running: int, num_waiting: int,
                          num_tokens: int) -> None:
        if self.num_steps % self.ts_stride:
            return
        ts = self.timeseries
        ts["t_s"].append(t)
        ts["kv_usage"].append(usage)
        ts["num_running"].append(num_running)
        ts["num_waiting"].append(num_waiting)
        ts["num_scheduled_tokens"].append(num_tokens)
        if len(ts["t_s"]) > TIMESERIES_MAX_POINTS:
            for key, values in ts.items():
                ts[key] = values[::2]
            self.ts_stride *= 2


class Simulator:
    """Replay ``requests`` through the scheduler twin and a step-time model.

    ``requests``: objects with ``request_id``, ``arrival_s``, ``input_len``,
    ``output_len``, ``block_hashes`` (prompt blocks at the KV block size),
    ``output_block_hashes`` (or None) and ``priority`` (``tuner.trace.TraceRequest``), or
    an :class:`ArrivalSource` (``tuner.replay`` streams a Parquet trace that way).
    Hashes of a list are raw (interned here, ``tuner.sim.hash_ids``) unless
    ``num_hash_ids`` is given: then they are already dense ids below it (the replay path
    interns once per trace, faster, at the trace's own block size). ``step_time``: a
    ``StepTimeModel`` or a callable (``tuner.sim.loop.price_function``).
    """

    def __init__(self, requests: Iterable[Any] | ArrivalSource, settings: SchedulerSettings,
                 cache: CacheSettings, step_time: StepTime, *,
                 options: SimOptions = SimOptions(), load: OpenLoop | ClosedLoop = OpenLoop(),
                 num_gpus: int = 1, num_hash_ids: int | None = None) -> None:
        source = (requests if hasattr(requests, "bind") and hasattr(requests, "table")
                  else ListArrivals(requests, num_hash_ids))
        self.source: Any = source
        self.settings = settings
        self.cache = cache
        self.options = options
        self.num_gpus = num_gpus
        self.scheduler = Scheduler(settings, cache, options, num_hash_ids=source.num_hash_ids)
        source.bind(self.scheduler)
        self.engine = TwinEngine(self.scheduler, cache.block_size, options, source.table())
        self.loop = ReplayLoop(self.engine, source, step_time,
                               AdmissionRules.of(settings, cache), load=load,
                               num_requests=source.num_requests,
                               batch_queue_depth=batch_queue_depth(options.async_scheduling))

    def run(self, progress: Callable[[float], None] | None = None) -> ReplayResult:
        """Replay to the end; ``progress`` gets the fraction of requests issued."""
        wall0 = time.perf_counter()
        self.scheduler.materialize_all()
        self.loop.run(progress)
        self.scheduler.materialize_all()
        self.engine.finish()
        return self._result(time.perf_counter() - wall0)

    # ----------------------------------------------------------------- results
    def _result(self, wall_s: float) -> ReplayResult:
        engine = self.engine
        table = engine.table
        scheduler = self.scheduler
        counters: dict[str, float] = {
            "prefix_cache_queries": scheduler.prefix_cache_queries,
            "prefix_cache_hits": scheduler.prefix_cache_hits,
            "preemptions": scheduler.num_preemptions,
            "num_steps": engine.num_steps,
            "rejected": engine.num_rejected,
            "num_requests": len(table),
            "num_finished": engine.num_finished,
        }
        counters.update(spec_counters(scheduler.spec))  # none without spec decoding
        if scheduler.connector is not None:  # only then: replays without keep their records
            counters.update(scheduler.connector.counters())
        first_arrival = min((a for a in table.arrival_s if a == a), default=0.0)
        now = self.loop.now_s
        notes = [f"timeseries stride: every {engine.ts_stride} step(s)"]
        return ReplayResult(
            backend="sim", requests=table, itl_samples=engine.itl_samples,
            timeseries=engine.timeseries, counters=counters,
            simulated_s=max(0.0, now - min(first_arrival, now)),
            wall_s=wall_s, num_gpus=self.num_gpus, steps=engine.steps, notes=notes)
