"""Service-level objectives as ``vllm bench serve --goodput`` states and counts them."""

from __future__ import annotations

import math
from typing import Sequence

from tuner.errors import ConfigError
from tuner.records import RequestResult

#: SLO keys of ``vllm bench serve --goodput`` (values in milliseconds).
SLO_KEYS = ("ttft", "tpot", "e2el")


def parse_slo(text: "str | dict[str, float] | None") -> dict[str, float]:
    """``"ttft:2000,tpot:50"`` (or ``vllm bench serve``'s space-separated form) -> ms by key.

    Raises:
        ConfigError: an unknown key, a missing or negative value, a key given twice.
    """
    if text is None:
        return {}
    if isinstance(text, dict):
        items = [(str(k), v) for k, v in text.items()]
    else:
        items = []
        for part in str(text).replace(",", " ").split():
            key, sep, value = part.partition(":")
            if not sep:
                raise ConfigError(f"SLO {part!r}: write KEY:MILLISECONDS, e.g. ttft:2000")
            items.append((key.strip(), value.strip()))
    out: dict[str, float] = {}
    for key, value in items:
        if key not in SLO_KEYS:
            raise ConfigError(f"SLO {key!r}: use {', '.join(SLO_KEYS)} (as vllm bench serve "
                              "--goodput)")
        if key in out:
            raise ConfigError(f"SLO {key!r} given twice")
        try:
            ms = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"SLO {key}:{value}: {value!r} is not a number of "
                              "milliseconds") from None
        if not (math.isfinite(ms) and ms >= 0):
            raise ConfigError(f"SLO {key}:{value}: must be a number of milliseconds >= 0")
        out[key] = ms
    return out


def good_requests(requests: Sequence[RequestResult], slo_ms: dict[str, float]) -> int:
    """Finished requests meeting every SLO, as ``vllm bench serve --goodput`` counts them:
    TTFT and E2E latency from arrival, TPOT = (E2E - TTFT) / (output tokens - 1), taken as
    0 for a one-token output; a request is good when each value <= its SLO."""
    good = 0
    for r in requests:
        if r.status != "finished":
            continue
        ttft = r.first_token_s - r.arrival_s
        e2el = r.finish_s - r.arrival_s
        tpot = (e2el - ttft) / (r.output_len - 1) if r.output_len > 1 else 0.0
        values = {"ttft": ttft, "tpot": tpot, "e2el": e2el}
        if all(values[k] * 1e3 <= bound for k, bound in slo_ms.items()):
            good += 1
    return good
