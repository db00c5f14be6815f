"""vLLM's own NIXL connector (scheduler side, pull or push) in the ``vllm-core`` driver: one
P/D pool engine at a time, replayed on the twin's event log.

Runs inside the vLLM Python, like ``tuner.vllm_core.driver``, as a script with the same
arguments (``VLLM_PYTHON tuner/vllm_core/disagg.py JOB.pickle RESULT.pickle``); the
backend starts it instead of ``driver.py`` when a job has ``pd_role``, and it replays the
other jobs of a list with ``driver.VllmCoreReplay``. What is real and what is faked:

* real: ``NixlPullConnector`` (``distributed/kv_transfer/kv_connector/v1/nixl/`` @ 0.33.0)
  in the scheduler role (``NixlPushConnector`` for a job with ``transfer_mode: push``:
  the same hooks with ``NixlPushConnectorScheduler`` behind them), so ``NixlPullConnectorScheduler`` decides what a decode instance
  pulls (``get_num_new_matched_tokens``: the prompt beyond the local prefix hit; the
  request waits in ``WAITING_FOR_REMOTE_KVS``) and what a prefill instance holds
  (``request_finished``: ``delay_free_blocks`` until the notification); vLLM's
  ``Scheduler`` / ``AsyncScheduler`` builds and consults it as ``vllm serve`` does
  (``KVConnectorFactory``; ``kv_consumer`` on the decoder, ``kv_producer`` on the
  prefiller). The scheduler side never imports NIXL;
* faked: the worker (``NixlPullConnectorWorker``, the RDMA reads). :class:`FakeNixlWorker`
  reports a read finished (``finished_recving`` on the decoder, ``finished_sending`` on
  the prefiller) at the first update at or after the twin's read end
  (``tuner.sim.disagg.nixl``), for requests vLLM's side is waiting on;
* the other pool and the proxy: the twin's. A P/D replay couples the pools through the
  handoffs and the reads, so one engine cannot be replayed alone on its own clock. The
  job carries the twin engine's event log instead (``("add", position)``,
  ``("schedule", now_s)``, ``("start", seq, start_s, duration_s)``, ``("update", seq,
  end_s)``, ``("abort", request_id)`` before the schedule that takes it, in the order
  the fleet loop called them, batch queue included), and
  vLLM's scheduler is driven through the same calls at the same instants. Its step
  records are then compared one for one with the twin engine's (tests/vllm/
  test_pd_parity.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tuner.vllm_core.driver import (  # noqa: E402
    VllmCoreEngine, VllmCoreReplay, _Live, build_scheduler, make_block_hasher, make_vllm_request)
from tuner.vllm_core.job_file import run_job_file  # noqa: E402
from tuner.vllm_core.tokens import DriverRequest, TokenFactory  # noqa: E402

__all__ = ["FakeNixlWorker", "PDCoreEngine", "main", "nixl_transfer_config", "replay_job",
           "replay_pd_engine"]

#: the prefill instance's engine id, as the decoder's ``kv_transfer_params`` name it
PREFILL_ENGINE_ID = "tuner-prefill"


def nixl_transfer_config(role: str, transfer_mode: str = "pull") -> Any:
    """vLLM's ``KVTransferConfig`` of a ``role`` ("prefill" / "decode") instance;
    ``transfer_mode`` "push" selects ``NixlPushConnector`` (its scheduler class
    ``NixlPushConnectorScheduler``), "pull" ``NixlConnector``."""
    from vllm.config import KVTransferConfig

    return KVTransferConfig(
        kv_connector="NixlPushConnector" if transfer_mode == "push" else "NixlConnector",
        kv_role="kv_producer" if role == "prefill" else "kv_consumer",
        engine_id=PREFILL_ENGINE_ID if role == "prefill" else "tuner-decode")


def transfer_params(role: str, request_id: str, num_blocks: int, prefill_tp: int) -> dict:
    """The ``kv_transfer_params`` the proxy sends: ``do_remote_decode`` to the prefill
    instance; to the decoder, the prefill response's (remote block ids, engine, side
    channel; the ids are placeholders: only the worker reads them)."""
    if role == "prefill":
        return {"do_remote_decode": True, "do_remote_prefill": False}
    return {"do_remote_prefill": True, "do_remote_decode": False,
            "remote_block_ids": (list(range(1, num_blocks + 1)),),
            "remote_engine_id": PREFILL_ENGINE_ID, "remote_request_id": request_id,
            "remote_host": "localhost", "remote_port": 5600, "tp_size": prefill_tp}


class FakeNixlWorker:
    """The connector's worker side on the twin's read times (see the module doc)."""

    def __init__(self, scheduler: Any, role: str, read_end_s: dict[str, float]) -> None:
        self.scheduler = scheduler
        self.role = role
        self.read_end_s = dict(read_end_s)  # request id -> when its read ended (twin)
        self._local: dict[str, int] = {}  # request id -> local hit at its last lookup
        cs = scheduler.connector.connector_scheduler
        lookup = cs.get_num_new_matched_tokens

        def get_num_new_matched_tokens(request: Any, num_computed: int) -> Any:
            self._local[request.request_id] = num_computed
            return lookup(request, num_computed)

        cs.get_num_new_matched_tokens = get_num_new_matched_tokens

    def _done(self, end_s: float, status: Any) -> set[str]:
        """Requests in ``status`` whose read ended by ``end_s``, reported once, in the
        job's order (trace order: vLLM walks ``finished_sending`` to free the held
        blocks, and a plain set of str would iterate in the hash seed's order)."""
        from tuner.vllm_core.offloading import InsertionOrderedSet

        requests = self.scheduler.requests
        done = InsertionOrderedSet(rid for rid, t in self.read_end_s.items() if t <= end_s
                                   and rid in requests and status(requests[rid]))
        for rid in done:
            del self.read_end_s[rid]
        return done

    def output(self, end_s: float) -> Any:
        """The update's ``KVConnectorOutput`` (None: nothing ended)."""
        from vllm.v1.outputs import KVConnectorOutput
        from vllm.v1.request import RequestStatus

        if self.role == "decode":
            # an aborted request's read goes on (the worker is not told): it is reported
            # too, and the scheduler frees the blocks it held (_update_from_kv_xfer_finished)
            recv = self._done(end_s, lambda r: r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                              or r.is_finished())
            return KVConnectorOutput(finished_recving=recv) if recv else None
        sent = self._done(end_s, lambda r: r.is_finished())
        return KVConnectorOutput(finished_sending=sent) if sent else None

    # the driver's ``kv`` hooks (``VllmCoreEngine``): the timeline is the twin's
    def scheduled(self, output: Any) -> None:
        """Nothing to count."""

    def can_progress(self, output: Any) -> bool:
        return True  # the twin's log says when steps happen

    def launch(self, output: Any, start_s: float, duration_s: float) -> None:
        """The reads' times are the twin's."""

    def after_update(self, engine_core_outputs: Any) -> None:
        """No stats to read."""

    def local_hit(self, req_id: str, computed: int) -> int:
        return self._local.get(req_id, computed)

    def waiting_ids(self) -> tuple[str, ...]:
        from vllm.v1.request import RequestStatus

        return tuple(sorted(rid for rid, r in self.scheduler.requests.items()
                            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS))

    def empty_step_s(self, now_s: float, next_arrival_s: float) -> float:
        return 0.0

    def counters(self) -> dict[str, float]:
        return {}


class PDCoreEngine(VllmCoreEngine):
    """``VllmCoreEngine`` whose requests carry the proxy's ``kv_transfer_params``."""

    def __init__(self, *args: Any, role: str, prefill_tp: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.role, self.prefill_tp = role, prefill_tp

    def add_request(self, index: int, r: DriverRequest, arrival_s: float) -> None:
        self.live[r.request_id] = _Live(req=r, outputs=self.tokens.output_tokens(r),
                                        arrival_s=arrival_s)
        request = make_vllm_request(r.request_id, self.tokens.prompt(r), r.output_len,
                                    self.hasher, arrival_time=arrival_s,
                                    priority=r.priority)
        blocks = -(-r.input_len // self.tokens.block_size)
        request.kv_transfer_params = transfer_params(self.role, r.request_id, blocks,
                                                     self.prefill_tp)
        self.scheduler.add_request(request)

    def abort(self, request_id: str) -> None:
        """The client left: ``finish_requests(FINISHED_ABORTED)``, as the engine core
        does for an abort from the API server before its next ``schedule()``."""
        from vllm.v1.request import RequestStatus

        self.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)
        self.live.pop(request_id, None)

    def schedule(self, now_s: float) -> Any:
        step = super().schedule(now_s)
        # held (delay-freed) requests stay in ``scheduler.requests``: not waiting
        step.num_waiting = self.scheduler.get_request_counts()[1]
        return step


def replay_pd_engine(job: dict[str, Any]) -> Any:
    """The step records of vLLM's scheduler driven through ``job["events"]`` (module doc);
    with ``probe_has_requests``, ``{"steps": ..., "has_requests": ...}``."""
    role = job["pd_role"]
    cache = job["cache"]
    block_size = int(cache["block_size"])
    scheduler = build_scheduler(
        model_dir=job["model_dir"], settings=job["settings"], block_size=block_size,
        num_gpu_blocks=int(cache["num_gpu_blocks"]),
        enable_prefix_caching=bool(cache.get("enable_prefix_caching", True)),
        max_model_len=int(cache["max_model_len"]),
        async_scheduling=bool(job.get("async_scheduling", False)),
        kv_offload=nixl_transfer_config(role, str(job.get("transfer_mode", "pull"))))
    requests = [DriverRequest(**r) for r in job["requests"]]
    worker = FakeNixlWorker(scheduler, role, job["read_end_s"])
    engine = PDCoreEngine(scheduler, TokenFactory(block_size), make_block_hasher(block_size),
                          num_requests=len(requests), record_steps=True, kv=worker,
                          role=role, prefill_tp=int(job.get("prefill_tp", 1)))
    steps: dict[int, Any] = {}
    num_scheduled = 0
    #: with ``probe_has_requests``: per schedule, (``has_unfinished_requests``,
    #: ``has_pending_push_work``), the two reasons ``Scheduler.has_requests`` steps for
    probe: list[tuple[bool, bool]] | None = [] if job.get("probe_has_requests") else None
    for event in job["events"]:
        kind = event[0]
        if kind == "add":
            r = requests[event[1]]
            engine.add_request(event[1], r, float(event[2]))
        elif kind == "schedule":
            if probe is not None:  # why vLLM's engine core would step here
                probe.append((scheduler.has_unfinished_requests(),
                              scheduler.connector.has_pending_push_work()))
            steps[num_scheduled] = engine.schedule(float(event[1]))
            num_scheduled += 1
        elif kind == "start":
            engine.start(steps[event[1]], float(event[2]), float(event[3]))
        elif kind == "update":
            engine.update(steps.pop(event[1]), float(event[2]))
        elif kind == "abort":
            engine.abort(str(event[1]))
    if probe is not None:  # and why it would step on after the log's last event
        final = (scheduler.has_unfinished_requests(),
                 scheduler.connector.has_pending_push_work())
        return {"steps": engine.steps, "has_requests": probe, "after_last": final}
    return engine.steps


def replay_job(job: dict[str, Any]) -> Any:
    """The driver's entry for one job: a P/D pool engine's (``pd_role`` set) or a replay."""
    if "pd_role" in job:
        return replay_pd_engine(job)
    return VllmCoreReplay(job).run()


def main(argv: list[str]) -> int:
    """``JOB.pickle RESULT.pickle`` (``tuner.vllm_core.job_file``): a P/D pool engine's
    step records, or a ``ReplayResult``."""
    return run_job_file(argv, replay_job, "disagg.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
