"""The fast path's contract: when ``SimOptions.fast_forward`` may take the decode group.

The fast path (``tuner.sim.decode_group.DecodeGroup``, owned by the ``Scheduler``) is a
second way to compute a step, not a second model: it must decide exactly what the plain
path decides. What it promises, and when it steps aside:

1. **Same records.** A replay with ``SimOptions.fast_forward`` gives byte-identical
   request, step, gap, counter and time-series records to the plain path, with the
   per-step invariant checks on or off (they read the group through its accessors and
   change nothing). ``tests/sim/test_fast_path_contract.py`` generates settings over
   every field below and compares both paths; ``tests/replay/test_golden_replays.py``
   pins seven replays of the bundled traces.
2. **Declared settings.** Every field of ``SchedulerSettings``, ``CacheSettings`` and
   ``SimOptions`` is declared in ``FAST_PATH_FIELDS``: how the fast path models it, or
   which values it refuses. For a refused value, or a field nobody declared (a new
   one), ``fast_path_refusal`` names it and the scheduler runs the plain path for the
   whole replay (``Scheduler.fast_path_refusal`` says why). A test fails while a field
   is undeclared, so a new setting cannot silently run the old semantics here.
3. **Provable steps only.** A step is a *group step* only when the plan proves that the
   running loop reaches every member with budget left (so each gets its one token) and,
   unless the policy is fcfs, that no allocation fails. Otherwise the group dissolves
   (every member materialised) and the plain step runs; decode-ready requests rejoin
   after it. Requests whose whole sequence could reach ``max_model_len`` never join (the
   running loop's length cap would bind for them).
4. **Connectors too** (``tuner.sim.kv_connector.base``: the CPU tier, the NIXL pull
   connectors of a P/D deployment). A connector's admission work (lookups and deferred
   lookups, loads and ``kv_holding``, a read's arrival) is the waiting loop, the same
   code on both paths; its transfers finishing and held prefill blocks coming back
   happen in the update, before the next plan counts the free blocks. Its work on
   *running* requests (vLLM's store jobs in ``build_connector_meta``, the prefill side's
   held-block count) is what a group step skips, so each connector says when it next
   has work for a running decoder (``next_decode_event``: 0 at its next step,
   ``NO_DECODE_EVENT`` never while it decodes), and only a request it leaves alone for
   good joins the group: a step of such members is a group step as without a
   connector, and a request with connector work runs the plain rules until it has none.
   Under async scheduling with a connector (``FencedKVCacheManager``, vLLM's
   ``defer_block_free``) members count as scheduled in the steps they took part in
   (``can_free_now`` reads a member's last step as the latest group step, the value
   ``members_left`` stores when it leaves). A group step that runs out of blocks runs
   vLLM's loop over the pool-touching requests (``DecodeGroup._run_preempting``) and
   asks the fence as the plain loop does: a victim whose blocks are still in flight
   ends the loop at the failing request, unscheduled and unpreempted, and the members
   from it on in running order leave the group without their token; the ones before it
   keep the group step. Between two allocations that fail, that loop's requests take
   their blocks exactly as a group step's do (a RUNNING request's allocation succeeds
   when the blocks it needs are free and takes just those), so each such run goes as
   one (``DecodeGroup._fitting_prefix``: members batched) and the loop proper takes the
   failing request and its preemptions; ``test_short_group_steps_batch_the_requests_before_the_first_failure_generated``
   compares such steps with the plain path in both modes, fenced and not.
5. **Memoised prefix hits** (both paths: the waiting loop and the window's reorder,
   ``KVCacheManager.num_hit_blocks`` / ``num_cached_tokens_of``). A waiting request's
   walk over its prompt hashes may be skipped only while its watch slot's epoch has not
   moved since its memo was stored: the pool bumps a slot's epoch whenever a hash id
   carrying the slot's bit leaves the map, and a slot's bits cover at least every hash
   its requests' memos cover (a superset: stale bits only cost a recompute). A skipped
   walk still extends the memo past its end when the next hash is cached. The same
   rule lets an admission (``get_computed_blocks``) take its hit's length from a current
   memo and gather only the hit (no search for its end), and a blocked head store the
   length of the hit it just gathered (a failed ``allocate_slots`` changes nothing)
   instead of walking again. The hit *blocks* a memo's walk gathered (``memo_blocks``)
   may stand in for that gather only while, besides the slot's epoch, its
   ``block_epochs`` entry has not moved: the pool bumps it whenever a hash carrying the
   slot's bit stays in the map but loses its first holder (a later holder becomes the
   first); an extension past the kept blocks is gathered. ``check_invariants``
   compares every memo, and every current memo's kept blocks, with a walk after each
   step; ``tests/sim/test_kv_cache_manager.py::test_memos_stay_exact_per_watch_slot_generated``
   also compares every window probe and every admission's hit with a walk, with shared
   slots and the bits rebuilt or never, and
   ``test_kept_hit_blocks_follow_first_holder_changes_generated`` does so on
   block-aligned prompts whose hashes get second holders (first holders evicted while
   their hashes stay).
6. **Plain admission with a connector that never loads** (the P/D prefill instance's
   ``NixlPrefillConnector`` and its push variant: ``plain_admission``,
   ``tuner.sim.kv_connector.base``). Its ``get_num_new_matched_tokens`` is ``(0, False)``
   for every request, so the connector's waiting loop
   (``tuner.sim.kv_connector.admission``) never loads, parks or promotes anything: no
   request enters ``kv_holding`` or ``loading``, every waiting request has nothing
   computed, and each admission is the plain loop's (the same checks, allocation,
   counters and queue moves; the connector's ``count_query`` counts nothing and its
   ``local_hit`` is never asked). Such a scheduler admits through
   ``Scheduler._schedule_waiting``, whose memoised hits (item 5) skip the walks of a
   blocked head; the connector's loop marks ``is_prefill_chunk`` at admission for its
   reservation count (``_reserved_blocks``), which only a load reads, and
   ``_update_after_schedule`` sets the same value before anything else reads it.
   Not with speculative decoding (the plain loop pads drafts, the connector's loop does
   not; a P/D replay refuses it anyway). ``tests/sim/test_pd_plain_admission.py``
   replays generated P/D setups (pull and push, sync and async, tight prefill caches
   with blocked heads) with the declaration on and off and compares the records and
   every prefill schedule.

Adding a settings field: declare it in ``FAST_PATH_FIELDS`` below, either with how the
group step already gives the plain path's result for every value (name the code that
makes it so) or with ``refuses`` for the values it does not model yet, until the group
models them. ``tests/sim/test_fast_path_contract.py`` fails until then, and at run time
an undeclared field sends every replay to the plain path.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions


def _never(value: Any) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class FieldContract:
    """How the fast path treats one settings field."""

    models: str  # why the fast path gives the plain path's result for this field
    refuses: Callable[[Any], bool] = _never  # values it does not model: plain path


FAST_PATH_FIELDS: dict[str, FieldContract] = {
    "SchedulerSettings.max_num_batched_tokens": FieldContract(
        "the plan proves the budget reaches the last member, else the plain step runs"),
    "SchedulerSettings.max_num_seqs": FieldContract(
        "only the waiting loop reads it, and it is the same code on both paths"),
    "SchedulerSettings.long_prefill_token_threshold": FieldContract(
        "a member takes 1 token (never capped); others use running_new_tokens"),
    "SchedulerSettings.enable_chunked_prefill": FieldContract(
        "only the waiting loop reads it, and it is the same code on both paths"),
    "SchedulerSettings.policy": FieldContract(
        "fcfs: group steps preempt from the tail of running; priority: a step that "
        "would run out of blocks is a plain step (its victim may be scheduled already)"),
    "SchedulerSettings.scheduler_reserve_full_isl": FieldContract(
        "admission only (the waiting loop, shared)"),
    "SchedulerSettings.watermark": FieldContract(
        "admission only: allocate_slots ignores it for RUNNING requests"),
    "SchedulerSettings.prefill_schedule_interval": FieldContract(
        "the step's defer decision is taken before either path; the plan skips deferred "
        "prefill chunks as the running loop does; members are never prefill chunks"),
    "SchedulerSettings.cache_aware_admission_window": FieldContract(
        "admission only (the waiting loop and its reorder, shared)"),
    "SchedulerSettings.cache_aware_admission_threshold": FieldContract(
        "admission only; the usage it reads counts members' blocks, which are true"),
    "CacheSettings.block_size": FieldContract(
        "block boundaries come from the true token count (DecodeGroup.block_events)"),
    "CacheSettings.num_gpu_blocks": FieldContract(
        "the plan counts the step's new blocks against the free queue"),
    "CacheSettings.enable_prefix_caching": FieldContract(
        "off: no registration events; on: registrations of shareable hashes on time"),
    "CacheSettings.max_model_len": FieldContract(
        "requests that could reach it never join, so the length cap never binds a member"),
    "SimOptions.prefill_interval_mode": FieldContract(
        "it only picks the clock of the defer decision, taken before either path"),
    "SimOptions.record_steps": FieldContract(
        "SchedulerOutput.items() lists every scheduled request on both paths"),
    "SimOptions.check_invariants": FieldContract(
        "the checks read members through the lag accessors and change no state"),
    "SimOptions.fast_forward": FieldContract("the switch itself"),
    "SimOptions.async_scheduling": FieldContract(
        "both modes: async runs AsyncDecodeGroup (tuner.sim.async_group), whose members "
        "keep one token in flight, leave at the schedule of their last token and hand "
        "in-flight tokens to the plain update when they join or leave"),
    "SimOptions.self_preemption_continues": FieldContract(
        "priority only, and a priority step that would run out of blocks is a plain step, "
        "so only the plain running loop reads it"),
    "SimOptions.speculative": FieldContract(
        "group members take one token a step; drafts (1 + k tokens, bursts of accepted "
        "tokens) are not modelled by the group, so speculative decoding runs the plain "
        "path", refuses=lambda value: value is not None),
    "SimOptions.kv_offload": FieldContract(
        "a KV connector's admission work (lookups, loads, deferred lookups, kv_holding) is "
        "the waiting loop, the same code on both paths; its per-step work on running "
        "requests (store jobs) is read by a request only while the connector's "
        "next_decode_event says it has work for it, and such a request never joins the "
        "group (DecodeGroup.is_decode_ready); under async scheduling the fenced frees "
        "count members as scheduled (FencedKVCacheManager.members_left, can_free_now) and "
        "a group step that runs out of blocks stops where vLLM's loop stops, at a victim "
        "whose blocks are still in flight; the members it does not reach leave the group "
        "unscheduled (DecodeGroup._run_preempting, _leave_unreached)"),
    "SimOptions.extra": FieldContract(
        "free-form: the fast path cannot know what an entry means, so any is refused",
        refuses=bool),
}


def fast_path_refusal(settings: SchedulerSettings, cache: CacheSettings,
                      options: SimOptions) -> str | None:
    """Why the fast path cannot run these settings (a field it refuses or that is not
    declared in ``FAST_PATH_FIELDS``), or None when it models all of them."""
    for obj in (settings, cache, options):
        for f in fields(obj):
            key = f"{type(obj).__name__}.{f.name}"
            rule = FAST_PATH_FIELDS.get(key)
            if rule is None:
                return f"{key} is not declared in the fast-path contract (FAST_PATH_FIELDS)"
            value = getattr(obj, f.name)
            if rule.refuses(value):
                return f"{key}={value!r} is not modelled by the fast path"
    return None
