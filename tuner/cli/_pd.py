"""The disaggregated prefill/decode flags (``--pd P:D`` and friends) of replay-like
commands, as one :class:`PDFlags` (docs/disaggregation.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from tuner.errors import ConfigError

if TYPE_CHECKING:
    from tuner.perf.pd_link import PDLayout

__all__ = ["PDFlags", "pd_options"]


@dataclass(frozen=True)
class PDFlags:
    """The P/D flags as given (None: not given)."""

    pd: str | None = None  # --pd P:D
    prefill_tp: int | None = None  # --prefill-tp
    decode_tp: int | None = None  # --decode-tp
    prefill_hardware: str | None = None  # --prefill-hardware
    pd_link: str | None = None  # --pd-link

    def layout(self) -> "PDLayout | None":
        """The ``PDLayout`` (None without ``--pd``); a pool flag without ``--pd`` is an
        error that names the missing flag."""
        from tuner.perf.pd_link import PDLayout, parse_pd

        if self.pd is None:
            given = [name for name, value in (
                ("--prefill-tp", self.prefill_tp), ("--decode-tp", self.decode_tp),
                ("--prefill-hardware", self.prefill_hardware), ("--pd-link", self.pd_link))
                if value is not None]
            if given:
                raise ConfigError(f"{given[0]} applies to a disaggregated deployment only; "
                                  "add --pd PREFILL:DECODE (e.g. --pd 1:3)")
            return None
        p, d = parse_pd(self.pd)
        return PDLayout(num_prefill=p, num_decode=d, prefill_tp=self.prefill_tp,
                        decode_tp=self.decode_tp, prefill_hardware=self.prefill_hardware,
                        link=self.pd_link or "auto")  # type: ignore[arg-type]


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
        click.option("--pd-link", type=click.Choice(["auto", "same-node", "cross-node"]),
                     default=None,
                     help="With --pd: the link the KV crosses: same-node (xGMI / NVLink), "
                          "cross-node (one 400 Gb/s NIC per GPU) [default: auto = "
                          "same-node when one GPU type fits on one 8-GPU node]."),
    ]
    names = ("pd", "prefill_tp", "decode_tp", "prefill_hardware", "pd_link")

    @functools.wraps(func)
    def with_flags(*args: Any, **kwargs: Any) -> Any:
        flags = PDFlags(**{name: kwargs.pop(name) for name in names})
        return func(*args, pd_flags=flags, **kwargs)

    for opt in reversed(opts):
        with_flags = opt(with_flags)
    return with_flags
