"""Drive a live vLLM server with a trace: open or closed loop, one stream per request.

Every request is ``POST /v1/completions`` with the prompt as token ids,
``max_tokens = output_len``, ``ignore_eos``, ``stream`` with ``include_usage``; the client
stamps every streamed token with ``time.perf_counter()``. What a client cannot see is
stated, not guessed: ``first_scheduled_s`` is the send time (vLLM does not stream the
admission time), per-request preemptions are 0 (only the total is in ``/metrics``), and
``num_cached_tokens`` is ``usage.prompt_tokens_details.cached_tokens``, which vLLM fills
only with ``--enable-prompt-tokens-details`` (the launcher passes it).

Prompt tokens come from :class:`tuner.vllm_core.tokens.TokenFactory` -- the same
mapping as the ``vllm-core`` backend: block hash ``h`` -> the ``B`` ids drawn from
``random.Random(h)``, so equal hashes give equal token blocks and vLLM prefix hits; the
partial tail is unique per request.

Failure handling: an HTTP error, a broken stream or a timeout gives that request
``status="error"`` (HTTP 400, i.e. vLLM refused the request, gives ``"rejected"``) and is
counted; nothing is dropped. If the launched server dies, every request in flight is
marked ``"error"``, those not yet sent ``"unfinished"``, and :class:`ServerDiedError`
carries the partial result.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import tuner.serve.http as http
from tuner.errors import BackendError, ConfigError
from tuner.records import ReplayResult, RequestResult
from tuner.serve.prometheus import (KV_USAGE, NUM_RUNNING, NUM_WAITING, MetricsSnapshot,
                                    counter_deltas, histogram_deltas)
from tuner.vllm_core.tokens import DriverRequest, TokenFactory
from tuner.sim.load import ClosedLoop, OpenLoop

if TYPE_CHECKING:
    from tuner.serve.server import VllmServer
    from tuner.trace import TraceRequest


class ServerDiedError(BackendError):
    """The launched server exited during a replay; ``partial`` holds what was measured."""

    def __init__(self, message: str, partial: ReplayResult) -> None:
        super().__init__(message)
        self.partial = partial


def prompt_tokens(factory: TokenFactory, request: "TraceRequest") -> list[int]:
    """The prompt token ids of ``request`` (block hashes at the factory's block size)."""
    return factory.prompt(DriverRequest(
        request_id=request.request_id, arrival_s=request.arrival_s,
        input_len=request.input_len, output_len=request.output_len,
        block_hashes=tuple(request.block_hashes),
        output_block_hashes=tuple(request.output_block_hashes)))


@dataclass(slots=True)
class _Flight:
    """One request's client-side record while the replay runs."""

    request: "TraceRequest"
    prompt: list[int] = field(default_factory=list)
    send_s: float = math.nan  # replay clock
    token_s: list[float] = field(default_factory=list)  # one stamp per output token
    tokens: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    usage_seen: bool = False
    status: str = "unfinished"
    error: str = ""
    done: asyncio.Event | None = None


@dataclass(slots=True)
class ReplayPlan:
    """What one server replay needs besides the server."""

    requests: Sequence["TraceRequest"]
    block_size: int  # KV block size the hashes are at (= the server's)
    load: OpenLoop | ClosedLoop
    num_gpus: int = 1
    thread_outputs: bool = False  # next turn's prompt holds the previous turn's real output
    use_priority: bool = False  # send TraceRequest.priority (policy "priority")

    def __post_init__(self) -> None:
        # A real closed loop sends each replacement when the stream has ended, so the
        # server's engine core has always scheduled its next step by then (the missed
        # step, docs/step-time-model.md §1.4): a twin replay without it is not what this
        # backend measures, and a comparison of the two would not be like for like.
        if isinstance(self.load, ClosedLoop) and not self.load.replacement_misses_step:
            raise ConfigError("a real server's closed loop always misses the step: "
                              "replacement_misses_step=False is the twin's alone")


class ServerReplay:
    """Runs one :class:`ReplayPlan` against a started :class:`VllmServer`."""

    def __init__(self, server: "VllmServer", plan: ReplayPlan,
                 progress: Callable[[float], None] | None = None) -> None:
        self.server = server
        self.plan = plan
        self.progress = progress
        self.factory = TokenFactory(plan.block_size)
        self.flights = [_Flight(r) for r in plan.requests]
        self._by_id = {f.request.request_id: f for f in self.flights}
        self._parents = self._find_parents() if plan.thread_outputs else {}
        self.samples: dict[str, list[float]] = {"t_s": [], "kv_usage": [], "num_running": [],
                                                 "num_waiting": [], "num_scheduled_tokens": []}
        self.notes: list[str] = []
        self._t0 = 0.0
        self._died: str | None = None
        self._num_done = 0

    # ------------------------------------------------------------- entry point
    def run(self) -> ReplayResult:
        """Replay, scrape ``/metrics`` around it and build the ``ReplayResult``.

        Raises:
            ServerDiedError: the launched server exited; ``.partial`` has the records.
        """
        before = self.server.scrape()
        wall0 = time.perf_counter()
        asyncio.run(self._main())
        wall = time.perf_counter() - wall0
        after: MetricsSnapshot | None = None
        if self._died is None:
            try:
                after = self.server.scrape()
            except BackendError as exc:
                self.notes.append(f"final /metrics scrape failed: {exc}")
        result = self._result(before, after, wall)
        if self._died is not None:
            raise ServerDiedError(self._died, result)
        return result

    async def _main(self) -> None:
        self._t0 = time.perf_counter()
        for f in self.flights:
            f.done = asyncio.Event()
        sampler = asyncio.create_task(self._sample_metrics())
        watcher = asyncio.create_task(self._watch_server())
        issuer = asyncio.create_task(self._issue())
        try:
            done, _ = await asyncio.wait({issuer, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if watcher in done and not issuer.done():
                issuer.cancel()
                await asyncio.gather(issuer, return_exceptions=True)
            elif issuer in done:
                issuer.result()
                await self._maybe_died()
        finally:
            for task in (sampler, watcher):
                task.cancel()
            await asyncio.gather(sampler, watcher, return_exceptions=True)

    def _now(self) -> float:
        return time.perf_counter() - self._t0

    # ------------------------------------------------------------------ issuing
    async def _issue(self) -> None:
        load = self.plan.load
        tasks: list[asyncio.Task[None]] = []
        try:
            if isinstance(load, ClosedLoop):
                sem = asyncio.Semaphore(load.concurrency)

                async def gated(f: _Flight) -> None:
                    try:
                        await self._send(f)
                    finally:
                        sem.release()

                for f in self.flights:
                    await sem.acquire()
                    tasks.append(asyncio.create_task(gated(f)))
            else:
                origin = self.flights[0].request.arrival_s if self.flights else 0.0
                for f in self.flights:
                    due = (f.request.arrival_s - origin) / load.speedup
                    delay = due - self._now()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    tasks.append(asyncio.create_task(self._send(f)))
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _send(self, f: _Flight) -> None:
        assert f.done is not None
        try:
            parent = self._parents.get(f.request.request_id)
            if parent is not None:
                assert parent.done is not None
                await parent.done.wait()  # a turn is sent once the previous one answered
            if self._died is not None or not self.server.is_alive():
                return  # a dead server gets no more requests: this one stays unsent
            f.prompt = self._prompt(f, parent)
            f.send_s = self._now()
            f.status = "error"  # until the stream completes
            await asyncio.wait_for(self._stream(f), self.server.options.request_timeout_s)
        except asyncio.TimeoutError:
            f.status, f.error = "error", f"timeout after {self.server.options.request_timeout_s} s"
        except http.HttpError as exc:
            msg = str(exc)
            f.status = "rejected" if msg.startswith("HTTP 400") else "error"
            f.error = msg
        except asyncio.CancelledError:
            if f.status == "error" and not f.error:
                f.error = "cancelled: the server died" if self._died else "cancelled"
            raise
        finally:
            f.done.set()
            self._num_done += 1
            if self.progress is not None:
                self.progress(self._num_done / max(len(self.flights), 1))

    def _prompt(self, f: _Flight, parent: _Flight | None) -> list[int]:
        base = prompt_tokens(self.factory, f.request)
        if parent is None or parent.status != "finished":
            return base
        threaded = parent.prompt + parent.tokens
        if len(threaded) > len(base):
            return base  # the next turn is shorter than prompt + answer: nothing to thread
        return threaded + base[len(threaded):]

    async def _stream(self, f: _Flight) -> None:
        r = f.request
        max_tokens = max(int(r.output_len), 1)
        payload: dict[str, Any] = {
            "model": self.server.model_name, "prompt": f.prompt, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
        if self.plan.use_priority and r.priority:
            payload["priority"] = int(r.priority)
        if getattr(r, "cache_salt", None):
            payload["cache_salt"] = r.cache_salt
        assert self.server.endpoint is not None
        finish_reason = None
        async with http.SseStream(self.server.endpoint, "/v1/completions", payload) as events:
            async for t, obj in events:
                for choice in obj.get("choices") or ():
                    ids = choice.get("token_ids") or []
                    stamp = t - self._t0
                    f.tokens.extend(int(x) for x in ids)
                    f.token_s.extend([stamp] * len(ids))
                    finish_reason = choice.get("finish_reason") or finish_reason
                usage = obj.get("usage")
                if usage:
                    details = usage.get("prompt_tokens_details") or {}
                    f.num_cached_tokens = int(details.get("cached_tokens") or 0)
                    f.usage_seen = "cached_tokens" in details
        if len(f.tokens) != max_tokens:
            f.error = f"{len(f.tokens)} tokens streamed, {max_tokens} asked ({finish_reason})"
            f.status = "error"
            return
        f.status = "finished"

    # ------------------------------------------------------------ background
    async def _sample_metrics(self) -> None:
        period = self.server.options.metrics_interval_s
        while True:
            try:
                snap = await self.server.scrape_async()
            except BackendError:
                snap = None
            if snap is not None:
                self.samples["t_s"].append(self._now())
                self.samples["kv_usage"].append(snap.value(KV_USAGE))
                self.samples["num_running"].append(snap.value(NUM_RUNNING))
                self.samples["num_waiting"].append(snap.value(NUM_WAITING))
                self.samples["num_scheduled_tokens"].append(math.nan)
            await asyncio.sleep(period)

    async def _maybe_died(self) -> None:
        """After the last request: did failures come from a server that exited meanwhile?

        Requests to a killed server fail within milliseconds (connection refused), which
        can finish the replay before the watcher's next poll; a dead launched server must
        still be reported as such.
        """
        if self.server.proc is None:
            return
        if any(f.status == "error" for f in self.flights):
            for _ in range(20):  # the exit can lag the broken connections a little
                if not self.server.is_alive():
                    break
                await asyncio.sleep(0.05)
        if not self.server.is_alive() and self._died is None:
            self._set_died()

    async def _watch_server(self) -> None:
        """Returns (ending the replay) only if the launched server exits."""
        while self.server.is_alive():
            await asyncio.sleep(0.2)
        self._set_died()

    def _set_died(self) -> None:
        proc = self.server.proc
        code = proc.returncode if proc is not None else None
        self._died = (f"vllm serve exited with code {code} during the replay after "
                      f"{self._now():.1f} s; partial results kept (finished requests are "
                      f"valid, in-flight ones marked 'error', unsent ones 'unfinished'); "
                      f"log: {self.server.log_path}")

    # ------------------------------------------------------------------ result
    def _find_parents(self) -> dict[str, _Flight]:
        """request id -> the previous turn of its session (``parent_id``, else session order)."""
        parents: dict[str, _Flight] = {}
        last_in_session: dict[str, _Flight] = {}
        for f in self.flights:
            r = f.request
            pid = getattr(r, "parent_id", None)
            if pid and pid in self._by_id:
                parents[r.request_id] = self._by_id[pid]
            elif r.session_id and r.session_id in last_in_session:
                parents[r.request_id] = last_in_session[r.session_id]
            if r.session_id:
                last_in_session[r.session_id] = f
        return parents

    def _result(self, before: MetricsSnapshot, after: MetricsSnapshot | None,
                wall_s: float) -> ReplayResult:
        records: list[RequestResult] = []
        itl: list[tuple[float, int]] = []
        n_err = n_timeout = n_rej = n_unsent = 0
        no_usage = 0
        for f in self.flights:
            r = f.request
            sent = math.isfinite(f.send_s)
            first = f.token_s[0] if f.token_s else math.nan
            last = f.token_s[-1] if f.token_s else math.nan
            status = f.status if sent else "unfinished"
            if status == "finished" and not f.usage_seen:
                no_usage += 1
            records.append(RequestResult(
                request_id=r.request_id, arrival_s=f.send_s if sent else r.arrival_s,
                input_len=len(f.prompt) if sent else r.input_len, output_len=len(f.tokens),
                first_scheduled_s=f.send_s if sent else math.nan, first_token_s=first,
                finish_s=last if status == "finished" else math.nan,
                num_cached_tokens=f.num_cached_tokens, num_preemptions=0,
                status=status, session_id=r.session_id))  # type: ignore[arg-type]
            if status == "finished":
                itl.extend((b - a, 1) for a, b in zip(f.token_s, f.token_s[1:]))
            n_err += status == "error"
            n_timeout += f.error.startswith("timeout")
            n_rej += status == "rejected"
            n_unsent += not sent
        counters: dict[str, float] = {"num_errors": n_err, "num_timeouts": n_timeout,
                                      "num_rejected": n_rej, "num_unsent": n_unsent}
        notes = list(self.notes)
        if after is not None:
            counters.update(counter_deltas(before, after))
            for name, stats in histogram_deltas(before, after).items():
                short = name.split(":", 1)[1]
                for key, value in stats.items():
                    counters[f"server_{short}_{key}"] = value
            steps = counters.get("server_iteration_tokens_total_count")
            if steps is not None:
                counters["num_steps"] = steps
        else:
            notes.append("counters from /metrics missing (no final scrape): prefix-cache hit "
                         "rate falls back to per-request usage details")
        errors = [f"{f.request.request_id}: {f.error}" for f in self.flights if f.error][:5]
        if n_err or n_rej:
            notes.append(f"{n_err} request(s) failed and {n_rej} were rejected by the server "
                         f"(first: {'; '.join(errors)})")
        if no_usage:
            notes.append(f"{no_usage} finished request(s) had no usage.prompt_tokens_details: "
                         "per-request cached tokens are 0 (start vLLM with "
                         "--enable-prompt-tokens-details)")
        if self._died:
            notes.append("PARTIAL: " + self._died)
        finished = [rec.finish_s for rec in records if rec.status == "finished"]
        span = max(finished) if finished else self._now()
        return ReplayResult(backend="vllm-serve", requests=records, itl_samples=itl,
                            timeseries=self.samples, counters=counters, simulated_s=span,
                            wall_s=wall_s, num_gpus=self.plan.num_gpus, steps=None, notes=notes)
