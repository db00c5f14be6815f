"""``Scheduler``: the twin of ``vllm/v1/core/sched/scheduler.py`` @ 0.33.0 (sync or async).

NOTE(model): as in vLLM there are no prefill and decode phases. Each request has
``num_computed_tokens`` and ``num_tokens``; every step gives tokens to requests so the
first catches up with the second, RUNNING requests first (in admission order), then
WAITING ones (queue order), within ``max_num_batched_tokens`` and ``max_num_seqs``.

Mapping (vLLM 0.33.0 ``schedule()`` 699-1785): ``_defer_prefills`` = 750-791 (DP
throttle and the local ``prefill_schedule_interval`` cadence); ``_schedule_running`` =
793-1035 (running loop, preemption 916-980); ``_reorder_waiting_by_cached_prefix`` =
PR #54625; ``_schedule_waiting`` = 1049-1616; the cadence stamp = 1618-1629;
``_update_after_schedule`` = 1845-1877; ``update_from_output`` = 2259-2676 with the fake
runner of spec §7.2 (no token while a prefill is partial, one token when the scheduled
tokens complete the sequence), ``ignore_eos`` and ``max_tokens`` as the only stop.

Async scheduling (``SimOptions.async_scheduling``: ``AsyncScheduler`` under a batch queue
of 2): the base-class rules keyed on output placeholders live here (the running loop's
``max_tokens`` skip and demand, stale output at preemption, the re-admission gate), the
placeholders and the update in ``tuner.sim.async_update``.

Speculative decoding (``SimOptions.speculative``): the drafts, lookahead slots, padding
and verify rules live in ``tuner.sim.spec_update``; the hooks here are a few lines each.

Deliberate divergences (docs/twin-vs-vllm.md lists them all): no encoders,
LoRA, structured output or pause states; a KV connector (``tuner.sim.kv_connector``, off by
default) brings the ``kv_holding_waiting`` queue (``kv_holding``), otherwise the queue
is always empty and not modelled (preempted requests have ``num_computed_tokens == 0``);
``deferred_waiting`` exists for the async gate and stays empty at depth 2.

Speed (same decisions): with ``SimOptions.fast_forward`` decode-ready running requests
form a ``DecodeGroup`` (``tuner.sim.decode_group``, a collaborator the scheduler owns;
its contract is in ``tuner.sim.fast_path``), advanced by one counter, and a step whose
outcome for the group is provable touches only members with a block event; waiting
requests' prefix hits are memoised (``KVCacheManager.num_hit_blocks``).
"""

from __future__ import annotations

from collections import deque

from tuner.errors import ConfigError
from tuner.sim._step_rules import blocks_needed, clamp_new_tokens, running_new_tokens
from tuner.sim.async_group import AsyncDecodeGroup
from tuner.sim.async_update import apply_outputs, place_outputs
from tuner.sim.batch import StepBatch
from tuner.sim.decode_group import DecodeGroup, seq_order
from tuner.sim.fast_path import fast_path_refusal
from tuner.sim.kv_cache_manager import KVCacheManager
from tuner.sim.kv_connector.admission import schedule_waiting_with_connector
from tuner.sim.kv_connector.hooks import (connector_has_work, connector_update,
                                          kv_cache_manager_class, make_connector)
from tuner.sim.request import RequestStatus, SimRequest
from tuner.sim.request_queue import FCFSRequestQueue, create_request_queue
from tuner.sim.scheduler_invariants import check_scheduler_invariants
from tuner.sim.scheduler_output import GroupStep, SchedulerOutput
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions
from tuner.sim.spec_update import SpecDecodeState

__all__ = ["Scheduler", "SchedulerOutput"]

_RUNNING = RequestStatus.RUNNING
_WAITING = RequestStatus.WAITING
_PREEMPTED = RequestStatus.PREEMPTED


class Scheduler:
    """Decides, step by step, which requests run and how many tokens each computes.

    Call order per step: ``add_request`` for arrivals, ``schedule()``, then
    ``update_from_output(output)`` once the step's tokens exist; it returns the
    requests that finished. Invariants asserted at the end of each ``schedule()``:
    scheduled tokens <= ``max_num_batched_tokens``, ``len(running) <= max_num_seqs``.

    ``group`` is the decode group (the fast path) or None: ``fast_forward`` off, or
    ``fast_path_refusal`` says why these settings run the plain path.
    """

    def __init__(self, settings: SchedulerSettings, cache: CacheSettings,
                 options: SimOptions | None = None, *, num_hash_ids: int = 1 << 16) -> None:
        settings.validate()
        cache.validate()
        self.settings = settings
        self.cache = cache
        self.options = options or SimOptions()
        self.block_size = cache.block_size
        self.max_model_len = cache.max_model_len
        self.kv_cache_manager = kv_cache_manager_class(self.options)(
            num_gpu_blocks=cache.num_gpu_blocks, block_size=cache.block_size,
            enable_caching=cache.enable_prefix_caching, max_model_len=cache.max_model_len,
            watermark=settings.watermark, num_hash_ids=num_hash_ids)
        self.policy = settings.policy
        self.waiting = create_request_queue(settings.policy)
        self.running: list[SimRequest] = []
        self.max_num_running_reqs = settings.max_num_seqs
        self.max_num_scheduled_tokens = settings.max_num_batched_tokens
        # PR #54625: the window only exists for fcfs + prefix caching.
        self.cache_aware_window = (
            settings.cache_aware_admission_window
            if settings.policy == "fcfs" and cache.enable_prefix_caching else 0)
        self.cache_aware_threshold = settings.cache_aware_admission_threshold
        # prefill_schedule_interval clocks (see _defer_prefills).
        mode = self.options.prefill_interval_mode
        interval = settings.prefill_schedule_interval
        self.local_prefill_interval = interval if mode == "local" else 1
        self.dp_prefill_interval = interval if mode == "dp" else 1
        self.num_executed_steps = 0  # steps that scheduled > 0 tokens
        self.last_prefill_step = -self.local_prefill_interval  # first step never gated
        self.dp_step_counter = 0  # DP engine step counter, 0 at the start of a wave
        self.prefill_capacity_bound = False  # #44558 escape: a release step left a queue
        # Counters (vLLM's PrefixCacheStats for non-preempted admissions, num_preemptions).
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_preemptions = 0
        # Async scheduling (tuner.sim.async_update): the mode, and vLLM's
        # ``deferred_waiting``, waiting requests the stale-output gate skipped (1084-1089;
        # never filled at batch queue depth 2, see _schedule_waiting).
        self.async_scheduling = self.options.async_scheduling
        self.self_preemption_continues = self.options.self_preemption_continues
        self.kv_cache_manager.register_on_free = not self.async_scheduling
        # KV connector (tuner.sim.kv_connector): None, or the CPU tier with vLLM's
        # kv_holding_waiting queue, the requests whose load is in flight and those whose
        # load the worker reported (finished_recving_kv_req_ids).
        self.connector = make_connector(self.options.kv_offload, cache)
        self.fenced = self.connector is not None and self.async_scheduling  # block_fence
        self.kv_holding = create_request_queue(settings.policy)
        self.loading: set[str] = set()
        self.finished_recving: set[str] = set()
        self.deferred_waiting: set[SimRequest] = set()
        # Fast path: steady decoders advanced together (tuner.sim.decode_group), unless
        # a setting is outside its contract (tuner.sim.fast_path).
        self.fast_path_refusal = (fast_path_refusal(settings, cache, self.options)
                                  if self.options.fast_forward else None)
        self.group: DecodeGroup | None = None
        if self.options.fast_forward and self.fast_path_refusal is None:
            group_cls = AsyncDecodeGroup if self.async_scheduling else DecodeGroup
            self.group = group_cls(self, block_size=cache.block_size,
                                   caching=cache.enable_prefix_caching,
                                   max_model_len=cache.max_model_len)
        # The same group when it is the async one (its join/plain_step/apply calls).
        self.async_group = self.group if isinstance(self.group, AsyncDecodeGroup) else None
        # Async: the scheduled steps whose outputs are not applied yet, oldest first.
        self.in_flight_steps: deque[SchedulerOutput] = deque()
        self._next_seq = 0
        self._last_group_step: GroupStep | None = None  # expired when the next step starts
        # Speculative decoding (tuner.sim.spec_update), None when off: then no hook below
        # costs more than reading a zero (a request's drafts, the lookahead slots).
        self.spec: SpecDecodeState | None = None
        if self.options.speculative is not None and self.connector is not None:
            raise ConfigError("speculative decoding with a CPU KV tier (--kv-offloading-size) "
                              "is not modelled yet: replay one or the other")
        if self.options.speculative is not None:
            self.spec = SpecDecodeState(self.options.speculative, cache.max_model_len,
                                        self.settings.max_num_seqs)
            self.kv_cache_manager.num_lookahead_tokens = (
                self.options.speculative.num_lookahead_tokens)

    # ----------------------------------------------------------------- requests
    def add_request(self, request: SimRequest) -> None:
        self.kv_cache_manager.adopt(request)
        request.status = _WAITING
        self.waiting.add_request(request)
        if self.connector is not None:
            self.connector.on_new_request(request)

    def has_requests(self) -> bool:
        if self.connector is not None:  # vLLM steps on while transfers are pending
            return connector_has_work(self)
        return bool(self.running) or bool(self.waiting)

    # ----------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        last = self._last_group_step
        if last is not None:  # the group moves on: the previous step's view is stale
            last.expired = True
        out = SchedulerOutput()
        running = self.running
        token_budget = self.max_num_scheduled_tokens
        threshold = self.settings.long_prefill_token_threshold
        if len(running) + len(self.waiting) <= 1:
            threshold = 0  # the chunk cap is not applied to a lone request
        defer = self._defer_prefills()
        out.deferred = defer
        group = self.group
        prefill_scheduled = False
        async_group = self.async_group
        if async_group is not None:
            pending = self.in_flight_steps
            async_group.join(pending[-1] if pending else None)
        if group is not None and group.size:
            plan = group.plan(token_budget, threshold, defer)
            if plan is None:
                group.dissolve()  # not provably a group step: the plain step below
            else:
                token_budget, prefill_scheduled = group.run(out, token_budget, plan)
        self._last_group_step = out.group
        if out.group is None:
            if async_group is not None:
                async_group.plain_step()
            token_budget, prefill_scheduled = self._schedule_running(out, token_budget,
                                                                     threshold, defer)
        prefill_admitted = False
        if self.spec is not None:
            self.spec.begin_admissions(out, prefill_scheduled)
        if not out.preempted:
            if self.cache_aware_window and not defer:
                self._reorder_waiting_by_cached_prefix()
            connector = self.connector
            if connector is None or (self.spec is None
                                     and getattr(connector, "plain_admission", False)):
                # a connector that never loads (the P/D prefill instance's) admits as
                # the plain loop does: tuner.sim.fast_path item 6
                prefill_admitted = self._schedule_waiting(out, token_budget, threshold, defer)
            else:
                prefill_admitted = schedule_waiting_with_connector(self, out, token_budget,
                                                                   threshold, defer)
            if not defer:  # 1614-1616: skipped (deferred) waiting requests do not count
                self.prefill_capacity_bound = (len(self.waiting) + len(self.kv_holding)
                                               > len(self.deferred_waiting))
        # Cadence stamp (1618-1629).
        if out.total_num_scheduled_tokens > 0:
            self.num_executed_steps += 1
            if self.local_prefill_interval > 1 and (prefill_scheduled or prefill_admitted):
                self.last_prefill_step = self.num_executed_steps
        self.dp_step_counter += 1
        assert out.total_num_scheduled_tokens <= self.max_num_scheduled_tokens
        assert len(running) <= self.max_num_running_reqs
        if self.connector is not None:  # 1755-1758: before computed tokens advance
            self.connector.build_connector_meta(out)
            if self.fenced:  # vLLM's defer_block_free fence (block_fence)
                self.kv_cache_manager.step_scheduled(out)  # type: ignore[attr-defined]
        self._update_after_schedule(out)
        if self.async_scheduling:
            self.in_flight_steps.append(out)
        return out

    def _defer_prefills(self) -> bool:
        """Whether this step carries no prefill at all (spec §3)."""
        if self.prefill_capacity_bound:
            return False
        if self.dp_prefill_interval > 1:
            throttle = self.dp_step_counter % self.dp_prefill_interval != 0
        elif self.local_prefill_interval > 1:
            throttle = ((self.num_executed_steps + 1) - self.last_prefill_step
                        < self.local_prefill_interval)
        else:
            return False
        if not throttle:
            return False
        # Only defer while something can decode: the model is never left idle.
        for request in self.running:
            if not request.is_prefill_chunk:
                return True
        return False

    def _schedule_running(self, out: SchedulerOutput, token_budget: int, threshold: int,
                          defer: bool) -> tuple[int, bool]:
        running = self.running
        kvm = self.kv_cache_manager
        scheduled = out.individual
        max_model_len = self.max_model_len
        prefill_scheduled = False
        req_index = 0
        while req_index < len(running) and token_budget > 0:
            request = running[req_index]
            placeholders = request.num_output_placeholders  # 0 in sync mode
            if placeholders and (request.num_computed_tokens + 2 - placeholders
                                 >= request.num_prompt_tokens + request.max_tokens):
                req_index += 1  # async: the in-flight step yields the last token (800-814)
                continue
            if defer and request.is_prefill_chunk:
                req_index += 1
                continue
            # Demand: num_tokens + drafts + placeholders - num_computed (839-843).
            num_new = running_new_tokens(request.num_tokens + request.num_spec_tokens
                                         + placeholders,
                                         request.num_computed_tokens, threshold,
                                         token_budget, max_model_len)
            if num_new <= 0:
                req_index += 1
                continue
            while not kvm.allocate_slots(request, num_new):
                victim_index = self._victim_index()
                if self.fenced and not kvm.can_free_now(running[victim_index]):  # type: ignore[attr-defined]
                    break  # 939-941: its blocks would come back too late (block_fence)
                victim = running.pop(victim_index)
                if victim is not request and self.policy == "priority":
                    # 935-947: a victim ahead of the loop's position shifts it back, and
                    # one already scheduled this step gives its tokens back.
                    if victim_index < req_index:
                        req_index -= 1
                    for j, (req, n) in enumerate(scheduled):
                        if req is victim:
                            del scheduled[j]
                            token_budget += n
                            out.total_num_scheduled_tokens -= n
                            if self.spec is not None:
                                self.spec.unschedule(out, victim)
                            break
                self.preempt_request(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            else:
                scheduled.append((request, num_new))
                out.total_num_scheduled_tokens += num_new
                token_budget -= num_new
                if request.is_prefill_chunk:
                    prefill_scheduled = True
                if request.num_spec_tokens:  # drafts (never without speculative decoding)
                    self.spec.drafts_scheduled(request, num_new, out)  # type: ignore[union-attr]
                req_index += 1
                continue
            if (self.self_preemption_continues and self.policy == "priority"
                    and request.status == _PREEMPTED):
                # 0.33.0 (982-992), both modes: the lowest-priority request preempted
                # itself; the ones after it may still fit, and req_index already points
                # at the next. 0.32.0 breaks (SimOptions.self_preemption_continues).
                continue
            break  # the request preempted itself
        return token_budget, prefill_scheduled

    def _victim_index(self) -> int:
        """Position in running of the request to preempt (vLLM: the lowest priority,
        latest arrival under ``priority``; the tail of running under ``fcfs``)."""
        running = self.running
        if self.policy == "priority":
            victim = max(running, key=lambda r: (r.priority, r.arrival_s))
            for i, r in enumerate(running):
                if r is victim:
                    return i
        return len(running) - 1

    def pick_victim(self) -> SimRequest:
        """Remove and return the request to preempt (``_victim_index``)."""
        return self.running.pop(self._victim_index())

    def preempt_request(self, request: SimRequest) -> None:
        """Recompute preemption (1799-1843): free blocks, back to the queue front.

        Async: the victim's in-flight output becomes stale (1830): it is still delivered
        at update (``tuner.sim.async_update``) but leaves the reset counters alone, and
        its placeholders are dropped (1831)."""
        assert request.status == _RUNNING, f"only RUNNING requests are preempted: {request!r}"
        self.kv_cache_manager.free(request)
        request.status = _PREEMPTED
        request.num_computed_tokens = 0
        request.is_prefill_chunk = False
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_spec_tokens = 0  # drafts are dropped (1823-1824)
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend_request(request)

    def _reorder_waiting_by_cached_prefix(self) -> None:
        """PR #54625: stable-sort the window's plain-WAITING peers by cached tokens, desc.

        Skipped when fewer than 2 waiting or usage is strictly below the threshold.
        Peers (status WAITING, nothing computed) are permuted among their own slots;
        everything else in the window, and everything past it, keeps its index.
        """
        waiting = self.waiting
        if len(waiting) < 2:
            return
        kvm = self.kv_cache_manager
        if kvm.usage < self.cache_aware_threshold:
            return
        assert isinstance(waiting, FCFSRequestQueue)
        window = self.cache_aware_window
        head = [waiting[i] for i in range(min(window, len(waiting)))]
        slots = [i for i, r in enumerate(head)
                 if r.status == _WAITING and r.num_computed_tokens == 0]
        if len(slots) < 2:
            return
        cached = kvm.num_cached_tokens_of([head[i] for i in slots])
        # Stable: equal counts keep their queue order (the PR's key (-cached, index)).
        order = [slots[j] for j in sorted(range(len(slots)), key=lambda j: -cached[j])]
        if order == slots:
            return
        new_head = list(head)
        for slot, src in zip(slots, order):
            new_head[slot] = head[src]
        for _ in range(len(head)):
            waiting.popleft()
        waiting.extendleft(reversed(new_head))

    def _schedule_waiting(self, out: SchedulerOutput, token_budget: int, threshold: int,
                          defer: bool) -> bool:
        waiting = self.waiting
        running = self.running
        kvm = self.kv_cache_manager
        chunked = self.settings.enable_chunked_prefill
        full_fit = self.settings.scheduler_reserve_full_isl
        prefill_admitted = False
        spec = self.spec
        skipped: list[SimRequest] = []
        while waiting and token_budget > 0:
            if len(running) >= self.max_num_running_reqs:
                break
            request = waiting[0]
            if request.num_stale_output_tokens:
                # Async re-admission gate (1084-1089): stale output still in flight, skip
                # the request this step. Never binds at batch queue depth 2: a victim is
                # preempted in schedule(N+1), which then admits nobody (out.preempted),
                # and update(N) drains its stale share before schedule(N+2)
                # (tests/sim/test_async_scheduling.py pins that).
                skipped.append(waiting.pop_request())
                self.deferred_waiting.add(request)
                continue
            if request.hit_memo >= 0 and self._surely_blocked(
                    request, token_budget, threshold, defer):
                break
            # Twin: every waiting request has num_computed_tokens == 0 (no connector, or
            # one with ``plain_admission``: nothing is ever loaded into a waiting one).
            hit_blocks, num_hit = kvm.get_computed_blocks(request)
            needs_prefill = num_hit < request.num_tokens - 1
            if defer and needs_prefill:
                break
            num_new = request.num_tokens - num_hit
            if spec is not None and num_new == 1:  # spec decode pads it to 1 + k (1306-1331)
                num_new = spec.pad(num_hit, token_budget)
                if num_new == 0:
                    break
            num_new = clamp_new_tokens(num_new, threshold, token_budget, chunked)
            if num_new <= 0:
                break  # chunking off and the budget would cut it
            if not kvm.allocate_slots(request, num_new, num_hit, hit_blocks,
                                      full_sequence_must_fit=full_fit,
                                      has_scheduled_reqs=bool(running)):
                if kvm.enable_caching and request.hit_memo < 0:
                    # memoise: it will be probed again. The hit was just gathered and a
                    # failed allocation changes nothing, so its length and blocks are
                    # current.
                    kvm.num_hit_blocks(request, len(hit_blocks), hit_blocks)
                break  # head-of-line blocking: no preemption from the waiting loop
            kvm.unwatch(request)
            if self.deferred_waiting:
                self.deferred_waiting.discard(request)
            if request.num_preemptions == 0:
                self.prefix_cache_queries += request.num_tokens
                self.prefix_cache_hits += num_hit
            waiting.pop_request()
            running.append(request)
            request.seq = self._next_seq
            self._next_seq += 1
            if self.group is not None:
                self.group.admitted(request)
            request.status = _RUNNING
            request.num_computed_tokens = num_hit
            out.individual.append((request, num_new))
            out.admitted.append((request, num_hit))
            if spec is not None and num_new > request.num_tokens - num_hit:
                spec.admitted_padded(request, out)
            out.total_num_scheduled_tokens += num_new
            token_budget -= num_new
            if needs_prefill:
                prefill_admitted = True
        if skipped:  # back to the front, in their order (1609-1610)
            waiting.prepend_requests(skipped)
        return prefill_admitted

    def _surely_blocked(self, request: SimRequest, token_budget: int, threshold: int,
                        defer: bool) -> bool:
        """True if the head request's admission would fail, proven from its memoised
        hit length alone (no walk over its hit blocks).

        The loop's own checks with the exact hit ``L`` blocks; for the allocation a lower
        bound of what ``allocate_slots`` requires: free hit blocks would only add to it.
        Every outcome proven here is a plain ``break`` in ``_schedule_waiting``, which
        has no side effect, so skipping the walk changes nothing.
        """
        kvm = self.kv_cache_manager
        bs = self.block_size
        num_blocks = kvm.num_hit_blocks(request)
        num_hit = num_blocks * bs
        if defer and num_hit < request.num_tokens - 1:
            return True
        num_new = clamp_new_tokens(request.num_tokens - num_hit, threshold, token_budget,
                                   self.settings.enable_chunked_prefill)
        if num_new <= 0:
            return True
        watermark = kvm.watermark_blocks if self.running else 0
        free = kvm.block_pool.free_block_queue.num_free_blocks
        if (self.settings.scheduler_reserve_full_isl
                and blocks_needed(min(request.num_tokens, self.max_model_len), num_blocks, bs)
                + watermark > free):
            return True
        return (blocks_needed(min(num_hit + num_new + kvm.num_lookahead_tokens,
                                  self.max_model_len), num_blocks, bs)
                + watermark > free)

    def _update_after_schedule(self, out: SchedulerOutput) -> None:
        """Advance computed tokens before execution (so the next chunk can be planned)
        and build the step's ``StepBatch`` (same rule as ``StepBatch.from_requests``)."""
        npr = ndr = npt = pctx = dctx = 0
        pairs = 0.0
        for request, n in out.individual:
            ctx = request.num_computed_tokens
            if n == 1:
                ndr += 1
                dctx += ctx + 1
            else:
                npr += 1
                npt += n
                pctx += ctx
                pairs += n * (ctx + (n + 1) / 2)
            ctx += n
            request.num_computed_tokens = ctx
            # + placeholders (0 in sync mode): 1870-1872.
            request.is_prefill_chunk = ctx < request.num_tokens + request.num_output_placeholders
        step = out.group
        if step is not None:  # each member: one token over its whole sequence
            ndr += step.num_members
            dctx += step.sum_tokens
        spec_tokens = out.spec_tokens
        if spec_tokens:  # verifies: priced with their drafts (tuner.perf.spec_decode)
            out.batch = StepBatch(npr, ndr, npt, pctx, pairs, dctx, len(spec_tokens),
                                  sum(n for n, _ in spec_tokens.values()))
        else:
            out.batch = StepBatch(npr, ndr, npt, pctx, pairs, dctx)
        if self.async_scheduling:
            if self.spec is not None:
                self.spec.place_outputs(out)
            else:
                place_outputs(out)

    # ----------------------------------------------------------------- outputs
    def update_from_output(self, out: SchedulerOutput, now_s: float = 0.0,
                           gaps: dict[float, int] | None = None) -> list[SimRequest]:
        """Apply the step's model output at time ``now_s``.

        Each request whose scheduled tokens completed its sequence gets one token (a
        partial prefill gets none: the runner discards that sample); its first-token
        time or its inter-token gap (pooled into ``gaps``: gap_s -> count) is recorded.
        Requests reaching ``max_tokens`` finish and free their blocks, in output order.
        """
        if gaps is None:
            gaps = {}
        if self.connector is not None:
            return connector_update(self, self._update_from_output, out, now_s, gaps)
        return self._update_from_output(out, now_s, gaps)

    def _update_from_output(self, out: SchedulerOutput, now_s: float,
                            gaps: dict[float, int]) -> list[SimRequest]:
        if self.spec is not None:  # verifies: tuner.sim.spec_update
            if self.async_scheduling:
                oldest = self.in_flight_steps.popleft()
                assert oldest is out, "async steps are applied in the order scheduled"
                return self.spec.update_async(self, out, now_s, gaps)
            return self.spec.update_sync(self, out, now_s, gaps)
        if self.async_scheduling:
            oldest = self.in_flight_steps.popleft()
            assert oldest is out, "async steps are applied in the order scheduled (tuner bug)"
            finished = apply_outputs(self, out, now_s, gaps)
            if self.async_group is not None:
                self.async_group.apply(out, now_s, gaps, finished)
            return finished
        finished: list[SimRequest] = []
        group = self.group
        step = out.group
        if step is not None:
            assert group is not None, "a group step without a group (tuner bug)"
            group.apply_tokens(step, now_s, gaps, finished)
        for request, _ in out.individual:
            if request.num_computed_tokens < request.num_tokens:
                continue
            request.deliver_output_token(now_s, gaps)
            if request.num_output_tokens >= request.max_tokens:
                request.status = RequestStatus.FINISHED
                request.finish_s = now_s
                finished.append(request)
        if finished:
            if step is not None:
                finished.sort(key=seq_order)  # the plain path frees in scheduled (= seq) order
            free = self.kv_cache_manager.free
            for request in finished:
                free(request)
            if len(finished) <= 4:  # list.remove keeps the order, without a full rebuild
                for request in finished:
                    self.running.remove(request)
            else:
                self.running = [r for r in self.running if r.status == _RUNNING]
        if group is not None:
            group.after_update(out, finished, now_s)
        return finished

    def materialize_all(self) -> None:
        """Bring every group member's counters up to date (before results are read)."""
        if self.group is not None:
            self.group.materialize_all()

    def scheduled_tokens(self, out: SchedulerOutput) -> dict[str, int]:
        """request id -> tokens scheduled in ``out``, in vLLM's order (for StepRecords);
        valid until ``out`` is applied (``SchedulerOutput.items``)."""
        return out.num_scheduled_tokens()

    def check_invariants(self) -> None:
        """Walk the scheduler's, the group's and the cache's invariants (read only;
        ``tuner.sim.scheduler_invariants``)."""
        check_scheduler_invariants(self)
