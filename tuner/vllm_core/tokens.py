"""Token ids from a trace's block hashes, shared by the vLLM-core driver and the serve client.

Plain Python (it runs inside vLLM's interpreter too). Block ``h`` is the ``B`` token ids
drawn from ``random.Random(h)``, so equal trace hashes give equal token blocks and
therefore equal vLLM block hashes, and different ones differ. The partial tail of a
prompt is unique per request unless the trace knows the block the output completes
(``output_block_hashes[0]``), in which case it is that block's first tokens; generated
tokens follow ``output_block_hashes`` the same way, and are unique per request beyond.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

VOCAB_LOW, VOCAB_HIGH = 3, 999  # token ids drawn from [3, 999]; 0-2 are special in tiny-llama


class TokenFactory:
    """Deterministic token ids: equal trace block hashes -> equal token blocks."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._blocks: dict[int, list[int]] = {}

    def block(self, block_hash: int) -> list[int]:
        toks = self._blocks.get(block_hash)
        if toks is None:
            rng = random.Random(block_hash)
            toks = [rng.randint(VOCAB_LOW, VOCAB_HIGH) for _ in range(self.block_size)]
            self._blocks[block_hash] = toks
        return toks

    @staticmethod
    def unique(request_id: str, what: str, n: int) -> list[int]:
        rng = random.Random(f"{request_id}\x00{what}")  # str seed: sha512, stable across runs
        return [rng.randint(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]

    def prompt(self, req: "DriverRequest") -> list[int]:
        bs = self.block_size
        full = req.input_len // bs
        if len(req.block_hashes) < full:
            raise ValueError(f"request {req.request_id}: {len(req.block_hashes)} block hashes "
                             f"for {req.input_len} tokens at block size {bs}")
        toks: list[int] = []
        for h in req.block_hashes[:full]:
            toks.extend(self.block(h))
        tail = req.input_len - full * bs
        if tail:
            if req.output_block_hashes:
                toks.extend(self.block(req.output_block_hashes[0])[:tail])
            else:
                toks.extend(self.unique(req.request_id, "tail", tail))
        return toks

    def output_tokens(self, req: "DriverRequest") -> list[int]:
        """All ``output_len`` generated token ids, in order."""
        bs = self.block_size
        first_block = req.input_len // bs
        extra = self.unique(req.request_id, "out", req.output_len)
        out = []
        for k in range(req.output_len):
            pos = req.input_len + k
            j = pos // bs - first_block
            if j < len(req.output_block_hashes):
                out.append(self.block(req.output_block_hashes[j])[pos % bs])
            else:
                out.append(extra[k])
        return out


@dataclass(slots=True)
class DriverRequest:
    """A trace request as plain data (no ``tuner.trace`` import here: no pyarrow)."""

    request_id: str
    arrival_s: float
    input_len: int
    output_len: int
    block_hashes: tuple[int, ...]
    output_block_hashes: tuple[int, ...] = ()
    session_id: str | None = None
    priority: int = 0


__all__ = ["DriverRequest", "TokenFactory", "VOCAB_HIGH", "VOCAB_LOW"]
