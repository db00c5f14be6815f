"""Parity cases for disaggregated prefill/decode: each pool engine of a 1:1 twin replay
(``tuner.sim.disagg``) against vLLM 0.33.0's own ``Scheduler`` / ``AsyncScheduler`` with
``NixlPullConnectorScheduler`` (``tuner.vllm_core.disagg``), in both scheduling modes.

The twin replays the whole deployment; each engine's calls (arrivals, schedules, step
starts and updates, in the fleet loop's order) are logged, and vLLM's scheduler is
driven through the same log, its fake worker reporting reads finished at the twin's
read ends. Cases (tests/vllm/test_pd_parity.py checks that each did what it is named
after):

* ``decoder-local-hit``: a second request with the first's prompt + one block reaches
  the decoder after the first finished there: it pulls only the blocks beyond its local
  prefix hit;
* ``decoder-kv-full``: long decodes fill a small decode cache (a preemption); reads land while it is
  full (requests wait for KV beside preemptions);
* ``hetero-tp``: prefill TP 1, decode TP 4: a four times slower pull per decode rank
  (``nixl/tp_mapping.py``) and a decoder with four times the blocks;
* ``prefill-held-full``: a slow link keeps the prefill instance's held blocks until the
  reads end, so its cache fills with them and admissions wait for the release;
* ``abort-in-transfer``: two requests aborted by their clients halfway through their
  reads (``WAITING_FOR_REMOTE_KVS``): vLLM's ``finish_requests(FINISHED_ABORTED)`` with
  its blocks held until the read is reported, the prefill side's released at the read's
  end as for any read;
* ``push-*``: the same cases (and ``push-basic``, eight short requests) with
  ``NixlPushConnector`` on both instances (vLLM's ``NixlPushConnectorScheduler``, the
  twin's ``tuner.sim.disagg.nixl_push``): the prefill instance writes after the
  decoder's registration, serialized on its own link, and keeps stepping while it holds
  blocks (``has_pending_push_work``);
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from parity_cases import BS

from tuner.fidelity.pd_parity import log_engine_calls, pd_engine_jobs
from tuner.sim.disagg import PDSettings
from tuner.sim.disagg.simulator import PDPool, PDSimulator
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions
from tuner.trace.request import TraceRequest

#: one decode rank's KV bytes per token of an 8B model (32 layers x 8 KV heads x 128 x
#: 2 x bf16 = 128 KiB) over a 400 Gb/s NIC with 50 us per read: a 100-block read takes
#: about 5 ms, a couple of decode steps
LINK = dict(bytes_per_token_rank=131072, link_bytes_per_s=50e9, link_latency_s=50e-6)
#: a hundred times slower: reads outlast many prefill steps
SLOW = dict(LINK, link_bytes_per_s=5e8)
_FIELDS = ("request_id", "arrival_s", "input_len", "output_len", "block_hashes",
           "output_block_hashes", "session_id", "priority")


def step_time(batch: Any) -> float:
    """A step time nonlinear in the batch (a wrong batch changes the clock)."""
    return (0.002 + 3e-6 * batch.num_prefill_tokens + 2e-5 * batch.num_decode_reqs
            + 1e-8 * batch.decode_ctx_tokens + 1e-7 * batch.num_decode_reqs ** 1.5)


@dataclass
class PDCase:
    """One 1:1 P/D replay whose two engines are checked against vLLM's."""

    name: str
    requests: list[TraceRequest]
    settings: SchedulerSettings
    prefill_blocks: int
    decode_blocks: int
    pd: PDSettings
    async_scheduling: bool = False
    #: trace positions whose client aborts halfway through their read (set by run_twin)
    abort_mid_read: tuple[int, ...] = ()
    aborts: dict[int, float] = field(default_factory=dict)  # position -> abort time
    twin: Any = None  # the PDSimulator, after run_twin
    events: dict[str, list[tuple]] = field(default_factory=dict)  # role -> the engine's log


def run_twin(case: PDCase) -> PDCase:
    """Replay the case on the twin, logging both engines' calls (a case with
    ``abort_mid_read`` is replayed once without aborts first, for the reads' times: the
    replay is the same until the first abort)."""
    if case.abort_mid_read and not case.aborts:
        probe = run_twin(dataclasses.replace(case, abort_mid_read=()))
        reads = probe.twin.reads
        case.aborts = {i: (reads[i][0] + reads[i][1]) / 2 for i in case.abort_mid_read}

    def pool(blocks: int) -> PDPool:
        cache = CacheSettings(block_size=BS, num_gpu_blocks=blocks, max_model_len=8192)
        return PDPool(case.settings, cache, step_time)

    options = SimOptions(async_scheduling=case.async_scheduling, record_steps=True,
                         check_invariants=True, fast_forward=False)
    sim = PDSimulator(case.requests, pool(case.prefill_blocks), pool(case.decode_blocks),
                      case.pd, options=options, aborts=dict(case.aborts))
    case.events = {"prefill": [], "decode": []}
    log_engine_calls(sim.prefill[0], case.events["prefill"])
    log_engine_calls(sim.decode[0], case.events["decode"])
    sim.run()
    case.twin = sim
    return case


def jobs(case: PDCase, model_dir: str) -> list[dict[str, Any]]:
    """The two driver jobs (prefill, decode) of a case run on the twin, built as
    ``tuner fidelity --pd`` builds them (``tuner.fidelity.pd_parity.pd_engine_jobs``),
    with vLLM's ``has_requests`` probed at every schedule."""
    rows = [{f: getattr(r, f, None) for f in _FIELDS} for r in case.requests]
    caches = [CacheSettings(block_size=BS, num_gpu_blocks=blocks, max_model_len=8192)
              for blocks in (case.prefill_blocks, case.decode_blocks)]
    settings = case.settings.to_dict()
    return pd_engine_jobs(rows, case.twin.reads,
                          [("prefill", caches[0], case.events["prefill"]),
                           ("decode", caches[1], case.events["decode"])],
                          settings={"prefill": settings, "decode": settings},
                          async_scheduling=case.async_scheduling, model_dir=model_dir,
                          prefill_tp=case.pd.prefill_tp,
                          extra={"transfer_mode": case.pd.variant,
                                 "probe_has_requests": True})


def _blocks(tag: int, n: int) -> tuple[int, ...]:
    return tuple(tag * 1000 + i for i in range(n))


def _req(rid: str, t: float, blocks: tuple[int, ...], out: int = 8,
         extra: int = 5) -> TraceRequest:
    return TraceRequest(rid, t, len(blocks) * BS + extra, out, blocks)


def local_hit_requests() -> list[TraceRequest]:
    base = _blocks(1, 20)
    return [_req("a", 0.0, base), _req("other", 0.05, _blocks(2, 6)),
            _req("b", 1.0, base + _blocks(3, 1)), _req("c", 1.0, _blocks(4, 3))]


def kv_full_requests() -> list[TraceRequest]:
    return [_req(f"k{i}", 0.04 * i, _blocks(10 + i, 4), out=120) for i in range(8)]


def held_requests() -> list[TraceRequest]:
    return [_req(f"h{i}", 0.001 * i, _blocks(30 + i, 6), out=4) for i in range(8)]


def hetero_requests() -> list[TraceRequest]:
    shared = _blocks(5, 8)
    return [_req(f"t{i}", 0.003 * i, shared + _blocks(40 + i, 4), out=30) for i in range(10)]


def cases() -> list[PDCase]:
    """Every P/D parity case, sync and async (not yet run)."""
    small = SchedulerSettings(max_num_batched_tokens=512, max_num_seqs=16)
    one = PDSettings(num_prefill=1, num_decode=1, block_size=BS, **LINK)
    slow = dataclasses.replace(one, **SLOW)
    hetero = dataclasses.replace(one, decode_tp=4)
    out: list[PDCase] = []
    for mode in (False, True):
        tag = "async" if mode else "sync"
        out += [
            PDCase(f"decoder-local-hit-{tag}", local_hit_requests(), small, 200, 200, one, mode),
            PDCase(f"decoder-kv-full-{tag}", kv_full_requests(), small, 200, 40, one, mode),
            PDCase(f"hetero-tp-{tag}", hetero_requests(), small, 200, 4 * 40, hetero, mode),
            PDCase(f"prefill-held-full-{tag}", held_requests(), small, 30, 200, slow, mode),
            PDCase(f"abort-in-transfer-{tag}", held_requests(), small, 200, 200, slow, mode,
                   abort_mid_read=(2, 5)),
        ]
        push = dict(variant="push")
        out += [  # NixlPushConnector: the prefill instance writes (tuner.sim.disagg.nixl_push)
            PDCase(f"push-basic-{tag}", held_requests(), small, 200, 200,
                   dataclasses.replace(one, **push), mode),
            PDCase(f"push-decoder-local-hit-{tag}", local_hit_requests(), small, 200, 200,
                   dataclasses.replace(one, **push), mode),
            PDCase(f"push-decoder-kv-full-{tag}", kv_full_requests(), small, 200, 40,
                   dataclasses.replace(one, **push), mode),
            PDCase(f"push-hetero-tp-{tag}", hetero_requests(), small, 200, 4 * 40,
                   dataclasses.replace(hetero, **push), mode),
            PDCase(f"push-prefill-held-full-{tag}", held_requests(), small, 30, 200,
                   dataclasses.replace(slow, **push), mode),
            PDCase(f"push-abort-in-transfer-{tag}", held_requests(), small, 200, 200,
                   dataclasses.replace(slow, **push), mode, abort_mid_read=(2, 5)),
        ]
    return out
