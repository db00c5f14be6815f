"""vLLM 0.33.0's NIXL connector, scheduler side, push variant (``NixlPushConnector``).

Mirrors ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/push_scheduler.py @ 0.33.0``
(``NixlPushConnectorScheduler``) and the timing of its worker (``push_worker.py``), as two
twin connectors beside the pull ones (``tuner.sim.disagg.nixl``), which they extend.
vLLM selects the variant by connector name: ``"kv_connector": "NixlPushConnector"``
(``kv_connector/factory.py:189-193``); ``NixlConnector`` is the pull one
(``nixl/connector.py:433``).

What the scheduler side does differently from pull, and what the twin does for each:

* **who moves the bytes**: the decoder does not read. Its ``update_state_after_alloc``
  (push_scheduler.py:128-205) stashes a *registration* (its engine id and the blocks it
  allocated) that its worker sends to the prefill instance as a ``PUSH_REG`` NIXL
  notification at the step carrying it (``build_connector_meta``, 329-332;
  push_worker.py ``_send_registration_to_p``); the prefill worker's writer thread
  matches it with the finished request's blocks and WRITEs them into the decoder
  (``_do_start_push_kv``), the completion notification riding on the transfer
  (``_xfer_blocks``' ``notif_msg``). The twin: the write is ready one link latency
  after the decoder's step starts (the ``PUSH_REG`` hop; pull has no such hop, its READ
  is issued by the decoder itself) and is serialized on the **prefill** engine's link
  (its NIC issues every write), where pull serializes reads on the decoder's link;
* **the decoder waits the same way**: ``get_num_new_matched_tokens`` is pull's for
  ``do_remote_prefill`` (103-126: the prompt beyond the local hit, loaded
  asynchronously, so the request waits in ``WAITING_FOR_REMOTE_KVS``), and one transfer
  per request (``do_remote_prefill`` cleared, 205); it is told the push landed
  (``finished_recving``) at its first step end after the write's end;
* **the prefill side's blocks**: held exactly as pull holds them (``request_finished``
  with ``delay_free_blocks``, 207-294, the same lease) and released at the prefill
  engine's update after the write ended (``finished_sending``, now the prefill worker's
  own transfer completing). But they also keep the prefill engine stepping:
  ``has_pending_push_work`` (342-347) is true while ``_finished_request_blocks`` is
  non-empty, and vLLM's ``Scheduler.has_requests`` (v1/core/sched/scheduler.py:3167-3182)
  keeps the engine core's busy loop alive on it, so a prefill instance whose only work
  is held blocks spins empty steps until the writes end (pull's idles);
* refused as vLLM refuses it: bidirectional transfer (push_scheduler.py:72-75) and
  ``decode_context_parallel_size > 1`` (connector.py:401-404); the twin models neither,
  so nothing is left to refuse. Async scheduling works as with pull.

Not modelled (docs/disaggregation.md): the writer thread's 1 ms self-poll while it holds
unmatched finished blocks (push_worker.py:80: the registration arrives after the
prefill finished in the proxy's sequential flow, and each prefill step wakes the writer),
the first P->D handshake, and the registration watchdog (``push_registration_timeout``:
it only drops stale registrations, every one is fulfilled in a replay). A full local
prefix hit on the decoder (no registration; the prefill blocks freed at the decoder's
``request_finished``, 233-245) cannot happen: the last prompt token is always
recomputed, so at least one token is pushed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from tuner.sim.disagg.nixl import NixlDecodeConnector, NixlPrefillConnector
from tuner.sim.disagg.settings import PDSettings

if TYPE_CHECKING:
    from tuner.sim.block_pool import BlockPool

__all__ = ["NixlPushDecodeConnector", "NixlPushPrefillConnector"]

#: ``(trace index, when the registration reaches the prefill side, blocks)`` ->
#: ``(write start, write end)``: the prefill engine's link schedules the write
PushWrite = Callable[[int, float, int], tuple[float, float]]


class NixlPushDecodeConnector(NixlDecodeConnector):
    """The decode instance's side: registrations out, writes in (module doc).

    ``push_write`` (set by the simulator) hands a registration to the request's prefill
    engine, whose link times the write."""

    push_write: PushWrite | None = None

    def launch(self, start_s: float, duration_s: float) -> None:
        """The step's registrations leave with it (the worker's ``start_load_kv``); each
        write is timed by its prefill engine's link."""
        if not self._batch:
            return
        assert self.push_write is not None, "the simulator sets push_write (tuner bug)"
        ready_s = start_s + self.settings.link_latency_s  # the PUSH_REG notification
        for read in self._batch:
            begin, end = self.push_write(read.request.index, ready_s, read.num_blocks)
            read.start_s, read.end_s = begin, end
            self.read_start_s[read.request.request_id] = begin
            self.read_s += end - begin
            self.num_reads += 1
            self.read_blocks += read.num_blocks
            self._unreported.append(read)
            self.on_read(read.request.index, begin, end)
        self._batch = []


class NixlPushPrefillConnector(NixlPrefillConnector):
    """The prefill instance's side: held blocks written out by its own link, and the
    engine kept stepping while any are held (module doc)."""

    def __init__(self, block_pool: "BlockPool", settings: PDSettings) -> None:
        super().__init__(block_pool)
        self.settings = settings
        self._link_free_s = 0.0
        self.write_s = 0.0  # link time of every write this engine issued

    def write(self, index: int, ready_s: float, num_blocks: int) -> tuple[float, float]:
        """Issue request ``index``'s write once its registration arrived (``ready_s``)
        and the link is free: ``(start, end)``."""
        begin = ready_s if ready_s > self._link_free_s else self._link_free_s
        end = self._link_free_s = begin + self.settings.transfer_s(num_blocks)
        self.write_s += end - begin
        return begin, end

    def has_pending_work(self) -> bool:
        """``has_pending_push_work``: finished blocks awaiting their write's completion
        keep the engine stepping."""
        return bool(self._held)

    def counters(self) -> dict[str, float]:
        return {**super().counters(), "pd_prefill_write_link_s": self.write_s}
