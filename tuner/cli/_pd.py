"""The disaggregated prefill/decode flags (``--pd P:D`` and friends) of replay-like
commands, as one :class:`PDFlags` (docs/disaggregation.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from tuner.errors import ConfigError

if TYPE_CHECKING:
    from tuner.perf.pd_link import PDLayout

__all__ = ["PDFlags", "pd_options", "pd_serve_lines"]


@dataclass(frozen=True)
class PDFlags:
    """The P/D flags as given (None: not given)."""

    pd: str | None = None  # --pd P:D
    prefill_tp: int | None = None  # --prefill-tp
    decode_tp: int | None = None  # --decode-tp
    prefill_hardware: str | None = None  # --prefill-hardware
    pd_link: str | None = None  # --pd-link
    serve: bool = False  # --pd-serve: print the per-instance vllm serve commands
    check_python: str | None = None  # --pd-check-vllm PYTHON
    pd_router: str | None = None  # --pd-router (None: vllm-proxy)
    prefill_max_num_batched_tokens: int | None = None  # --prefill-max-num-batched-tokens
    prefill_max_num_seqs: int | None = None  # --prefill-max-num-seqs
    transfer_mode: str | None = None  # --pd-transfer-mode (None: pull)

    def layout(self) -> "PDLayout | None":
        """The ``PDLayout`` (None without ``--pd``); a pool flag without ``--pd`` is an
        error that names the missing flag."""
        from tuner.perf.pd_link import PDLayout, parse_pd

        if self.pd is None:
            given = [name for name, value in (
                ("--prefill-tp", self.prefill_tp), ("--decode-tp", self.decode_tp),
                ("--prefill-hardware", self.prefill_hardware), ("--pd-link", self.pd_link),
                ("--pd-router", self.pd_router),
                ("--prefill-max-num-batched-tokens", self.prefill_max_num_batched_tokens),
                ("--prefill-max-num-seqs", self.prefill_max_num_seqs),
                ("--pd-transfer-mode", self.transfer_mode))
                if value is not None]
            if self.serve or self.check_python:
                given.append("--pd-serve / --pd-check-vllm")
            if given:
                raise ConfigError(f"{given[0]} applies to a disaggregated deployment only; "
                                  "add --pd PREFILL:DECODE (e.g. --pd 1:3)")
            return None
        p, d = parse_pd(self.pd)
        return PDLayout(num_prefill=p, num_decode=d, prefill_tp=self.prefill_tp,
                        decode_tp=self.decode_tp, prefill_hardware=self.prefill_hardware,
                        link=self.pd_link or "auto",  # type: ignore[arg-type]
                        router=self.pd_router or "vllm-proxy",
                        prefill_max_num_batched_tokens=self.prefill_max_num_batched_tokens,
                        prefill_max_num_seqs=self.prefill_max_num_seqs,
                        transfer_mode=self.transfer_mode or "pull")


def pd_options(func: Any) -> Any:
    """Add the P/D flags; the command gets them as ``pd_flags`` (a :class:`PDFlags`)."""
    import functools

    opts = [
        click.option("--pd", "pd", default=None, metavar="P:D",
                     help="Disaggregated prefill/decode: P prefill and D decode instances "
                          "(vLLM's NixlConnector behind its example proxy), e.g. --pd 1:3 "
                          "[default: aggregated]."),
        click.option("--prefill-tp", type=click.IntRange(min=1), default=None,
                     help="With --pd: TP of each prefill instance [default: --tp]."),
        click.option("--decode-tp", type=click.IntRange(min=1), default=None,
                     help="With --pd: TP of each decode instance [default: --tp]."),
        click.option("--prefill-hardware", default=None,
                     help="With --pd: the prefill pool's hardware preset, for mixed pools "
                          "(e.g. mi355x prefill with --hardware mi300x decode) "
                          "[default: --hardware]."),
        click.option("--pd-serve", "serve", is_flag=True, default=False,
                     help="With --pd: print one `vllm serve` per pool instance with its "
                          "--kv-transfer-config (NixlConnector on NVIDIA, MoRIIOConnector "
                          "on AMD) and vLLM's example proxy."),
        click.option("--pd-check-vllm", "check_python", default=None, metavar="PYTHON",
                     help="With --pd: parse those commands with the vLLM at PYTHON (its "
                          "EngineArgs parser and KVTransferConfig); exit 1 if it refuses."),
        click.option("--pd-link", type=click.Choice(["auto", "same-node", "cross-node"]),
                     default=None,
                     help="With --pd: the link the KV crosses: same-node (xGMI / NVLink), "
                          "cross-node (one 400 Gb/s NIC per GPU) [default: auto = "
                          "same-node when one GPU type fits on one 8-GPU node]."),
        click.option("--pd-router", "pd_router",
                     type=click.Choice(["vllm-proxy", "llm-d", "dynamo"]), default=None,
                     help="With --pd: the proxy's prefill/decode choices: vllm-proxy "
                          "(vLLM's example proxy, round robin), llm-d (its P/D scheduler: "
                          "prefix-cache + queue scorers, decode picked first), dynamo "
                          "(its KV router per pool) [default: vllm-proxy]."),
        click.option("--prefill-max-num-batched-tokens", type=click.IntRange(min=1),
                     default=None,
                     help="With --pd: the prefill instances' own --max-num-batched-tokens "
                          "(the chunk a long prompt is cut into) [default: "
                          "--max-num-batched-tokens]."),
        click.option("--prefill-max-num-seqs", type=click.IntRange(min=1), default=None,
                     help="With --pd: the prefill instances' own --max-num-seqs (concurrent "
                          "prefills) [default: --max-num-seqs]."),
        click.option("--pd-transfer-mode", "transfer_mode",
                     type=click.Choice(["pull", "push"]), default=None,
                     help="With --pd: who moves the KV (vLLM's transfer_mode): pull (the "
                          "decoder READs, NixlConnector) or push (the prefill instance "
                          "WRITEs after the decoder registers its blocks, "
                          "NixlPushConnector) [default: pull]."),
    ]
    names = ("pd", "prefill_tp", "decode_tp", "prefill_hardware", "pd_link", "serve",
             "check_python", "pd_router", "prefill_max_num_batched_tokens",
             "prefill_max_num_seqs", "transfer_mode")

    @functools.wraps(func)
    def with_flags(*args: Any, **kwargs: Any) -> Any:
        flags = PDFlags(**{name: kwargs.pop(name) for name in names})
        return func(*args, pd_flags=flags, **kwargs)

    for opt in reversed(opts):
        with_flags = opt(with_flags)
    return with_flags


def pd_serve_lines(flags: PDFlags, layout: "PDLayout", resolved: Any,
                   settings: Any) -> tuple[list[str], bool]:
    """The serve commands (and the vLLM check's verdict) as lines; False if the check
    failed."""
    from tuner.perf.pd_link import pd_link
    from tuner.profile.pd_export import pd_serve_commands, router_config
    from tuner.profile.vllm_check import check_pd_with_vllm
    from tuner.replay import pd_pools

    from tuner.replay import prefill_settings

    prefill, decode = pd_pools(layout, resolved, settings)
    num_gpus = layout.num_prefill * prefill.tp + layout.num_decode * decode.tp
    link = pd_link(prefill.hardware.name, decode.hardware.name, num_gpus, layout.link)
    own = prefill_settings(layout, settings)
    commands = pd_serve_commands(
        num_prefill=layout.num_prefill, num_decode=layout.num_decode,
        prefill_tp=prefill.tp, decode_tp=decode.tp, prefill_vendor=prefill.hardware.vendor,
        decode_vendor=decode.hardware.vendor, same_node="NIC" not in link.name,
        transfer_mode=layout.transfer_mode,
        extra_args=("--max-num-batched-tokens", str(settings.max_num_batched_tokens),
                    "--max-num-seqs", str(settings.max_num_seqs)),
        prefill_extra_args=("--max-num-batched-tokens", str(own.max_num_batched_tokens),
                            "--max-num-seqs", str(own.max_num_seqs)))
    model = resolved.model.name
    lines = [f"# {c.role} {c.instance} on {c.host}\n{c.command(model)}" for c in commands]
    title, text = router_config(layout.router, commands, block_size=decode.cache.block_size)
    lines.append(f"# {title}\n{text}")
    ok = True
    if flags.check_python is not None:
        check = check_pd_with_vllm(commands, python=flags.check_python)
        ok = check.status != "failed"
        lines.append(f"vLLM {check.vllm_version or '?'} check: {check.status}"
                     + (f" ({'; '.join(check.errors)})" if check.errors else
                        f" ({', '.join(check.checked)} parsed)" if check.checked else ""))
    return lines, ok
