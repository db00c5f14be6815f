"""Golden replays: restructuring the replay loop or the fast path must not change a byte.

Seven replays of the bundled traces, each read two ways (streamed with frequent id
renumbering, as ``tuner.replay.run`` reads a trace, and interned whole, as tuning does) (the agentic hour's first 10 minutes with cache-aware
admission off and on and on small pools, one with
``prefill_schedule_interval`` and ``long_prefill_token_threshold``; the Mooncake-format sample unbounded, on a small
pool and in a closed loop) are reduced to SHA-256 digests of their per-request records,
per-step records, inter-token gaps, counters and time series, and compared with digests
stored in ``golden_digests.json`` (written from main at commit dc405ce). Three more cases
(``async_*``) replay the same traces with async scheduling (``SimOptions.async_scheduling``,
``tuner.sim.async_update``); they and the step records' later ``kv_usage_at_update`` field
have digests of their own, added without touching the synchronous ones. The two
closed-loop cases (``mooncake_closed32``, ``async_mooncake_closed32``) were regenerated
alone in ``loop31``, when a closed loop's replacement began to miss the engine step
scheduled at the instant its slot freed (docs/step-time-model.md §1.4); replayed with
``ClosedLoop(32, replacement_misses_step=False)`` they gave their earlier digests.

Everything that is not the scheduler twin or the loop is pinned here so that a change to
the step-time model, the KV sizing or vLLM's default settings does not move the digests:
the KV cache shape and every scheduler setting are explicit, and the clock is a frozen,
nonlinear function of the batch (nonlinear so that a wrong batch changes every later
timestamp). Regenerate, only for an intended change of the twin's semantics, with
``python tests/replay/test_golden_replays.py --write``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIGESTS = Path(__file__).with_name("golden_digests.json")
SALT = b"golden-replays-salt"


def frozen_step_time(batch: Any) -> float:
    """A Llama-3.1-70B-on-8-GPUs-sized clock that never changes with the step-time model."""
    return (0.012 + 1.2e-5 * batch.num_prefill_tokens + 3e-5 * batch.num_decode_reqs
            + 1.5e-9 * batch.decode_ctx_tokens + 1e-12 * batch.prefill_attn_pairs
            + 2e-7 * batch.num_decode_reqs ** 1.5 + 1e-4 * batch.num_prefill_reqs)


def _settings(**kw: Any) -> Any:
    from tuner.sim.settings import SchedulerSettings

    base = dict(max_num_batched_tokens=16384, max_num_seqs=1024, long_prefill_token_threshold=0,
                enable_chunked_prefill=True, policy="fcfs", scheduler_reserve_full_isl=True,
                watermark=0.0, prefill_schedule_interval=1, cache_aware_admission_window=0,
                cache_aware_admission_threshold=0.5)
    base.update(kw)
    return SchedulerSettings(**base)


WINDOW = dict(cache_aware_admission_window=16, cache_aware_admission_threshold=0.5)
# name: (trace, scheduler settings, num_gpu_blocks, closed-loop concurrency or None)
CASES: dict[str, tuple[str, dict[str, Any], int, int | None]] = {
    "agentic10_window_off": ("agentic", {}, 399_317, None),
    "agentic10_window_on_thr0": ("agentic", dict(WINDOW, cache_aware_admission_threshold=0.0),
                                 399_317, None),
    "agentic10_window_on_pool20k": ("agentic", WINDOW, 20_000, None),
    "agentic10_pool16k_interval4_lpt": ("agentic", dict(
        WINDOW, prefill_schedule_interval=4, long_prefill_token_threshold=2048), 16_000, None),
    "mooncake_unbounded": ("mooncake", {}, 10_000_000, None),
    "mooncake_pool3k_window": ("mooncake", WINDOW, 3_000, None),
    "mooncake_closed32": ("mooncake", {}, 399_317, 32),
    # Async scheduling (AsyncScheduler under a batch queue of 2; tuner.sim.async_update):
    # cache-aware admission under pool pressure, preemptions, and a closed loop.
    "async_agentic10_window_on_pool20k": ("agentic", WINDOW, 20_000, None),
    "async_mooncake_pool3k_window": ("mooncake", WINDOW, 3_000, None),
    "async_mooncake_closed32": ("mooncake", {}, 399_317, 32),
}


def is_async(case: str) -> bool:
    """Whether a case replays vLLM's async scheduling (its name says so)."""
    return case.startswith("async_")


#: StepRecord fields pinned by the ``steps`` digest (the record as of dc405ce); fields
#: added later get a digest of their own, so adding one does not move the old digests.
PINNED_STEP_FIELDS = ("step", "start_s", "duration_s", "num_scheduled_tokens", "preempted",
                      "num_running", "num_waiting", "kv_usage", "cached_tokens")


def _trace(name: str, tmp: Path) -> Any:
    from tuner.trace import ingest, read_trace, slice_trace

    if name == "agentic":
        return slice_trace(read_trace(ROOT / "traces" / "agentic_1h.parquet"), 0.0, 600.0)
    out = tmp / "mooncake.parquet"
    if not out.exists():
        ingest(ROOT / "traces" / "mooncake_synthetic.jsonl", out, salt=SALT, progress=False)
    return read_trace(out)


#: How the replay reads the trace: "stream" is the replay path (``tuner.replay._stream``,
#: lazy windows, hashes interned as read, here with the id space renumbered every few
#: windows); "interned" interns the whole trace first (the tuning evaluator's path).
PATHS = ("stream", "interned")


def replay(case: str, tmp: Path, path: str = "stream") -> Any:
    """The case's ``ReplayResult`` through the replay path's interning and the twin's loop."""
    from tuner.replay._kv_requests import kv_request_ids, load_trace_arrays
    from tuner.replay._stream import TraceArrivals
    from tuner.sim.engine import Simulator
    from tuner.sim.load import ClosedLoop, OpenLoop
    from tuner.sim.settings import CacheSettings, SimOptions

    trace_name, overrides, blocks, concurrency = CASES[case]
    cache = CacheSettings(block_size=16, num_gpu_blocks=blocks, max_model_len=131072)
    trace = _trace(trace_name, tmp)
    if path == "stream":
        requests: Any = TraceArrivals(trace, 16, window=256, min_compact_ids=1 << 16)
    else:
        requests = kv_request_ids(load_trace_arrays(trace), trace.metadata.hash_block_size, 16)
    load = ClosedLoop(concurrency) if concurrency else OpenLoop()
    sim = Simulator(requests, _settings(**overrides), cache, frozen_step_time,
                    options=SimOptions(record_steps=True, async_scheduling=is_async(case)),
                    load=load,
                    num_hash_ids=getattr(requests, "num_hash_ids", None))
    result = sim.run()
    if path == "stream":  # the renumbering ran, so the digests cover it
        assert requests.num_renumberings > 0, f"{case}: the id space was never renumbered"
    return result


def digests(result: Any) -> dict[str, str]:
    """SHA-256 of each record stream (repr is exact for floats)."""
    def sha(value: Any) -> str:
        return hashlib.sha256(repr(value).encode()).hexdigest()

    return {
        "requests": sha([dataclasses.astuple(r) for r in result.requests]),
        "steps": sha([tuple(getattr(s, f) for f in PINNED_STEP_FIELDS)
                      for s in result.steps]),
        "kv_usage_at_update": sha([s.kv_usage_at_update for s in result.steps]),
        "itl_samples": sha(list(result.itl_samples)),
        "counters": sha(sorted(result.counters.items())),
        "timeseries": sha(sorted(result.timeseries.items())),
        "simulated_s": repr(result.simulated_s),
    }


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_replay_matches_stored_digest(case: str, path: str,
                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    stored = json.loads(DIGESTS.read_text())[case]
    got = digests(replay(case, tmp_path_factory.getbasetemp(), path))
    assert got == stored, f"{case} ({path}): replay records differ from the golden digests"


def _write() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = {}
        for case in sorted(CASES):
            result = replay(case, Path(tmp))
            out[case] = digests(result)
            print(case, int(result.counters["num_steps"]), "steps",
                  int(result.counters["preemptions"]), "preemptions", file=sys.stderr)
    DIGESTS.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/replay/test_golden_replays.py --write")
    _write()
