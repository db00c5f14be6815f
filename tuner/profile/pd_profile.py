"""A profile whose pick is a disaggregated prefill/decode layout (``target.disaggregation``,
written by a ``tune --disaggregated on|auto`` study): its serve commands and their check.

Why its own module: a P/D profile deploys as one ``vllm serve`` per pool instance with its
``--kv-transfer-config`` (:mod:`tuner.profile.pd_export`, the same commands ``replay
--pd-serve`` prints) and vLLM's example proxy in front, not as one command or a fleet of
identical replicas; every instance carries the profile's scheduler flags, as the study
replayed both pools with one set of settings, except the prefill pool's own token budget
and running limit where the pick has them (``prefill_max_num_batched_tokens``,
``prefill_max_num_seqs``). ``tuner export --format flags`` prints them
(``--format router`` the proxy alone) and ``--check-vllm`` parses every command with vLLM's
own ``EngineArgs`` parser and ``KVTransferConfig`` (``tuner.profile.vllm_check.
check_pd_with_vllm`` over :func:`pd_commands`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.profile.model import Profile
    from tuner.profile.pd_export import PDServeCommand

__all__ = ["is_pd_profile", "pd_commands", "pd_flags_text", "pd_gpus", "pd_proxy_text"]


def pd_gpus(raw: dict[str, Any]) -> int:
    """GPUs of both pools of a ``disaggregation`` section: ``P*p + D*d``."""
    return (int(raw["num_prefill"]) * int(raw["prefill_tp"])
            + int(raw["num_decode"]) * int(raw["decode_tp"]))


def is_pd_profile(profile: "Profile") -> bool:
    return profile.target.disaggregation is not None


def pd_commands(profile: "Profile", scheduler_args: list[str]) -> list["PDServeCommand"]:
    """One server per pool instance, prefill first, each with ``scheduler_args`` (the
    profile's other serve flags; its ``--tensor-parallel-size`` is the pool's)."""
    from tuner.perf.hardware import load_hardware
    from tuner.perf.pd_link import pd_link
    from tuner.profile.pd_export import pd_serve_commands

    raw = profile.target.disaggregation
    assert raw is not None, "pd_commands() on an aggregated profile"
    decode_hw = profile.target.hardware
    prefill_hw = raw.get("prefill_hardware") or decode_hw
    link = pd_link(load_hardware(prefill_hw).name, load_hardware(decode_hw).name,
                   pd_gpus(raw), raw.get("link") or "auto")
    return pd_serve_commands(
        num_prefill=int(raw["num_prefill"]), num_decode=int(raw["num_decode"]),
        prefill_tp=int(raw["prefill_tp"]), decode_tp=int(raw["decode_tp"]),
        prefill_vendor=load_hardware(prefill_hw).vendor,
        decode_vendor=load_hardware(decode_hw).vendor, same_node="NIC" not in link.name,
        extra_args=tuple(_without_tp(scheduler_args)),
        prefill_extra_args=_prefill_args(_without_tp(scheduler_args), raw),
        transfer_mode=str(raw.get("transfer_mode") or "pull"))


def _prefill_args(args: list[str], raw: dict[str, Any]) -> tuple[str, ...] | None:
    """The prefill instances' flags where the pick gave their pool its own limits
    (``prefill_max_num_batched_tokens`` / ``prefill_max_num_seqs``): ``args`` with those
    values (added where ``args`` lacks the flag); None where it gave none."""
    own = {f"--{key.removeprefix('prefill_').replace('_', '-')}": raw[key]
           for key in ("prefill_max_num_batched_tokens", "prefill_max_num_seqs")
           if raw.get(key) is not None}
    if not own:
        return None
    out = list(args)
    for flag, value in own.items():
        if flag in out:
            out[out.index(flag) + 1] = str(value)
        else:
            out += [flag, str(value)]
    return tuple(out)


def _without_tp(args: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(args):
        if args[i] == "--tensor-parallel-size":
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def pd_flags_text(profile: "Profile", serve_args: list[str], header: list[str]) -> str:
    """``--format flags`` of a P/D profile: each instance's ``vllm serve``, then the proxy.

    ``serve_args``: ``vllm serve MODEL`` and the profile's flags
    (``tuner.profile.export.serve_command``)."""
    raw = profile.target.disaggregation or {}
    model = serve_args[2]
    commands = pd_commands(profile, serve_args[3:])
    lines = [f"# {h}" for h in header]
    lines.append(f"# disaggregated: {raw.get('num_prefill')} prefill x TP{raw.get('prefill_tp')}"
                 f" and {raw.get('num_decode')} decode x TP{raw.get('decode_tp')} "
                 f"({pd_gpus(raw)} GPU), proxy {_router(raw)}; replace "
                 "the PREFILL_HOST_i / DECODE_HOST_j placeholders")
    for c in commands:
        lines.append(f"# {c.role} {c.instance} on {c.host}")
        lines.append(c.command(model))
    title, text = _proxy(profile, commands)
    lines.append(f"# {title}\n{text}")
    return "\n".join(lines) + "\n"


def pd_proxy_text(profile: "Profile", serve_args: list[str]) -> str:
    """``--format router`` of a P/D profile: the proxy's (or router's) configuration alone."""
    return _proxy(profile, pd_commands(profile, serve_args[3:]))[1] + "\n"


def _router(raw: dict[str, Any]) -> str:
    """The pick's P/D router (``tuner.sim.disagg.routers.PD_ROUTERS``; vLLM's proxy when
    the section names none)."""
    return str(raw.get("router") or "vllm-proxy")


def _proxy(profile: "Profile", commands: list["PDServeCommand"]) -> tuple[str, str]:
    """``(title, text)`` of the router in front of the pools, as ``replay --pd-serve``
    prints it (``tuner.profile.pd_export.router_config``)."""
    from tuner.profile.pd_export import router_config

    raw = profile.target.disaggregation or {}
    return router_config(_router(raw), commands, block_size=profile.target.block_size or 16)  # 16: vLLM's default block size
