"""Mooncake-format JSONL written by the tests (synthetic; no external data)."""

from __future__ import annotations

import json
import pathlib
import random


def mooncake_lines(n: int, *, start_ms: int = 0, seed: int = 0, rate_per_s: float = 4.0,
                   input_blocks: tuple[int, int] = (4, 12), output_len: tuple[int, int] = (20, 80),
                   num_prefixes: int = 6) -> list[str]:
    """``n`` records with a few shared prompt prefixes (512-token hash blocks)."""
    rng = random.Random(seed)
    t = float(start_ms)
    out = []
    for i in range(n):
        t += rng.expovariate(rate_per_s) * 1000.0
        nb = rng.randint(*input_blocks)
        p = rng.randrange(num_prefixes)
        shared = [p * 1000 + k for k in range(min(nb - 1, 6))]
        own = [10**6 + seed * 10**5 + i * 20 + k for k in range(nb - len(shared))]
        out.append(json.dumps({"timestamp": int(t), "input_length": nb * 512 - rng.randint(0, 300),
                               "output_length": rng.randint(*output_len),
                               "hash_ids": shared + own}))
    return out


def write_lines(path: pathlib.Path, lines: list[str], *, append: bool = False) -> None:
    with open(path, "a" if append else "w") as fh:
        fh.write("".join(line + "\n" for line in lines))


def last_timestamp_ms(lines: list[str]) -> int:
    return int(json.loads(lines[-1])["timestamp"])
