"""The fleet loop with two pools: prefill instances, then decode instances, on one clock.

:class:`PDLoop` is :class:`tuner.sim.fleet.loop.FleetLoop` (units, batch queues,
input queues, the order of events at one instant) with engines ``0..P-1`` prefill
instances and ``P..P+D-1`` decode instances, each its own unit priced by its own pool's
step-time model (the fleet loop's ``unit_prices`` hook), and the proxy's flow of vLLM's
P/D example proxy (``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`` and
``examples/online_serving/disaggregated_serving/disagg_proxy_demo.py``):

1. an arrival goes to a prefill instance (:class:`RoundRobinProxy`: the examples cycle
   through the prefill clients) as ``max_tokens=1`` with ``do_remote_decode``;
2. when its one token is produced (the prefill instance's response, with
   ``kv_transfer_params``: remote block ids, engine id), the proxy sends the original
   request to a decode instance (cycled the same way) with ``do_remote_prefill``; it is
   in that engine's input queue from that instant (the HTTP round trip is not priced);
3. the decode instance's connector pulls the blocks (``tuner.sim.disagg.nixl``) and the
   prefill instance frees its held blocks once the read ended.

A decode step that schedules nothing (its only requests wait for their reads) lasts
until the first of: its next read ending, the next arrival, the next event of any other
engine (the fleet loop's ``empty_step_s`` hook), and at least ``EMPTY_STEP_S``. Nothing can reach the decoder sooner
(a handoff happens only at a prefill instance's update), so an idle decoder wakes exactly
when vLLM's spinning engine would next see new work.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tuner.records import RequestTable
from tuner.sim.clock import INF, launch_price_function
from tuner.sim.disagg.engines import DecodeEngine, PrefillEngine
from tuner.sim.fleet.loop import FleetLoop
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.loop import AdmissionRules, StepTime

__all__ = ["EMPTY_STEP_S", "PDLoop", "RoundRobinProxy"]

#: The shortest empty step: vLLM's engine core spinning with nothing to run (a schedule,
#: an empty model call that polls the connector): an engineering estimate of 100 us, not
#: a measurement. Without a floor two engines waiting on each other at one instant would
#: trade 0-second steps forever.
EMPTY_STEP_S = 100e-6


class RoundRobinProxy:
    """vLLM's example P/D proxy: prefill and decode clients each cycled in turn."""

    targets_engines = True  # the fleet loop's router protocol: it returns engine indices

    def __init__(self, num_prefill: int, num_decode: int) -> None:
        self.num_prefill, self.num_decode = num_prefill, num_decode
        self._next_prefill = 0
        self._next_decode = 0

    def route(self, index: int, source: Any, arrival_s: float) -> int:
        """The prefill instance for a new request."""
        engine = self._next_prefill
        self._next_prefill = (engine + 1) % self.num_prefill
        return engine

    def route_decode(self, index: int, source: Any) -> int:
        """The decode instance (engine index) for a request whose prefill finished."""
        engine = self._next_decode
        self._next_decode = (engine + 1) % self.num_decode
        return self.num_prefill + engine

    def finished(self, index: int) -> None:
        """Round robin keeps no in-flight counts."""


class PDLoop(FleetLoop):
    """Replays ``arrivals`` through ``P`` prefill and ``D`` decode engines (module doc).

    Args:
        prefill, decode: the pools' engines.
        arrivals, rules, table, load, num_requests, batch_queue_depth: as ``FleetLoop``.
        prefill_step_time, decode_step_time: each pool's step-time model.
        decode_rules: the decode pool's refusals, applied at the handoff (a request its
            KV cache can never hold is refused there, as its front end would).
        router: the proxy's choices (``tuner.sim.disagg.routers``); None = vLLM's
            example proxy (round robin).
    """

    def __init__(self, prefill: Sequence[PrefillEngine], decode: Sequence[DecodeEngine],
                 arrivals: Iterable[tuple[int, Any]], prefill_step_time: StepTime,
                 decode_step_time: StepTime, rules: AdmissionRules,
                 decode_rules: AdmissionRules, table: RequestTable, *,
                 load: OpenLoop | ClosedLoop = OpenLoop(), num_requests: int = 0,
                 batch_queue_depth: int = 1, router: Any = None) -> None:
        engines = [*prefill, *decode]
        # the proxy's choices (tuner.sim.disagg.routers); None: vLLM's round robin
        self.proxy = router or RoundRobinProxy(len(prefill), len(decode))
        super().__init__(engines, arrivals, prefill_step_time, rules, table, dp=1,
                         replicas=len(engines), lockstep=False, router=self.proxy,
                         load=load, num_requests=num_requests,
                         batch_queue_depth=batch_queue_depth)
        self.num_prefill = len(prefill)
        self.decode_rules = decode_rules
        decode_price = launch_price_function(decode_step_time, batch_queue_depth)
        for unit in self.units[self.num_prefill:]:
            self.unit_prices[unit.index] = decode_price
        self.empty_step_s = self._empty_step_s
        self.num_refused_at_decode = 0
        self.prefill_of: dict[int, int] = {}  # trace index -> its prefill engine, until read

    def _update(self, unit: Any) -> None:
        super()._update(unit)
        e = unit.engines[0]
        if e < self.num_prefill:
            engine = self.engines[e]
            for index, source, arrival_s in engine.take_handoffs():
                self._hand_off(index, source, arrival_s)

    def _hand_off(self, index: int, source: Any, arrival_s: float) -> None:
        """Step 2 of the proxy's flow: the request goes to a decode instance."""
        if self.decode_rules.rejects(int(source.input_len), int(source.output_len)):
            # No decoder will read the prefill instance's held blocks: free them now (vLLM
            # frees them when the refused request is aborted). Held forever, they filled the
            # prefill cache and the loop stepped empty steps without end.
            self.engines[int(self.table.engine[index])].read_done(index, self.now_s)
            self.table.record(index, "rejected", arrival_s)
            self.table.engine[index] = -1
            self.num_refused_at_decode += 1
            self.arrivals.release(1, self.now_s)
            if hasattr(self.proxy, "refused"):
                self.proxy.refused(index)
            return
        engine = self.proxy.route_decode(index, source)
        self.prefill_of[index] = int(self.table.engine[index])
        self.table.engine[index] = engine
        self.pending[engine].append((index, source, arrival_s))
        unit = self.units[self.unit_of[engine]]
        if not unit.active:
            self._push(unit, self.now_s, 2)  # _SCHEDULE

    def _empty_step_s(self, unit: Any, now_s: float) -> float:
        """How long a step that scheduled nothing lasts (see the module doc)."""
        engine = self.engines[unit.engines[0]]
        end = engine.connector.next_event_s(now_s)
        nxt = self.arrivals.next_arrival_s(now_s)
        if nxt > now_s and nxt < end:
            end = nxt
        units = self.units
        for time_s, _, u, version in self._heap:
            if time_s > now_s and time_s < end and u != unit.index and \
                    units[u].version == version:
                end = time_s
        if end == INF:  # nothing known to wait for: spin while anything else can move
            others = any(u.active for u in units if u is not unit)
            return EMPTY_STEP_S if others or nxt != INF else 0.0
        return max(end - now_s, EMPTY_STEP_S)

    def read_started(self, index: int, start_s: float, end_s: float) -> None:
        """A decode engine launched request ``index``'s read: its prefill instance frees
        the held blocks once it ends."""
        prefill = self.prefill_of.pop(index, None)
        if prefill is not None:
            self.engines[prefill].read_done(index, end_s)
