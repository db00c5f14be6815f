"""Pricing a speculative-decoding step: the target's verify and the drafter's proposals.

A step with drafts (``StepBatch.num_spec_reqs``/``num_spec_tokens``, tuner.sim.spec_update)
is priced as two parts (docs/speculative-decoding.md §3):

* **Verify**, by the wrapped step-time model itself: every verifying request is in the
  batch with ``1 + d`` query tokens (its drafts ``d``), as vLLM's ``SchedulerOutput``
  lists it, so the GEMMs see the extra rows and attention the longer query over the
  request's KV (the per-kernel model's prefill terms: KV read of context + queries
  against the causal query-key pairs). Three corrections for what the plain batch
  cannot know: the LM head and the sampler run over ``1 + d`` rows per verifying request
  (the rejection sampler needs every position's logits), and a step of verifies only is a
  uniform decode batch (``uniform_decode_query_len = 1 + k``, config/vllm.py), which
  vLLM 0.33.0 captures in full CUDA graphs: it pays the decode launch gaps, not the
  piecewise (mixed) ones.
* **Drafting**, per method, after the verify (the proposer runs on the verified hidden
  states, so it cannot overlap the step's GPU work):

  - ``mtp``: one MTP module per draft position, sequentially; a module is one decoder
    layer of the target (DeepSeek-V3: "the MTP module ... a Transformer block", arXiv
    2412.19437 §2.2) plus the shared LM head. The first position runs over every token of
    the step (vLLM's EAGLE/MTP proposer takes the target's hidden states of all scheduled
    tokens), the next ``k - 1`` over one token per request.
  - ``eagle`` / ``eagle3``: the same schedule with a one-layer head (EAGLE-3: a single
    decoder layer over fused low/mid/high features, arXiv 2503.01840 §3), priced as one
    layer of the target plus the LM head (a dense head on an MoE target is cheaper: the
    routed experts are priced as if present, an upper bound).
  - ``ngram``: no GPU work; a CPU lookup per request (vLLM's numba-jitted
    ``NgramProposer``, v1/spec_decode/ngram_proposer.py) priced at
    :data:`NGRAM_LOOKUP_S` per request, in the engine's CPU part (the async overlap rule
    hides it behind the GPU as it does the scheduler's own work).

Defaults of acceptance per method come only from published measurements
(:data:`PUBLISHED_ACCEPTANCE`); a method without one needs ``--spec-acceptance``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tuner.errors import ConfigError
from tuner.perf.step_time import StepTimeModel
from tuner.sim.batch import StepBatch
from tuner.sim.spec_decode import METHODS as METHODS_WITH_LAYERS
from tuner.sim.spec_decode import SpecDecoding

#: CPU seconds of one request's n-gram lookup (a KMP match of the last 1-4 tokens over
#: the context, numba-compiled, run in parallel over the batch). An estimate of the
#: order of magnitude, not a measurement: a few microseconds per request.
NGRAM_LOOKUP_S = 5e-6

#: Per-position acceptance rates ``P(accepted >= i)`` from published measurements, by
#: method; a shorter list is extended geometrically (``tuner.sim.spec_decode.extend_rates``).
PUBLISHED_ACCEPTANCE: dict[str, tuple[tuple[float, ...], str]] = {
    # DeepSeek-V3 technical report, arXiv 2412.19437 §5.4.3: "the acceptance rate of the
    # second token prediction ranges between 85% and 90%" (MTP, one extra token); the
    # low end, so a replay does not promise more than the report measured.
    "mtp": ((0.85,), "DeepSeek-V3 technical report (arXiv 2412.19437, §5.4.3): 85-90 % "
                     "acceptance of the second token"),
}


def default_acceptance(method: str, k: int) -> tuple[float, ...]:
    """The published acceptance of ``method`` (see :data:`PUBLISHED_ACCEPTANCE`)."""
    entry = PUBLISHED_ACCEPTANCE.get(method)
    if entry is None:
        raise ConfigError(f"speculative method {method!r} has no published acceptance "
                          "default here; give --spec-acceptance (rates like 0.8,0.6,0.45 "
                          "or a mean acceptance length), e.g. from the server log's "
                          "'SpecDecoding metrics' line")
    return entry[0]


class SpecDecodeStepTime(StepTimeModel):
    """``base`` (any per-kernel model) plus the verify corrections and the drafter's cost
    of ``spec``; steps without drafts cost exactly ``base``'s price."""

    def __init__(self, base: StepTimeModel, spec: SpecDecoding) -> None:
        self.base = base
        self.spec = spec
        self.k = spec.num_speculative_tokens
        self.couples_ranks = base.couples_ranks
        layers = getattr(getattr(base, "model", None), "num_layers", 0)
        self._per_layer = 1.0 / layers if layers else 0.0
        lm = getattr(base, "_lm", None)  # (memory s, s per row, s at 0 rows): roofline
        self._lm = lm if lm is not None else (0.0, 0.0, 0.0)
        self._sample = float(getattr(base, "_sample", 0.0))
        self._launch_saving = max(0.0, float(getattr(base, "_gpu_mixed", 0.0))
                                  - float(getattr(base, "_gpu_decode", 0.0)))
        if spec.per_batch_size:  # dynamic k: vLLM runs PIECEWISE graphs (config/vllm.py:1069-1086)
            self._launch_saving = 0.0
        self._gpu_drafter = spec.method != "ngram"

    # ------------------------------------------------------------- parts
    def _lm_s(self, rows: float) -> float:
        mem, tok, zero = self._lm
        cmp = tok * rows + zero
        return mem if mem > cmp else cmp

    def verify_extra_s(self, batch: StepBatch) -> float:
        """What the plain price misses in a verify step (LM head and sampler rows; minus
        the piecewise launch gaps of an all-verify step)."""
        spec = batch.num_spec_tokens
        if not spec:
            return 0.0
        reqs = batch.num_prefill_reqs + batch.num_decode_reqs
        t = self._lm_s(reqs + spec) - self._lm_s(reqs) + self._sample * spec
        if batch.num_prefill_tokens == batch.num_spec_reqs + spec:  # verifies only
            t -= self._launch_saving
        return t

    def drafter_s(self, batch: StepBatch) -> float:
        """GPU seconds of the drafts proposed after this step (none for n-gram)."""
        reqs = batch.num_prefill_reqs + batch.num_decode_reqs
        k = self.spec.k_for_batch(reqs) if self.spec.per_batch_size else self.k
        if not self._gpu_drafter or reqs <= 0 or not self._per_layer or not k:
            return 0.0
        base = self.base
        first = (base.step_time_s(batch) - base.cpu_s(batch)) * self._per_layer
        rest = 0.0
        if k > 1:
            ctx = (batch.decode_ctx_tokens + batch.prefill_ctx_tokens
                   + batch.num_prefill_tokens)
            one = StepBatch(num_decode_reqs=reqs, decode_ctx_tokens=ctx)
            rest = (k - 1) * (base.step_time_s(one) - base.cpu_s(one)) * self._per_layer
        return first + rest + k * self._lm_s(reqs)

    def drafter_cpu_s(self, batch: StepBatch) -> float:
        if self._gpu_drafter:
            return 0.0
        return NGRAM_LOOKUP_S * (batch.num_prefill_reqs + batch.num_decode_reqs)

    # ------------------------------------------------------------- StepTimeModel
    def step_time_s(self, batch: StepBatch) -> float:
        t = self.base.step_time_s(batch)
        if t <= 0.0:
            return t
        return (t + self.verify_extra_s(batch) + self.drafter_s(batch)
                + self.drafter_cpu_s(batch))

    def cpu_s(self, batch: StepBatch) -> float:
        cpu = self.base.cpu_s(batch)
        return cpu + self.drafter_cpu_s(batch) if cpu > 0.0 else cpu

    def rank_step_time_s(self, batch: StepBatch, group_tokens: int) -> float:
        t = self.base.rank_step_time_s(batch, group_tokens)
        if t <= 0.0:
            return t
        return (t + self.verify_extra_s(batch) + self.drafter_s(batch)
                + self.drafter_cpu_s(batch))

    def __getattr__(self, name: str) -> Any:  # terms(), model, hardware, ... of the base
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)


def with_spec_decode(step_time: StepTimeModel, spec: SpecDecoding | None) -> StepTimeModel:
    """``step_time`` priced for ``spec`` (unchanged when speculative decoding is off)."""
    if spec is None:
        return step_time
    return SpecDecodeStepTime(step_time, spec)


#: Decoder layers of a drafter with its own forward pass: DeepSeek-V3's MTP module is one
#: (``num_nextn_predict_layers`` = 1, arXiv 2412.19437 §2.2), an EAGLE / EAGLE-3 head one
#: (arXiv 2503.01840 §3).
DRAFTER_LAYERS = 1


def with_drafter_kv(resolved: Any, spec: SpecDecoding) -> Any:
    """``resolved`` with the KV blocks left after the drafter's own layer.

    vLLM gives a drafter with attention layers of its own (eagle, eagle3, mtp:
    ``SpeculativeConfig.uses_draft_kv_cache``, config/speculative.py:2172) KV in the same
    cache, so every block holds one more layer's K and V, and the drafter's weights come
    out of the memory before the KV cache is sized. Priced as one more layer of the
    target's KV shape and one target layer's share of the weights (an upper bound for a
    dense EAGLE head on an MoE target). A ``--num-gpu-blocks`` override (``capacity`` None)
    is taken as given, as vLLM takes ``num_gpu_blocks_override``.

    Raises:
        ConfigError: the smaller cache no longer holds ``max_model_len`` (vLLM refuses to
            start there too).
    """
    capacity = getattr(resolved, "capacity", None)
    layers = int(getattr(resolved.model, "num_layers", 0) or 0)
    if capacity is None or not METHODS_WITH_LAYERS.get(spec.method) or layers <= 0:
        return resolved
    per_block = capacity.bytes_per_block * (layers + DRAFTER_LAYERS) / layers
    kv_bytes = capacity.kv_bytes - capacity.weight_bytes * DRAFTER_LAYERS / layers
    blocks = int(kv_bytes // per_block) if kv_bytes > 0 else 0
    cache = resolved.cache
    if (blocks - 1) * cache.block_size < cache.max_model_len:
        raise ConfigError(f"{spec.method} drafts: its layer's weights and KV leave "
                          f"{max(0, blocks - 1) * cache.block_size:,} KV tokens per engine, "
                          f"fewer than max_model_len={cache.max_model_len}; pass a smaller "
                          "--max-model-len or a larger --tp")
    capacity = dataclasses.replace(capacity, num_gpu_blocks=blocks, bytes_per_block=per_block,
                                   kv_bytes=kv_bytes)
    return dataclasses.replace(resolved, capacity=capacity,
                               cache=dataclasses.replace(cache, num_gpu_blocks=blocks))


def spec_deployment(resolved: Any, options: Any) -> tuple[Any, Any]:
    """A resolved target and twin options for ``options.speculative``: the scheduling mode
    vLLM 0.33.0 resolves with this drafter (n-gram: no async scheduling on the V1 model
    runner, ``tuner.vllm_compat``), the KV blocks left after the drafter's own layer
    (:func:`with_drafter_kv`) and the step-time model priced for verifies."""
    from tuner.vllm_compat import resolve_async_scheduling

    spec = options.speculative
    if spec.per_batch_size and resolved.target.dp > 1:
        # vLLM turns the per-batch-size k off with DP ranks (they could pick different
        # k and deadlock) and runs the fixed k (config/vllm.py:1111-1127)
        spec = dataclasses.replace(spec, per_batch_size=())
        options = dataclasses.replace(options, speculative=spec)
    mode = resolve_async_scheduling(resolved.target.async_scheduling,
                                    platform=resolved.hardware.vllm_platform,
                                    spec_method=spec.method)
    resolved = with_drafter_kv(resolved, spec)
    resolved = dataclasses.replace(resolved, step_time=with_spec_decode(resolved.step_time, spec))
    return resolved, dataclasses.replace(options, async_scheduling=mode)
