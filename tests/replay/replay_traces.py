"""Small hand-built traces for replay tests (no dependency on the synthetic generator)."""

from __future__ import annotations

import random

from tuner.trace import TraceRequest

_MASK = (1 << 64) - 1


def _h(*parts: int) -> int:
    """A deterministic uint64 block id for a tuple of ints (stands in for a salted hash)."""
    x = 0x243F6A8885A308D3
    for p in parts:
        x = ((x ^ (p & _MASK)) * 0x100000001B3 + 0x9E3779B97F4A7C15) & _MASK
        x ^= x >> 29
    return x


def make_requests(n: int = 30, *, seed: int = 0, hbs: int = 16, spacing_s: float = 0.05,
                  follow_ups: bool = True, aligned: bool = False) -> list[TraceRequest]:
    """``n`` requests over 3 shared system prompts, unique suffixes, partial tails
    (``ceil`` hash lists), and some second turns that extend an earlier request's prompt
    and output (through ``output_block_hashes``). ``aligned``: every prompt is whole
    blocks (no partial tail) and there are no follow-ups or output hashes."""
    if aligned:
        follow_ups = False
    rng = random.Random(seed)
    system_blocks = [4, 9, 2]
    out: list[TraceRequest] = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(1.0 / spacing_s) if spacing_s > 0 else 0.0
        prev = out[rng.randrange(len(out))] if (follow_ups and out and rng.random() < 0.3) else None
        output_len = rng.randint(1, 40)
        if prev is not None:
            base = prev.input_len + prev.output_len
            extra = rng.randint(1, 3 * hbs)
            input_len = base + extra
            n_prev_full = base // hbs
            stream = list(prev.block_hashes[: prev.input_len // hbs]) + list(prev.output_block_hashes)
            assert len(stream) == n_prev_full
            hashes = stream + [_h(7, i, j) for j in range(n_prev_full, -(-input_len // hbs))]
        else:
            g = rng.randrange(3)
            sys_len = system_blocks[g] * hbs
            # every 10th request is exactly a system prompt: fully cached, so vLLM's
            # last-token rule caps its hit one block short
            input_len = sys_len if i % 10 == 9 else sys_len + rng.randint(1, 5 * hbs)
            if aligned:
                input_len -= input_len % hbs
            hashes = [_h(1, g, j) for j in range(system_blocks[g])]
            hashes += [_h(2, i, j) for j in range(system_blocks[g], -(-input_len // hbs))]
        # output blocks: full blocks of the (prompt + output) stream from floor(input/hbs) on
        n_stream = (input_len + output_len) // hbs
        first = input_len // hbs
        out_hashes = () if aligned else tuple(_h(3, i, j) for j in range(first, n_stream))
        out.append(TraceRequest(request_id=f"r{i:03d}", arrival_s=round(t, 6), input_len=input_len,
                                output_len=output_len, block_hashes=tuple(hashes),
                                output_block_hashes=out_hashes))
    return out
