"""Expert parallelism (``--enable-expert-parallel``): how it changes one rank's step.

vLLM 0.33.0 without expert parallelism splits every routed expert's width over the TP
ranks (``FusedMoE`` tensor parallelism). With ``--enable-expert-parallel`` the experts
are instead sharded whole over ``EP = tp x dp`` ranks (``FusedMoEParallelConfig``:
``ep_size = tp * dp``, expert TP 1), and when the EP group spans more than one DP rank
the MoE layers move tokens with all-to-all kernels, a *dispatch* before the experts and
a *combine* after (``FusedMoEConfig.use_all2all_kernels``: ``use_ep and dp_size > 1``,
``model_executor/layers/fused_moe/config.py``). The TP all-reduce of the MoE output
stays where the attention TP is above one (``runner/moe_runner.py``
``_maybe_reduce_final_output``: ``tp_size > 1 or ep_size > 1``), so with the usual
EP deployment (attention TP 1, DP n) the all-to-all replaces it outright.

What this module prices, per rank and step (docs/step-time-model.md §1.2):

* **Experts**: ``E / EP`` experts per rank at full width; with DP lock step the tokens
  of all DP ranks reach them, ``k x T_group / EP`` expert-token pairs per rank
  (``T_group`` = tokens of the whole DP group this step; balanced routing), and the
  rank streams the local experts those tokens touch,
  ``E/EP x (1 - (1 - k/E)^T_group)``.
* **All-to-all** per MoE layer, dispatch and combine:
  ``latency + V / bandwidth`` with ``V = T x r x hidden x bytes`` the per-rank buffer,
  ``r = EP (1 - (1 - 1/EP)^k)`` the ranks a token's ``k`` experts land on (its own
  included: that is how DeepEP and MoRI-EP count their bandwidths), dispatch in the
  experts' activation format (fp8 for fp8 experts, as DeepEP/MoRI dispatch), combine in
  bf16. A latency floor plus ``V / bandwidth`` is an effective bandwidth ``V / t`` that
  grows with the message. ``latency`` and ``bandwidth`` are the hardware preset's
  ``interconnect.all2all_latency_us`` / ``all2all_bw_gbps`` (sources in the YAML).

Everything is linear in the rank's tokens or depends on ``T_group`` only through the
expert terms, so the balanced case (every DP rank carries the same tokens) folds into
the step-time model's per-token and per-step constants, and :func:`expert_terms` prices
an unbalanced lock-step rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import ConfigError
from tuner.perf.hardware import HardwareSpec
from tuner.perf.models import DTYPE_BYTES, ModelSpec


@dataclass(frozen=True, slots=True)
class ExpertLayout:
    """How one rank holds and feeds the routed experts.

    ``ep`` is 1 without expert parallelism (experts TP-split), else ``tp x dp``.
    """

    ep: int
    dp: int
    local_experts: float  # experts this rank holds
    width_share: float  # fraction of each expert's width on this rank (1/tp, or 1 with EP)
    group_factor: float  # T_group / T of one rank under balanced DP (dp with EP, else 1)
    all2all: bool  # whether the MoE layers dispatch and combine across ranks

    @property
    def pair_share(self) -> float:
        """Expert-token pairs this rank computes per pair of its own tokens (balanced)."""
        return self.group_factor / self.ep if self.ep > 1 else 1.0


def expert_layout(model: ModelSpec, tp: int, dp: int, enabled: bool) -> ExpertLayout:
    """The expert sharding vLLM 0.33.0 uses for ``tp``, ``dp`` and the EP flag.

    Raises ``ConfigError`` when EP would leave a rank without an expert (vLLM refuses
    ``num_experts < ep_size`` too).
    """
    if dp < 1:
        raise ConfigError(f"dp={dp} must be >= 1")
    ep = tp * dp if (enabled and model.is_moe) else 1
    if ep == 1:
        return ExpertLayout(ep=1, dp=dp, local_experts=float(model.num_experts),
                            width_share=1.0 / tp, group_factor=1.0, all2all=False)
    if model.num_experts < ep:
        raise ConfigError(f"--enable-expert-parallel: {model.name} has {model.num_experts} "
                          f"experts, fewer than the {ep} EP ranks (tp x dp); vLLM refuses "
                          "this too")
    return ExpertLayout(ep=ep, dp=dp, local_experts=model.num_experts / ep, width_share=1.0,
                        group_factor=float(dp), all2all=dp > 1)


def ranks_per_token(ep: int, top_k: int) -> float:
    """Expected EP ranks (own included) a token's ``top_k`` experts land on, uniform routing."""
    return ep * (1.0 - (1.0 - 1.0 / ep) ** top_k)


def all2all_constants(hardware: HardwareSpec, model: ModelSpec,
                      layout: ExpertLayout) -> tuple[float, float]:
    """(seconds per step, seconds per token of this rank) of dispatch + combine, all
    MoE layers; zeros where the MoE layers do not dispatch (no EP, or one DP rank)."""
    if not layout.all2all:
        return 0.0, 0.0
    r = ranks_per_token(layout.ep, model.num_experts_per_tok)
    dispatch_b = DTYPE_BYTES["fp8"] if model.expert_weight_dtype == "fp8" else DTYPE_BYTES["bf16"]
    combine_b = DTYPE_BYTES["bf16"]
    bytes_per_token = r * model.hidden_size * (dispatch_b + combine_b)
    layers = model.num_moe_layers
    fixed = layers * 2.0 * hardware.all2all_latency_s
    per_token = layers * bytes_per_token / hardware.all2all_bandwidth
    return fixed, per_token


def expert_terms(e_mem: float, e_tok_group: float, e_half: float, local_experts: float,
                 expert_q: float, group_tokens: float) -> float:
    """Routed-expert seconds of one rank: memory (the local experts the group's tokens
    touch) against compute (pairs routed here plus the per-expert ``m_half`` term), the
    larger one.

    ``e_tok_group`` is seconds per token of the *DP group* (``k / EP`` pairs reach this
    rank per group token) and ``expert_q = 1 - k/E``, so a lock-step rank prices its
    experts from the group's tokens, not its own; without EP the group is the rank.
    """
    touched = local_experts * (1.0 - expert_q ** group_tokens)
    mem = e_mem * touched
    cmp = e_tok_group * group_tokens + e_half * touched
    return mem if mem > cmp else cmp
