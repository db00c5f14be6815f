"""``Simulator``: the twin's event loop (a deterministic, SimPy-sized clock).

One scheduler step is one event: a step starting at ``t`` whose ``StepBatch`` the
step-time callable prices at ``d`` produces its tokens at ``t + d``. Requests whose
arrival is ``<= t`` are added before ``schedule()``; when nothing is running or waiting
the clock jumps to the next arrival. Open loop: arrivals at ``arrival_s / speedup``.
Closed loop: ``concurrency`` requests in flight, the next (trace order) issued when one
finishes or is rejected. No wall clock and no randomness enter the result.

Records: one ``RequestResult`` per input request (trace order), pooled inter-token gaps
as ``(gap_s, count)`` pairs (one pair per distinct gap per step), counters as vLLM counts
them, a per-step time series (downsampled by 2 whenever it exceeds
``TIMESERIES_MAX_POINTS``; the kept stride is in ``notes``) and, with
``SimOptions.record_steps``, one ``StepRecord`` per step.

Requests that can never run are rejected at arrival (status ``"rejected"``), as vLLM
refuses them before scheduling: empty prompt or ``max_tokens < 1``; prompt + output
beyond ``max_model_len``; a sequence needing more blocks than the whole KV cache
(it would preempt itself forever); with chunked prefill off, a sequence longer than
``max_num_batched_tokens`` (vLLM's config check makes that impossible there).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from tuner.records import ReplayResult, RequestResult, StepRecord
from tuner.sim.batch import StepBatch
from tuner.sim.hash_ids import intern_hashes
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.request import SimRequest
from tuner.sim.scheduler import Scheduler, SchedulerOutput
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

TIMESERIES_MAX_POINTS = 200_000
_NAN = float("nan")


class Simulator:
    """Replay ``requests`` through the scheduler twin and a step-time model.

    ``requests``: objects with ``request_id``, ``arrival_s``, ``input_len``,
    ``output_len``, ``block_hashes`` (prompt blocks at the KV block size),
    ``output_block_hashes`` (or None) and ``priority`` (``tuner.trace.TraceRequest``).
    Hashes are raw (interned here, ``tuner.sim.hash_ids``) unless ``num_hash_ids`` is
    given: then they are already dense ids below it (the replay path interns once per
    trace, faster, at the trace's own block size).
    """

    def __init__(self, requests: Iterable[Any], settings: SchedulerSettings,
                 cache: CacheSettings, step_time: Callable[[StepBatch], float], *,
                 options: SimOptions = SimOptions(), load: OpenLoop | ClosedLoop = OpenLoop(),
                 num_gpus: int = 1, num_hash_ids: int | None = None) -> None:
        self.sources = list(requests)
        self._hash_ids: list[tuple[Any, Any]] | None = None
        if num_hash_ids is None:
            self._hash_ids, num_hash_ids = intern_hashes(self.sources)
        self.settings = settings
        self.cache = cache
        self.step_time = step_time
        self.options = options
        self.load = load
        self.num_gpus = num_gpus
        self.scheduler = Scheduler(settings, cache, options, num_hash_ids=num_hash_ids)
        # Issue order: by arrival time, ties by trace position (stable).
        self._order = sorted(range(len(self.sources)),
                             key=lambda i: (float(self.sources[i].arrival_s), i))
        self._next = 0  # next position in _order to issue
        self._sim_requests: list[SimRequest | None] = [None] * len(self.sources)
        self._rejected: dict[int, float] = {}  # index -> issue time
        self._in_flight = 0  # closed loop
        self.now_s = 0.0
        self.num_steps = 0
        self.itl_samples: list[tuple[float, int]] = []
        self.steps: list[StepRecord] | None = [] if options.record_steps else None
        self._ts: dict[str, list[float]] = {k: [] for k in (
            "t_s", "kv_usage", "num_running", "num_waiting", "num_scheduled_tokens")}
        self._ts_stride = 1

    # ----------------------------------------------------------------- arrivals
    def _arrival_time(self, index: int) -> float:
        load = self.load
        if isinstance(load, OpenLoop):
            return float(self.sources[index].arrival_s) / load.speedup
        return self.now_s

    def next_arrival_s(self) -> float:
        """When the next request arrives (inf if none can arrive without a finish)."""
        if self._next >= len(self._order):
            return float("inf")
        if isinstance(self.load, ClosedLoop):
            return self.now_s if self._in_flight < self.load.concurrency else float("inf")
        return self._arrival_time(self._order[self._next])

    def _admit_arrivals(self) -> None:
        order = self._order
        closed = isinstance(self.load, ClosedLoop)
        while self._next < len(order):
            index = order[self._next]
            if closed:
                if self._in_flight >= self.load.concurrency:  # type: ignore[union-attr]
                    break
                arrival = self.now_s
            else:
                arrival = self._arrival_time(index)
                if arrival > self.now_s:
                    break
            self._next += 1
            request = self._make_request(index, arrival)
            if request is None:
                self._rejected[index] = arrival
                continue  # a rejection frees its closed-loop slot at once
            self._sim_requests[index] = request
            self._in_flight += 1
            self.scheduler.add_request(request)

    def _make_request(self, index: int, arrival: float) -> SimRequest | None:
        src = self.sources[index]
        input_len, output_len = int(src.input_len), int(src.output_len)
        bs = self.cache.block_size
        longest = input_len + output_len - 1  # tokens computed by its last step
        if (input_len < 1 or output_len < 1
                or input_len + output_len > self.cache.max_model_len
                or -(-longest // bs) > self.cache.num_gpu_blocks - 1
                # Without chunked prefill a (re)computed sequence must fit one step's
                # budget: vLLM enforces it for every request through its config check
                # max_num_batched_tokens >= max_model_len; the twin checks per request.
                or (not self.settings.enable_chunked_prefill
                    and longest > self.settings.max_num_batched_tokens)):
            return None
        if self._hash_ids is None:
            prompt, output = src.block_hashes, getattr(src, "output_block_hashes", None)
        else:
            prompt, output = self._hash_ids[index]
        return SimRequest(
            request_id=str(src.request_id), index=index, arrival_s=arrival,
            num_prompt_tokens=input_len, max_tokens=output_len, block_size=bs,
            prompt_block_hashes=prompt, output_block_hashes=output,
            priority=int(getattr(src, "priority", 0) or 0),
            session_id=getattr(src, "session_id", None))

    # ----------------------------------------------------------------- the loop
    def run(self, progress: Callable[[float], None] | None = None) -> ReplayResult:
        """Replay to the end; ``progress`` gets the fraction of requests issued."""
        wall0 = time.perf_counter()
        scheduler = self.scheduler
        scheduler.materialize_all()
        total = max(1, len(self._order))
        check = self.options.check_invariants
        while True:
            self._admit_arrivals()
            if not scheduler.has_requests():
                nxt = self.next_arrival_s()
                if nxt == float("inf"):
                    break
                self.now_s = max(self.now_s, nxt)
                scheduler.dp_step_counter = 0  # idle engine: the next DP wave starts at 0
                continue
            self.step()
            if check:
                scheduler.check_invariants()
            if progress is not None and self.num_steps % 1000 == 0:
                progress(self._next / total)
        if progress is not None:
            progress(1.0)
        scheduler.materialize_all()
        return self._result(time.perf_counter() - wall0)

    def step(self) -> None:
        """One scheduler step at ``now_s``: schedule, price, produce tokens."""
        scheduler = self.scheduler
        t = self.now_s
        out = scheduler.schedule()
        if out.total_num_scheduled_tokens == 0 and not out.preempted:
            raise RuntimeError(f"step at t={t} scheduled nothing with {len(scheduler.running)} "
                               f"running and {len(scheduler.waiting)} waiting (tuner bug)")
        for request, hit in out.admitted:
            if request.first_scheduled_s != request.first_scheduled_s:
                request.first_scheduled_s = t
                request.num_cached_tokens = hit
        usage = scheduler.kv_cache_manager.usage
        # A step can schedule nothing: the first running request that needed a block
        # preempted itself (priority policy), which ends the running loop and, having
        # preempted, admits nobody. vLLM's runner returns at once on an empty batch.
        duration = float(self.step_time(out.batch)) if out.total_num_scheduled_tokens else 0.0
        t_end = t + duration
        self._record_step(t, duration, out, usage)
        gaps: dict[float, int] = {}
        finished = scheduler.update_from_output(out, t_end, gaps)
        for gap in sorted(gaps):  # sorted: the same pairs whichever path ran the step
            self.itl_samples.append((gap, gaps[gap]))
        self._in_flight -= len(finished)
        for request in finished:
            request.release_memory()  # drop per-request arrays early
        self.now_s = t_end
        self.num_steps += 1

    def _record_step(self, t: float, duration: float, out: SchedulerOutput,
                     usage: float) -> None:
        scheduler = self.scheduler
        self.append_timeseries(t, usage, len(scheduler.running), len(scheduler.waiting),
                               out.total_num_scheduled_tokens)
        if self.steps is not None:
            self.steps.append(StepRecord(
                step=self.num_steps, start_s=t, duration_s=duration,
                num_scheduled_tokens=scheduler.scheduled_tokens(out),
                preempted=tuple(r.request_id for r in out.preempted),
                num_running=len(scheduler.running), num_waiting=len(scheduler.waiting),
                kv_usage=usage,
                cached_tokens={r.request_id: hit for r, hit in out.admitted}))

    def append_timeseries(self, t: float, usage: float, num_running: int, num_waiting: int,
                          num_tokens: int) -> None:
        if self.num_steps % self._ts_stride:
            return
        ts = self._ts
        ts["t_s"].append(t)
        ts["kv_usage"].append(usage)
        ts["num_running"].append(num_running)
        ts["num_waiting"].append(num_waiting)
        ts["num_scheduled_tokens"].append(num_tokens)
        if len(ts["t_s"]) > TIMESERIES_MAX_POINTS:
            for key, values in ts.items():
                ts[key] = values[::2]
            self._ts_stride *= 2

    # ----------------------------------------------------------------- results
    def _result(self, wall_s: float) -> ReplayResult:
        results = []
        num_finished = 0
        for index, src in enumerate(self.sources):
            request = self._sim_requests[index]
            if request is None:
                arrival = self._rejected.get(index)
                status = "rejected" if arrival is not None else "unfinished"
                results.append(RequestResult(
                    request_id=str(src.request_id),
                    arrival_s=arrival if arrival is not None else _NAN,
                    input_len=int(src.input_len), output_len=0, first_scheduled_s=_NAN,
                    first_token_s=_NAN, finish_s=_NAN, num_cached_tokens=0, status=status,
                    session_id=getattr(src, "session_id", None)))
                continue
            finished = request.is_finished
            num_finished += finished
            results.append(RequestResult(
                request_id=request.request_id, arrival_s=request.arrival_s,
                input_len=request.num_prompt_tokens, output_len=request.num_output_tokens,
                first_scheduled_s=request.first_scheduled_s,
                first_token_s=request.first_token_s, finish_s=request.finish_s,
                num_cached_tokens=max(0, request.num_cached_tokens),
                num_preemptions=request.num_preemptions,
                status="finished" if finished else "unfinished",
                session_id=request.session_id))
        scheduler = self.scheduler
        counters: dict[str, float] = {
            "prefix_cache_queries": scheduler.prefix_cache_queries,
            "prefix_cache_hits": scheduler.prefix_cache_hits,
            "preemptions": scheduler.num_preemptions,
            "num_steps": self.num_steps,
            "rejected": len(self._rejected),
            "num_requests": len(self.sources),
            "num_finished": num_finished,
        }
        first_arrival = min((r.arrival_s for r in results if r.arrival_s == r.arrival_s),
                            default=0.0)
        notes = [f"timeseries stride: every {self._ts_stride} step(s)"]
        return ReplayResult(
            backend="sim", requests=results, itl_samples=self.itl_samples,
            timeseries=self._ts, counters=counters,
            simulated_s=max(0.0, self.now_s - min(first_arrival, self.now_s)),
            wall_s=wall_s, num_gpus=self.num_gpus, steps=self.steps, notes=notes)
