"""``StepBatch``: what one scheduler step asks of the GPU, in aggregate.

The step-time model needs only sums over the scheduled requests, not the requests
themselves. Keeping the batch as a handful of counters lets the twin fast-forward a
pure-decode stretch by updating sums (each decode step adds ``num_decode_reqs`` to
``decode_ctx_tokens``) instead of rebuilding a per-request list every step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepBatch:
    """Aggregate work of one step (one forward pass).

    A request is a *prefill* request in a step if its scheduled tokens end before its
    prompt (or recomputed sequence) is fully computed, or include more than one token;
    a *decode* request schedules exactly one new token after its sequence is computed.
    """

    num_prefill_reqs: int = 0  # requests scheduling prompt (or recompute) tokens
    num_decode_reqs: int = 0  # requests scheduling exactly one generated token
    num_prefill_tokens: int = 0  # new tokens computed for prefill requests
    prefill_ctx_tokens: int = 0  # sum over prefill requests of tokens already in KV (cached/computed)
    prefill_attn_pairs: float = 0.0  # sum of new*(ctx + (new+1)/2): causal query-key pairs of prefill
    decode_ctx_tokens: int = 0  # sum over decode requests of the context each attends to (incl. itself)
    # Speculative decoding: verifies are counted as prefill requests above (1 + drafts
    # tokens each, as vLLM's SchedulerOutput lists them); these say how many of those
    # requests verify drafts and how many draft tokens the step carries.
    num_spec_reqs: int = 0  # requests verifying drafts this step
    num_spec_tokens: int = 0  # draft tokens verified this step (each request's <= k)

    @property
    def num_reqs(self) -> int:
        return self.num_prefill_reqs + self.num_decode_reqs

    @property
    def num_tokens(self) -> int:
        """Tokens in the forward pass (prefill + decode)."""
        return self.num_prefill_tokens + self.num_decode_reqs

    @classmethod
    def from_requests(cls, items: "list[tuple[int, int]]") -> "StepBatch":
        """Build from ``(num_computed_tokens_before, num_new_tokens)`` per request.

        One new token on a request whose sequence is otherwise computed counts as
        decode; anything else as prefill. Used by tests and by backends that see
        per-request work (vLLM's ``SchedulerOutput``).
        """
        npr = ndr = npt = pctx = dctx = 0
        pairs = 0.0
        for ctx, new in items:
            if new == 1:
                ndr += 1
                dctx += ctx + 1
            elif new > 1:
                npr += 1
                npt += new
                pctx += ctx
                pairs += new * (ctx + (new + 1) / 2)
        return cls(npr, ndr, npt, pctx, pairs, dctx)
