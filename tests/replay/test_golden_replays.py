"""Golden replays: restructuring the replay loop or the fast path must not change a byte.

Seven replays of the bundled traces (the agentic hour's first 10 minutes with cache-aware
admission off and on and on small pools, one with
``prefill_schedule_interval`` and ``long_prefill_token_threshold``; the Mooncake-format sample unbounded, on a small
pool and in a closed loop) are reduced to SHA-256 digests of their per-request records,
per-step records, inter-token gaps, counters and time series, and compared with digests
stored in ``golden_digests.json`` (written from main at commit dc405ce).

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
}


def _trace(name: str, tmp: Path) -> Any:
    from tuner.trace import ingest, read_trace, slice_trace

    if name == "agentic":
        return slice_trace(read_trace(ROOT / "traces" / "agentic_1h.parquet"), 0.0, 600.0)
    out = tmp / "mooncake.parquet"
    if not out.exists():
        ingest(ROOT / "traces" / "mooncake_synthetic.jsonl", out, salt=SALT, progress=False)
    return read_trace(out)


def replay(case: str, tmp: Path) -> Any:
    """The case's ``ReplayResult`` through the replay path's interning and the twin's loop."""
    from tuner.replay._run import _kv_requests
    from tuner.sim.engine import Simulator
    from tuner.sim.load import ClosedLoop, OpenLoop
    from tuner.sim.settings import CacheSettings, SimOptions

    trace_name, overrides, blocks, concurrency = CASES[case]
    cache = CacheSettings(block_size=16, num_gpu_blocks=blocks, max_model_len=131072)
    requests = _kv_requests(_trace(trace_name, tmp), None, 16, arrays=True, hash_ids=True)
    load = ClosedLoop(concurrency) if concurrency else OpenLoop()
    return Simulator(requests, _settings(**overrides), cache, frozen_step_time,
                     options=SimOptions(record_steps=True), load=load,
                     num_hash_ids=requests.num_hash_ids).run()


def digests(result: Any) -> dict[str, str]:
    """SHA-256 of each record stream (repr is exact for floats)."""
    def sha(value: Any) -> str:
        return hashlib.sha256(repr(value).encode()).hexdigest()

    return {
        "requests": sha([dataclasses.astuple(r) for r in result.requests]),
        "steps": sha([dataclasses.astuple(s) for s in result.steps]),
        "itl_samples": sha(list(result.itl_samples)),
        "counters": sha(sorted(result.counters.items())),
        "timeseries": sha(sorted(result.timeseries.items())),
        "simulated_s": repr(result.simulated_s),
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_replay_matches_stored_digest(case: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    stored = json.loads(DIGESTS.read_text())[case]
    got = digests(replay(case, tmp_path_factory.getbasetemp()))
    assert got == stored, f"{case}: replay records differ from the golden digests"


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
