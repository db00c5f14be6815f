"""The sim backend's disaggregated replay: a ``PDLayout`` and the main target resolved
into the two pools' engines (``tuner.sim.disagg.simulator.PDSimulator``).

The main target (``--hardware``, ``--tp``, the model, the KV and dtype flags) is the
decode pool; ``--prefill-tp`` and ``--prefill-hardware`` change the prefill pool's copy
of it. Both pools run the same scheduler settings and scheduling mode (vLLM's example
serves both roles with one set of flags plus ``--kv-transfer-config``), except where the
layout gives the prefill pool its own token budget or running limit
(``--prefill-max-num-batched-tokens``, ``--prefill-max-num-seqs``: :func:`prefill_settings`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from tuner.errors import ConfigError

if TYPE_CHECKING:
    from tuner.perf.pd_link import PDLayout
    from tuner.perf.presets import ResolvedTarget
    from tuner.sim.settings import SchedulerSettings, SimOptions

__all__ = ["pd_pools", "pd_simulator", "prefill_settings"]


def prefill_settings(layout: "PDLayout", settings: "SchedulerSettings") -> "SchedulerSettings":
    """The prefill pool's scheduler settings: ``settings`` with the layout's prefill-only
    limits; a combination vLLM refuses (``max_num_batched_tokens < max_num_seqs``) is a
    one-line ConfigError naming the prefill flags."""
    overrides = layout.prefill_overrides()
    if not overrides:
        return settings
    out = dataclasses.replace(settings, **overrides)
    try:
        out.validate()
    except ConfigError as exc:
        raise ConfigError(f"the prefill pool's settings (--prefill-max-num-batched-tokens / "
                          f"--prefill-max-num-seqs): {exc}") from None
    return out


def pd_pools(layout: "PDLayout", resolved: "ResolvedTarget",
             settings: "SchedulerSettings | None" = None
             ) -> tuple["ResolvedTarget", "ResolvedTarget"]:
    """``(prefill, decode)`` resolved targets for ``layout`` on ``resolved``'s target."""
    from tuner.perf.presets import resolve_target

    target = resolved.target
    if target.num_engines > 1:
        raise ConfigError("--pd with --dp or --replicas > 1: each pool instance is one TP "
                          "group here; give the instance counts in --pd P:D")
    if target.kv_offloading_size is not None:
        raise ConfigError("--pd with --kv-offloading-size is not modelled yet: replay one "
                          "or the other")
    decode = resolve_target(dataclasses.replace(target, tp=layout.decode_tp or target.tp),
                            scheduler_settings=settings)
    prefill = resolve_target(dataclasses.replace(
        target, tp=layout.prefill_tp or target.tp,
        hardware=layout.prefill_hardware or target.hardware),
        scheduler_settings=None if settings is None else prefill_settings(layout, settings))
    return prefill, decode


def pd_simulator(requests: Any, settings: "SchedulerSettings", resolved: "ResolvedTarget",
                 load: Any, options: "SimOptions", layout: "PDLayout") -> Any:
    """A ready ``PDSimulator`` for ``layout`` (see the module doc)."""
    from tuner.perf.pd_link import pd_settings
    from tuner.sim.disagg.simulator import PDPool, PDSimulator

    prefill, decode = pd_pools(layout, resolved, settings)
    pd = pd_settings(layout, prefill, decode)
    return PDSimulator(requests, PDPool(prefill_settings(layout, settings), prefill.cache,
                                        prefill.step_time),
                       PDPool(settings, decode.cache, decode.step_time), pd,
                       options=options, load=load,
                       num_hash_ids=getattr(requests, "num_hash_ids", None))
