"""The twin's KV-connector interface: the scheduler side of vLLM's ``KVConnectorBase_V1``.

Why an interface: vLLM puts every KV source beyond the GPU prefix cache (host-memory
offloading, LMCache, a disaggregated prefill engine) behind one connector contract that
the scheduler consults at admission and at the end of each step. The twin does the same,
so the P/D engine (a second connector) plugs into the same hooks as the CPU tier
(``tuner.sim.kv_connector.offloading.OffloadingConnector``).

The hooks, in the order the twin's scheduler calls them (vLLM 0.33.0
``v1/core/sched/scheduler.py``; ``tuner.sim.kv_connector.admission`` is the waiting loop
that calls them):

* ``on_new_request(request)`` when a request arrives (scheduler ``add_request``).
* ``get_num_new_matched_tokens(request, num_local)`` at admission of a request with
  nothing computed: ``(tokens beyond the local prefix hit the connector can provide,
  load_async)``, or ``(None, False)`` while it cannot tell yet (the request is skipped
  this step: a *deferred lookup*).
* ``update_state_after_alloc(request, num_external)`` once the blocks for the local and
  external tokens are allocated; with ``load_async`` the request waits (vLLM's
  ``WAITING_FOR_REMOTE_KVS``) in the scheduler's ``kv_holding`` queue until the load is
  reported finished.
* ``build_connector_meta(out)`` at the end of ``schedule()``, before computed tokens
  advance: the step's transfers (loads issued at admission, stores of full blocks).
* ``launch(start_s, duration_s)`` when the loop starts the step on the GPU (the twin's
  stand-in for the worker receiving the metadata): transfers get their times there.
* ``request_finished(request)`` for each request that finished in an update (vLLM's
  ``_free_request``); it returns False (blocks are freed at once) for every connector
  the twin has.
* ``update_connector_output(now_s)`` at the end of each update: the worker's
  ``get_finished`` -- the ids of requests whose loads completed by ``now_s`` (they are
  promoted at the next ``schedule()``).
* ``has_pending_work()``: transfers or finished requests not yet handled (the engine
  keeps stepping while True, as vLLM's ``has_pending_push_work``);
  ``next_event_s(now_s)``: when an empty step waiting for a transfer ends;
  ``can_progress()``: whether anything is still to be reported or built (an empty step
  with nothing in flight and no progress possible is a stall, raised, not looped).
* ``counters()``: the replay counters it adds (only when a connector runs, so replays
  without one keep their records).

An optional class attribute, for the admission fast path (``tuner.sim.fast_path`` item 6):

* ``plain_admission`` (False when absent): the connector never has anything for a
  waiting request -- ``get_num_new_matched_tokens`` is always ``(0, False)``,
  ``update_state_after_alloc`` is never reached, ``count_query`` counts nothing and
  ``local_hit`` is 0, so nothing enters ``kv_holding`` or ``loading`` -- and the
  scheduler admits through its plain waiting loop (with its memoised hits) instead of
  the connector's (``tuner.sim.kv_connector.admission``), which would decide the same
  at a higher cost per request. The P/D prefill instance's connectors declare it.

And one for the fast path (``tuner.sim.fast_path`` item 4), asked when a running request
could join the decode group:

* ``next_decode_event(request)``: how many more decode steps the running ``request``
  can take before the connector has work for it at a step (``build_connector_meta``
  would read or change its state): ``0`` at its next step, ``NO_DECODE_EVENT`` never
  while it decodes. Only a request answered ``NO_DECODE_EVENT`` joins the group, whose
  steps then skip it as the connector would; a connector with periodic work on decoders
  (vLLM's ``offload_prompt_only=False``: a chunk of output every ``tokens_per_chunk``
  tokens) would answer the steps to the next chunk boundary, and the group keeps such a
  request on the plain path. The answer may change only through the connector's own
  calls for that request (admission, a step that scheduled it individually), never
  while it is a member. The engine-level next event (a transfer's end, a held block's
  release) is ``next_event_s``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tuner.sim.request import SimRequest
    from tuner.sim.scheduler_output import SchedulerOutput

__all__ = ["KVConnector", "NO_DECODE_EVENT"]

#: ``next_decode_event``'s answer for a decoder the connector never has work for.
NO_DECODE_EVENT = 1 << 62


class KVConnector(Protocol):
    """Scheduler-side connector contract (see the module doc for the call order)."""

    def on_new_request(self, request: "SimRequest") -> None: ...

    def get_num_new_matched_tokens(self, request: "SimRequest",
                                   num_local: int) -> tuple[int | None, bool]: ...

    def update_state_after_alloc(self, request: "SimRequest", num_external: int) -> None: ...

    def build_connector_meta(self, out: "SchedulerOutput") -> None: ...

    def launch(self, start_s: float, duration_s: float) -> None: ...

    def request_finished(self, request: "SimRequest") -> bool: ...

    def update_connector_output(self, now_s: float) -> set[str]: ...

    def has_pending_work(self) -> bool: ...

    def can_progress(self) -> bool: ...

    def next_event_s(self, now_s: float) -> float: ...

    def next_decode_event(self, request: "SimRequest") -> int: ...

    def counters(self) -> dict[str, float]: ...
