"""The scheduler's speculative-decoding rules (vLLM 0.33.0), called from small hooks in
``tuner.sim.scheduler`` only when ``SimOptions.speculative`` is set.

File:line under ``vllm/v1/core/sched/`` (scheduler.py unless named):

* **Drafts in the demand.** A running request's demand is ``num_tokens_with_spec +
  num_output_placeholders - num_computed_tokens`` (839-843): ``SimRequest.num_spec_tokens``
  is ``len(spec_token_ids)``. Once scheduled, the drafts that fit are the step's
  ``scheduled_spec_decode_tokens`` (1010-1025: ``num_new + computed - num_tokens -
  placeholders`` of them) and the request's drafts are cleared (:meth:`drafts_scheduled`).
* **Lookahead slots**: ``KVCacheManager.num_lookahead_tokens`` (set by the scheduler).
* **Padding**: a waiting request admitted with one token left (a full prefix hit) while
  running requests are scheduled and no prefill ran in the running loop is padded to
  ``1 + k`` tokens with ``k`` placeholder drafts (1306-1331, 1578-1582); a budget below
  ``1 + k`` stops admissions (:meth:`pad`). Placeholder drafts are never accepted.
* **Drafts after a step.** Sync: ``EngineCore.post_step`` hands the drafter's ``k``
  drafts to ``update_draft_token_ids`` (2862-2881) for every request that sampled and
  did not finish. Async: ``AsyncScheduler._update_after_schedule`` (async_scheduler.py:
  24-56) gives every sampling request ``1 + len(scheduled drafts)`` placeholders and
  ``k`` placeholder drafts at schedule time (:meth:`place_outputs`).
* **Verify at update** (2346-2364, ``_update_request_with_output`` 2744-2770):
  ``1 + accepted`` tokens come back; rejected drafts roll back ``num_computed_tokens``
  (and placeholders) unless the output is stale; tokens are appended one by one and a
  stop (``max_tokens``) inside the burst trims the rest and rolls ``num_computed_tokens``
  back by the trimmed count; full blocks up to ``computed - in_flight`` are registered
  (2402-2415: in spec mode whenever the request was RUNNING and the output not stale).
  The counters are ``SpecDecodingStats.observe_draft`` (v1/spec_decode/metrics.py):
  every scheduled draft list counts, placeholders and stale outputs included.
* **Preemption** clears the drafts (1823-1824; ``Scheduler.preempt_request``).
"""

from __future__ import annotations

from typing import Any

from tuner.sim.async_update import AsyncHost, settle_in_flight
from tuner.sim.request import RequestStatus, SimRequest
from tuner.sim.scheduler_output import SchedulerOutput
from tuner.sim.spec_decode import SpecDecoding

_RUNNING = RequestStatus.RUNNING
_FINISHED = RequestStatus.FINISHED


class SpecDecodeState:
    """The scheduler's speculative-decoding collaborator: the rules above and the
    counters vLLM's ``SpecDecodingStats`` keeps."""

    def __init__(self, spec: SpecDecoding, max_model_len: int, max_num_seqs: int = 0) -> None:
        self.spec = spec
        self.k = spec.num_speculative_tokens
        self.max_model_len = max_model_len
        # num_speculative_tokens_per_batch_size: each step's k by its scheduled requests
        # (scheduler.py:1710-1714), None for a fixed k; it also turns padding off (1312)
        self.k_lookup = spec.k_lookup(max_num_seqs)
        # Counters (SpecDecodingStats, summed over the replay).
        self.num_drafts = 0  # verifies: scheduled draft lists whose output came back
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * self.k
        # Per step: whether the running loop scheduled a request / a prefill chunk
        # (the padding rule reads both; set by begin_admissions).
        self._running_scheduled = False
        self._running_prefill = False

    # ----------------------------------------------------------------- schedule
    def drafts_scheduled(self, request: SimRequest, num_new: int, out: SchedulerOutput) -> None:
        """1010-1025: the drafts this step verifies; the request's drafts are cleared
        (new ones arrive after the step)."""
        n = (num_new + request.num_computed_tokens - request.num_tokens
             - request.num_output_placeholders)
        if n > 0:
            out_spec(out)[request] = (min(n, request.num_spec_tokens), False)
        request.num_spec_tokens = 0

    def unschedule(self, out: SchedulerOutput, victim: SimRequest) -> None:
        """A priority victim scheduled earlier this step gives its drafts back (957)."""
        if out.spec_tokens:
            out.spec_tokens.pop(victim, None)

    def begin_admissions(self, out: SchedulerOutput, prefill_scheduled: bool) -> None:
        self._running_scheduled = bool(out.individual)
        self._running_prefill = prefill_scheduled

    def pad(self, num_computed: int, token_budget: int) -> int:
        """Tokens of an admission with one token left: ``1 + k`` when vLLM pads it
        (1306-1331), 1 when it does not, 0 when the budget cannot hold the padded step
        (vLLM then stops admitting: "prefer to not schedule than schedule un-padded")."""
        if (self._running_prefill or not (self._running_scheduled or num_computed > 0)
                or self.k_lookup is not None):
            return 1
        padded = 1 + self.k
        if num_computed + padded + 1 > self.max_model_len:
            return 1
        return 0 if padded > token_budget else padded

    def admitted_padded(self, request: SimRequest, out: SchedulerOutput) -> None:
        out_spec(out)[request] = (self.k, True)

    def place_outputs(self, out: SchedulerOutput) -> None:
        """Async ``_update_after_schedule`` with drafts: ``1 + len(spec)`` placeholders
        and ``k`` placeholder drafts per sampling request (async_scheduler.py:24-56)."""
        sampled = out.sampled
        spec = out.spec_tokens or {}
        k = self.k if self.k_lookup is None else self.k_lookup[len(out.individual)]
        for request, n in out.individual:
            request.num_in_flight_tokens += n
            samples = not request.is_prefill_chunk
            if samples:
                drafts = spec.get(request)
                request.num_output_placeholders += 1 + (drafts[0] if drafts else 0)
                request.num_spec_tokens = k
            sampled.append(samples)

    # ----------------------------------------------------------------- update
    def _verify(self, request: SimRequest, drafts: tuple[int, bool] | None) -> tuple[int, int]:
        """(tokens the runner returns, drafts rejected) for one sampling request, and the
        counters of its verify."""
        if not drafts:
            return 1, 0
        num_drafts, padded = drafts
        accepted = 0 if padded else self.spec.num_accepted(
            request.request_id, request.num_tokens, num_drafts)
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += accepted
        per_pos = self.accepted_per_pos
        for i in range(accepted):
            per_pos[i] += 1
        return 1 + accepted, num_drafts - accepted

    def update_sync(self, scheduler: AsyncHost, out: SchedulerOutput, now_s: float,
                    gaps: dict[float, int]) -> list[SimRequest]:
        """``update_from_output`` + ``update_draft_token_ids`` of a sync step."""
        kvm = scheduler.kv_cache_manager
        spec = out.spec_tokens or {}
        k = self.k if self.k_lookup is None else self.k_lookup[len(out.individual)]
        finished: list[SimRequest] = []
        for request, _ in out.individual:
            if request.num_computed_tokens < request.num_tokens:
                continue  # a partial prefill samples nothing (and gets no drafts)
            num_out, rejected = self._verify(request, spec.get(request))
            if rejected and request.num_computed_tokens > 0:
                request.num_computed_tokens -= rejected
            stopped = deliver_burst(request, num_out, now_s, gaps, trim=True)
            kvm.cache_blocks(request, request.num_computed_tokens)
            if stopped:  # freed at once, in output order (_free_request)
                request.status = RequestStatus.FINISHED
                request.finish_s = now_s
                kvm.free(request)
                finished.append(request)
            else:
                request.num_spec_tokens = k  # post_step: the drafter's k drafts
        if finished:
            scheduler.running = [r for r in scheduler.running if r.status == _RUNNING]
        return finished

    def update_async(self, scheduler: AsyncHost, out: SchedulerOutput, now_s: float,
                     gaps: dict[float, int]) -> list[SimRequest]:
        """``update_from_output`` of an async step (``tuner.sim.async_update`` plus the
        verify): placeholders and computed tokens roll back by the rejected drafts."""
        kvm = scheduler.kv_cache_manager
        spec = out.spec_tokens or {}
        finished: list[SimRequest] = []
        stopped_waiting: list[SimRequest] = []
        any_running = False
        for request, stale in settle_in_flight(zip(out.individual, out.sampled)):
            num_out, rejected = self._verify(request, spec.get(request))
            if rejected and not stale:
                if request.num_computed_tokens > 0:
                    request.num_computed_tokens -= rejected
                if request.num_output_placeholders > 0:
                    request.num_output_placeholders -= rejected
            status_before = request.status
            stopped = deliver_burst(request, num_out, now_s, gaps, trim=not stale)
            if not stale and request.num_output_placeholders > 0:
                request.num_output_placeholders -= num_out
                assert request.num_output_placeholders >= 0, request
            if not stale and status_before == _RUNNING:
                kvm.cache_blocks(request,
                                 request.num_computed_tokens - request.num_in_flight_tokens)
            if stopped:
                request.status = _FINISHED
                request.finish_s = now_s
                kvm.free(request)
                finished.append(request)
                if status_before == _RUNNING:
                    any_running = True
                else:
                    stopped_waiting.append(request)
        if any_running:
            scheduler.running = [r for r in scheduler.running if r.status == _RUNNING]
        if stopped_waiting:
            for request in stopped_waiting:
                kvm.unwatch(request)
            scheduler.waiting.remove_requests(stopped_waiting)
            scheduler.deferred_waiting.difference_update(stopped_waiting)
        return finished

    # ----------------------------------------------------------------- results
    def counters(self) -> dict[str, float]:
        """vLLM's spec-decode counters (``vllm:spec_decode_num_*``), summed."""
        out = {"spec_num_drafts": float(self.num_drafts),
               "spec_num_draft_tokens": float(self.num_draft_tokens),
               "spec_num_accepted_tokens": float(self.num_accepted_tokens)}
        for i, n in enumerate(self.accepted_per_pos):
            out[f"spec_num_accepted_tokens_pos{i}"] = float(n)
        return out


def out_spec(out: SchedulerOutput) -> dict[SimRequest, tuple[int, bool]]:
    """The step's ``scheduled_spec_decode_tokens``: request -> (drafts, placeholders?)."""
    if out.spec_tokens is None:
        out.spec_tokens = {}
    return out.spec_tokens


def deliver_burst(request: SimRequest, num_out: int, now_s: float, gaps: dict[float, int],
                  *, trim: bool) -> bool:
    """Append up to ``num_out`` tokens at ``now_s``, stopping at ``max_tokens``
    (``_update_request_with_output``); True if the request stopped. A stop inside the
    burst rolls ``num_computed_tokens`` back by the trimmed tokens (``trim``: not for a
    stale output). One inter-token gap per burst, as vLLM's iteration stats count one
    per request and step."""
    room = request.max_tokens - request.num_output_tokens
    n = num_out if num_out < room else room
    stopped = n == room
    if trim and n < num_out:
        request.num_computed_tokens -= num_out - n
    request.num_output_tokens += n
    request.num_tokens += n
    last = request.last_token_s
    if last != last:
        request.first_token_s = now_s
    else:
        gap = now_s - last
        gaps[gap] = gaps.get(gap, 0) + 1
    request.last_token_s = now_s
    return stopped


def spec_counters(state: Any) -> dict[str, float]:
    """Counters of a scheduler's spec state (empty without speculative decoding)."""
    return state.counters() if state is not None else {}
