"""Disaggregated prefill/decode layouts as dimensions of a study (``--disaggregated``),
and the answer to "should I split prefill from decode, and in which ratio".

Why a deployment dimension: a P/D layout is a choice of GPUs, not of ``SchedulerConfig``
fields, like a GPU split. Under ``--gpu-budget N`` the aggregated splits
(:func:`tuner.perf.deployment.gpu_splits`, ``gpu_split``) and the disaggregated layouts
(:func:`pd_layouts`: ``P`` prefill instances of TP ``p`` and ``D`` decode instances of TP
``d`` with ``P*p + D*d == N``, or ``<= N`` with ``--pd-gpus up-to``) are searched in one
study:

* ``--disaggregated off`` (the default): today's space, unchanged (same parameters, same
  study keys, same digests);
* ``on``: only P/D layouts (``pd.layout``, ``pd.router``); the baseline stays the
  aggregated target, evaluated in stage 2 (it is outside the space);
* ``auto``: both. ``pd.mode`` (``aggregated`` | ``disaggregated``) is drawn first and the
  aggregated parameters (``gpu_split``, ``router.*``) and the P/D ones are conditional on
  it, so TPE learns "split or not" as one categorical instead of diluting the aggregated
  splits among dozens of P/D labels.

A P/D point replays through the sim backend's P/D replay (``tuner.replay`` with
``pd=PDLayout``, docs/disaggregation.md); both pools run the point's scheduler settings
except the prefill pool's own token budget and running limit (``pd.prefill_*``,
:func:`prefill_limit_params`). ``pd.router`` is the proxy's policy: vLLM's example proxy
(round robin), llm-d's P/D scheduler or Dynamo's KV router (:data:`PD_ROUTERS`);
``pd.layout`` may put the prefill pool on other hardware (``--pd-prefill-hardware``).

After the pick, :func:`tuner.tune.pd_verdict.pd_verdict` compares the best P/D point with the best aggregated one
on the held-out window (the training window without one) and finds the knee ratio
(:func:`tuner.tune.pd_verdict.knee_ratios`): the prefill:decode GPU ratio beyond which
more decode stops helping.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Literal

from tuner.errors import ConfigError
from tuner.perf.deployment import MAX_TP, Deployment, Split, split_refusal
from tuner.perf.deployment import pd_layout_label as layout_label
from tuner.perf.pd_link import PDLayout
from tuner.sim.disagg.routers import PD_ROUTERS as _SIM_PD_ROUTERS
from tuner.sim.disagg.settings import TRANSFER_MODES
from tuner.tune.space import (AGGREGATED, DISAGGREGATED, PD_LAYOUT, PD_MODE, PD_PARAMS,
                              PD_PREFILL_BATCHED_TOKENS, PD_PREFILL_SEQS, PD_ROUTER,
                              PD_TRANSFER_MODE, Param,
                              SearchSpace)

Disaggregated = Literal["off", "on", "auto"]
MODES: tuple[str, ...] = ("off", "on", "auto")
PDFill = Literal["full", "up-to"]  # --pd-gpus: P/D layouts of every GPU, or of at most N


#: The P/D proxies the P/D replay runs (``tuner.sim.disagg.routers``): vLLM's example proxy
#: (round robin to both pools), llm-d's P/D scheduler and Dynamo's KV router; a study
#: searches all of them unless ``--pd-router`` names some.
PD_ROUTERS: tuple[str, ...] = tuple(_SIM_PD_ROUTERS)



def parse_disaggregated(value: str | None) -> Disaggregated:
    """``--disaggregated off|on|auto`` (None: off)."""
    text = "off" if value is None else str(value).strip().lower()
    if text not in MODES:
        raise ConfigError(f"--disaggregated {value!r}: one of off, on, auto")
    return text  # type: ignore[return-value]


def parse_pool_tps(text: str | None) -> tuple[int, ...] | None:
    """``--pd-tp 4,8``: the TP sizes a pool instance may have (None: every one that starts)."""
    if text is None:
        return None
    try:
        values = tuple(int(p) for p in str(text).split(",") if p.strip())
    except ValueError:
        raise ConfigError(f"--pd-tp {text!r}: powers of two like 4,8") from None
    if not values or len(set(values)) != len(values) or any(
            v < 1 or v > MAX_TP or v & (v - 1) for v in values):
        raise ConfigError(f"--pd-tp {text!r}: distinct powers of two from 1 to {MAX_TP}")
    return values


def parse_layout_label(label: str) -> PDLayout:
    """:func:`layout_label` reversed; a bad label raises a one-line ConfigError."""
    parts = str(label).split(",")
    hw = None
    if len(parts) == 4 and parts[3].startswith("prefill_hardware="):
        hw = parts.pop().removeprefix("prefill_hardware=") or None
    try:
        counts, p_tp, d_tp = parts
        p, d = (int(x) for x in counts.split(":"))
        ptp = int(p_tp.removeprefix("prefill_tp="))
        dtp = int(d_tp.removeprefix("decode_tp="))
    except ValueError:
        raise ConfigError(f"pd.layout {label!r}: expected P:D,prefill_tp=T,decode_tp=T"
                          "[,prefill_hardware=NAME]") from None
    if min(p, d, ptp, dtp) < 1:
        raise ConfigError(f"pd.layout {label!r}: every count must be >= 1")
    return PDLayout(num_prefill=p, num_decode=d, prefill_tp=ptp, decode_tp=dtp,
                    prefill_hardware=hw)


def parse_prefill_hardware(text: str | None) -> tuple[str, ...] | None:
    """``--pd-prefill-hardware mi355x,mi300x``: the presets the prefill pool may run on
    (None: the target's ``--hardware`` only). An unknown preset is a one-line error."""
    if text is None:
        return None
    names = tuple(n.strip().lower() for n in str(text).split(",") if n.strip())
    if not names or len(set(names)) != len(names):
        raise ConfigError(f"--pd-prefill-hardware {text!r}: distinct hardware presets, "
                          "e.g. mi355x,mi300x")
    from tuner.perf.presets import list_hardware

    known = list_hardware()
    bad = [n for n in names if n not in known]
    if bad:
        raise ConfigError(f"--pd-prefill-hardware {bad[0]!r}: one of {', '.join(known)}")
    return names


def layout_gpus(layout: PDLayout) -> int:
    """GPUs of both pools: ``P*p + D*d``."""
    return layout.num_prefill * int(layout.prefill_tp or 1) + \
        layout.num_decode * int(layout.decode_tp or 1)


def pd_layouts(target: Any, budget: int, *, pool_tps: Sequence[int] | None = None,
               fill: PDFill = "full", prefill_hardware: Sequence[str] | None = None
               ) -> tuple[list[PDLayout], list[str]]:
    """Every P/D layout of ``budget`` GPUs for ``target``'s model and hardware.

    ``fill``: ``full`` keeps the layouts that use every GPU (``P*p + D*d == budget``, as
    every aggregated split of the budget does); ``up-to`` every one that fits
    (``<= budget``). Why ``full`` by default: throughput per GPU of a trace's fixed traffic
    is inversely proportional to the GPUs used wherever the layout keeps up, so a P/D
    layout on fewer GPUs than the aggregated splits would "win" at light load for using
    fewer GPUs, not for splitting prefill from decode.

    A pool's TP must pass vLLM's shape rules and fit one instance's weights with room for
    a ``max_model_len`` sequence (:func:`tuner.perf.deployment.split_refusal`, the
    target's resolution at that TP, as :func:`gpu_splits` checks a split), on the pool's
    own hardware. The decode pool is the target's hardware; the prefill pool is each of
    ``prefill_hardware`` (``--pd-prefill-hardware``: mixed pools, e.g. MI355X prefill with
    MI300X decode; None: the target's hardware only). Every GPU counts one in the budget
    and in throughput per GPU, whatever its kind.

    Returns:
        (layouts sorted by GPUs descending, then prefill share ascending; notes for the TPs
        refused, with vLLM's reason).

    Raises:
        ConfigError: no TP starts, or no layout fits the budget.
    """
    from tuner.perf.presets import load_model

    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 2:
        raise ConfigError(f"--gpu-budget {budget!r}: a P/D layout needs at least 2 GPUs")
    model = load_model(target.model)
    notes: list[str] = []
    candidates = tuple(pool_tps or tuple(t for t in (1, 2, 4, 8) if t < budget))
    d_tps = _pool_tps(target, target.hardware, model, candidates, notes, "decode")
    kinds = tuple(prefill_hardware or (target.hardware,))
    p_tps = {hw: (d_tps if hw == target.hardware.lower() else
                  _pool_tps(target, hw, model, candidates, notes, "prefill"))
             for hw in (k.lower() for k in kinds)}
    layouts = [PDLayout(num_prefill=P, num_decode=D, prefill_tp=p, decode_tp=d,
                        prefill_hardware=None if hw == target.hardware.lower() else hw)
               for hw, tps in p_tps.items() for p in tps for d in d_tps
               for P in range(1, budget // p + 1)
               for D in range(1, (budget - P * p) // d + 1)
               if fill == "up-to" or P * p + D * d == budget]
    if not layouts:
        tps = sorted(set(d_tps).union(*p_tps.values()))
        raise ConfigError(f"--gpu-budget {budget}: no P/D layout of {budget} GPUs ({fill}) runs "
                          f"{target.model} (pool TPs {', '.join(map(str, tps)) or 'none'}; "
                          f"{'; '.join(notes) or 'each pool needs one instance'})")
    layouts.sort(key=lambda lay: (-layout_gpus(lay), prefill_share(lay), lay.prefill_tp,
                                  lay.decode_tp, lay.prefill_hardware or ""))
    return layouts, notes


def _pool_tps(target: Any, hardware: str, model: Any, candidates: Sequence[int],
              notes: list[str], role: str) -> list[int]:
    """The TPs of ``candidates`` at which one instance of ``target``'s model starts on
    ``hardware`` (the others noted with vLLM's reason)."""
    from tuner.perf.presets import resolve_target

    same = hardware.lower() == str(target.hardware).lower()
    where = "P/D pool" if same else f"P/D {role} pool on {hardware}"
    tps: list[int] = []
    for tp in candidates:
        why = split_refusal(model, Split(tp))
        if why is None:
            try:
                resolve_target(dataclasses.replace(
                    target, hardware=hardware, tp=tp, dp=1, replicas=1,
                    num_gpu_blocks=_blocks_at(target, tp)))
            except ConfigError as exc:
                why = str(exc)
        (notes.append(f"{where} TP{tp} excluded: {why}") if why else tps.append(tp))
    return tps


def _blocks_at(target: Any, tp: int) -> int | None:
    """A ``num_gpu_blocks`` override scaled to ``tp`` (as ``Deployment.apply`` does)."""
    blocks = target.num_gpu_blocks
    return None if blocks is None else max(2, int(blocks * tp / target.tp))


def prefill_share(layout: PDLayout) -> Fraction:
    return Fraction(layout.num_prefill * int(layout.prefill_tp or 1), layout_gpus(layout))


def gpu_ratio(layout: PDLayout) -> str:
    """Prefill GPUs : decode GPUs in lowest terms: ``1:3`` for 1 x TP4 : 3 x TP4."""
    p = layout.num_prefill * int(layout.prefill_tp or 1)
    d = layout.num_decode * int(layout.decode_tp or 1)
    g = math.gcd(p, d)
    return f"{p // g}:{d // g}"


def with_pd(space: SearchSpace, aggregated: SearchSpace, target: Any, *, mode: Disaggregated,
            gpu_budget: int | None, pool_tps: Sequence[int] | None = None,
            routers: Sequence[str] | None = None, fill: PDFill = "full",
            prefill_hardware: Sequence[str] | None = None,
            transfer_modes: Sequence[str] | None = None) -> tuple[SearchSpace, list[str]]:
    """The study's space under ``--disaggregated mode``, and notes.

    ``space``: the scheduler space; ``aggregated``: it with the aggregated deployment
    dimensions (``tuner.tune.deployment_space.with_deployment``). ``off`` returns
    ``aggregated`` untouched.

    ``transfer_modes`` (``--pd-transfer-modes``): vLLM's ``transfer_mode`` values the
    P/D points may take (None: pull only, vLLM's default, with no dimension).

    Raises:
        ConfigError: ``on``/``auto`` without ``--gpu-budget``, an unknown proxy policy or
            transfer mode, ``--pd-tp`` without ``on``/``auto``.
    """
    if fill not in ("full", "up-to"):
        raise ConfigError(f"--pd-gpus {fill!r}: full or up-to")
    if mode == "off":
        if (pool_tps is not None or fill != "full" or prefill_hardware is not None
                or transfer_modes is not None):
            raise ConfigError("--pd-tp/--pd-gpus/--pd-prefill-hardware/--pd-transfer-modes "
                              "shape the P/D layouts: add --disaggregated on or auto")
        return aggregated, []
    if gpu_budget is None:
        raise ConfigError(f"--disaggregated {mode} searches P/D layouts of a GPU budget: "
                          "add --gpu-budget N")
    if getattr(target, "kv_offloading_size", None) is not None:
        raise ConfigError("--disaggregated with --kv-offloading-size: the P/D replay does not "
                          "model the CPU tier yet; drop one of them")
    proxies = tuple(routers or PD_ROUTERS)
    bad = [r for r in proxies if r not in PD_ROUTERS]
    if bad:
        raise ConfigError(f"P/D proxy {bad[0]!r}: the P/D replay runs {', '.join(PD_ROUTERS)}")
    layouts, notes = pd_layouts(target, gpu_budget, pool_tps=pool_tps, fill=fill,
                                prefill_hardware=prefill_hardware)
    notes.append(f"P/D layouts searched: {len(layouts)} of "
                 f"{'exactly' if fill == 'full' else 'at most'} {gpu_budget} GPUs "
                 f"(--disaggregated {mode})")
    when: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    extra: list[Param] = []
    agg_params = aggregated.params[len(space.params):]
    if mode == "auto":
        extra.append(Param(PD_MODE, "categorical", choices=(AGGREGATED, DISAGGREGATED)))
        on_agg = ((PD_MODE, (AGGREGATED,)),)
        extra += [dataclasses.replace(p, when=on_agg + p.when) for p in agg_params]
        when = ((PD_MODE, (DISAGGREGATED,)),)
    extra.append(Param(PD_LAYOUT, "categorical", choices=tuple(map(layout_label, layouts)),
                       when=when))
    extra.append(Param(PD_ROUTER, "categorical", choices=proxies, when=when))
    extra += prefill_limit_params(when)
    extra += transfer_mode_params(transfer_modes, when)
    name = f"{aggregated.name}+pd" if mode == "auto" else f"{space.name}+pd{gpu_budget}"
    return SearchSpace(name, space.params + tuple(extra)), notes


def prefill_limit_params(when: tuple[tuple[str, tuple[Any, ...]], ...] = ()
                         ) -> list[Param]:
    """The prefill pool's own ``max_num_batched_tokens`` and ``max_num_seqs``.

    Why searched per pool: a prefill instance only prefills (every request reaches it
    with ``max_tokens=1``), so its token budget trades TTFT (a long prompt in fewer,
    larger chunks) against nothing a decoder feels, and its running limit bounds the
    concurrent prefills and the blocks they hold until the decoder reads them; the
    trial's own two fields then act on the decode pool, where they bound the decode batch.
    The ranges: the token budget as the scheduler space's (512..65536 would allow chunks
    smaller than a prefill instance ever wants; 2048 is vLLM's own default), the running
    limit 8..512 (a prefill-only batch of more than a few hundred prompts is KV-bound
    long before); every pair passes vLLM's ``max_num_batched_tokens >= max_num_seqs``."""
    return [Param(PD_PREFILL_BATCHED_TOKENS, "int", low=2048, high=65536, log=True,
                  when=when),
            Param(PD_PREFILL_SEQS, "categorical", choices=(8, 16, 32, 64, 128, 256, 512),
                  when=when)]


def transfer_mode_params(modes: Sequence[str] | None,
                         when: tuple[tuple[str, tuple[Any, ...]], ...] = ()) -> list[Param]:
    """``pd.transfer_mode`` over ``modes`` (none when None: every P/D point pulls).

    Why a dimension and not a fixed choice: the two modes move the same bytes over the
    same link, but push registers the decoder's blocks first (one link latency before
    the prefill instance writes) and keeps the prefill engine stepping while it writes
    (``tuner.sim.disagg.nixl_push``), while pull starts the read at the decoder's own
    admission, so it waits for a free decode slot and blocks; which one gives the lower
    TTFT depends on how full the decoder runs on this trace. Only opt-in
    (``--pd-transfer-modes pull,push``): pull is vLLM's default connector, and a
    dimension that rarely moves the front costs trials."""
    if modes is None:
        return []
    chosen = tuple(dict.fromkeys(modes))
    bad = [m for m in chosen if m not in TRANSFER_MODES]
    if bad or not chosen:
        raise ConfigError(f"--pd-transfer-modes {bad[0] if bad else ''!r}: "
                          f"{' or '.join(TRANSFER_MODES)} (vLLM's transfer_mode)")
    return [Param(PD_TRANSFER_MODE, "categorical", choices=chosen, when=when)]


def pd_deployment_for(params: dict[str, Any]) -> Deployment | None:
    """The P/D deployment a point's parameters draw (None: the point is aggregated)."""
    if params.get(PD_MODE) == AGGREGATED or PD_LAYOUT not in params:
        return None
    router = str(params.get(PD_ROUTER, PD_ROUTERS[0]))
    limits = {key[len("pd."):]: int(params[key])
              for key in (PD_PREFILL_BATCHED_TOKENS, PD_PREFILL_SEQS) if key in params}
    mode = str(params.get(PD_TRANSFER_MODE, "pull"))
    layout = dataclasses.replace(parse_layout_label(str(params[PD_LAYOUT])), router=router,
                                 transfer_mode=mode, **limits)
    return Deployment(Split(int(layout.decode_tp or 1)), None, pd=layout, pd_router=router)


def check_pd_inputs(mode: Disaggregated, *, speculative: Any, kv_sizes: Any,
                    backend: str) -> None:
    """What a P/D search cannot combine with (the P/D replay's limits)."""
    if mode == "off":
        return
    if speculative is not None:
        raise ConfigError(f"--disaggregated {mode} with --speculative-config: the P/D replay "
                          "does not model speculative decoding yet; drop one of them")
    if kv_sizes is not None:
        raise ConfigError(f"--disaggregated {mode} with --kv-offloading-sizes: the P/D replay "
                          "does not model the CPU tier yet; drop one of them")
    if backend != "sim":
        raise ConfigError(f"--disaggregated {mode} replays on the sim backend (--backend sim)")


__all__ = ["AGGREGATED", "DISAGGREGATED", "MODES", "PD_LAYOUT", "PD_MODE", "PD_PARAMS",
           "PD_ROUTER", "PD_ROUTERS", "PDFill", "check_pd_inputs", "gpu_ratio", "layout_gpus",
           "layout_label", "parse_disaggregated", "parse_layout_label", "parse_pool_tps",
           "parse_prefill_hardware", "transfer_mode_params",
           "pd_deployment_for", "pd_layouts", "prefill_share", "with_pd"]
