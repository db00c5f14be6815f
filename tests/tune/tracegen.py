"""A small synthetic agentic trace for tuning tests (made up here; no external data).

Sessions share a system prompt; every turn's prompt extends the previous turn's prompt
and output, so prefix-cache reuse (and eviction under a small KV cache) matters.
"""

from __future__ import annotations

import pathlib
import random

from tuner.trace import TraceRequest, write_trace
from tuner.trace.schema import TraceMetadata

HASH_BLOCK = 16


def make_requests(*, duration_s: float = 120.0, sessions: int = 24, seed: int = 0
                  ) -> list[TraceRequest]:
    rng = random.Random(seed)
    system = [rng.getrandbits(63) for _ in range(64)]  # 1024-token shared system prompt
    out: list[TraceRequest] = []
    for s in range(sessions):
        t = rng.uniform(0, duration_s * 0.3)
        blocks = list(system)
        turn = 1
        while t < duration_s:
            blocks += [rng.getrandbits(63) for _ in range(rng.randint(4, 40))]
            input_len = len(blocks) * HASH_BLOCK + rng.randint(0, HASH_BLOCK - 1)
            output_len = rng.randint(20, 200)
            out.append(TraceRequest(request_id=f"s{s}-t{turn}", arrival_s=round(t, 3),
                                    input_len=input_len, output_len=output_len,
                                    block_hashes=tuple(blocks), session_id=f"s{s}", turn=turn))
            blocks += [rng.getrandbits(63) for _ in range(output_len // HASH_BLOCK)]
            t += rng.uniform(2.0, 12.0)
            turn += 1
    out.sort(key=lambda r: r.arrival_s)
    return out


def write_small_trace(path: pathlib.Path, **kw: object) -> pathlib.Path:
    meta = TraceMetadata(hash_block_size=HASH_BLOCK, source_format="synth:tests-agentic")
    return write_trace(path, make_requests(**kw), meta)  # type: ignore[arg-type]
