"""Measured speculative-decoding acceptance, read from what a vLLM server writes.

Two sources, both vLLM 0.33.0 (v1/spec_decode/metrics.py):

* the server log's ``SpecDecoding metrics`` lines (``SpecDecodingLogging.log``, line 121):
  ``Mean acceptance length: %.2f, ... Accepted: %d tokens, Drafted: %d tokens,
  Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%``, one per logging
  interval. Every line is summed: the drafts of an interval are ``Drafted / k`` (each
  draft carries ``k`` tokens, ``k`` = the number of per-position rates), so the
  per-position rates are weighted by drafts, and the mean acceptance length is
  ``1 + sum(Accepted) / sum(drafts)``, as the server would print it over the whole log;
* a ``/metrics`` scrape (Prometheus text): the counters ``vllm:spec_decode_num_drafts``,
  ``_num_draft_tokens``, ``_num_accepted_tokens`` (``_total`` suffixed) and
  ``vllm:spec_decode_num_accepted_tokens_per_pos{position="i"}``, summed over engines;
  two scrapes give the counts between them (after minus before).

The result, :class:`SpecAcceptance`, goes into the trace metadata at ingest
(``tuner ingest --spec-metrics FILE``) and is the replay's acceptance when neither
``--spec-acceptance`` nor the config's ``synthetic_acceptance_*`` gives one. Bad input is
a one-line ``TraceFormatError`` naming the file, the line and the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import TraceFormatError

#: The marker of vLLM's log line (v1/spec_decode/metrics.py:121).
LOG_MARKER = "SpecDecoding metrics:"
#: The Prometheus counters (metrics.py, ``SpecDecodingProm``), without ``_total``.
PROM_DRAFTS = "vllm:spec_decode_num_drafts"
PROM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
PROM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PROM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

_LOG_FIELDS = {
    "Mean acceptance length": r"Mean acceptance length: (?P<v>[^,]+),",
    "Accepted": r"Accepted: (?P<v>[^ ,]+) tokens",
    "Drafted": r"Drafted: (?P<v>[^ ,]+) tokens",
    "Per-position acceptance rate": r"Per-position acceptance rate: (?P<v>.*?), Avg Draft",
}
_PROM_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?"
                        r"\s+(?P<value>\S+)(?:\s+\S+)?$")
_POSITION = re.compile(r'position="(?P<p>[^"]*)"')


@dataclass(frozen=True, slots=True)
class SpecAcceptance:
    """Speculative-decoding counters of a serving period (vLLM's ``SpecDecodingStats``
    summed), and where they came from."""

    num_drafts: float  # verifies (draft lists checked); from a log: Drafted / k, summed
    num_draft_tokens: float  # draft tokens proposed (>= num_drafts)
    num_accepted_tokens: float  # draft tokens accepted (<= num_draft_tokens)
    accepted_per_pos: tuple[float, ...]  # accepted drafts at position i (non-increasing)
    source: str  # "server log FILE (N lines)" or "metrics FILE[, FILE]"

    @property
    def rates(self) -> tuple[float, ...]:
        """Per-position unconditional rates ``P(accepted >= i)`` (the log's convention)."""
        d = self.num_drafts
        return tuple(round(a / d, 6) for a in self.accepted_per_pos) if d else ()

    @property
    def mean_acceptance_length(self) -> float:
        """``1 + accepted / drafts``, bonus token included (the log's convention)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def acceptance_text(self) -> str:
        """As ``--spec-acceptance`` takes it: the rates (``0.8,0.6``)."""
        return ",".join(f"{r:g}" for r in self.rates)

    def to_dict(self) -> dict[str, Any]:
        """What the trace metadata stores (``TraceMetadata.spec_acceptance``)."""
        return {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens,
                "accepted_per_pos": list(self.accepted_per_pos), "source": self.source,
                "rates": list(self.rates),
                "mean_acceptance_length": round(self.mean_acceptance_length, 4)}

    @classmethod
    def from_dict(cls, data: Any, where: str = "trace metadata") -> "SpecAcceptance":
        if not isinstance(data, dict):
            raise TraceFormatError(f"{where}: spec_acceptance must be a mapping")
        try:
            out = cls(float(data["num_drafts"]), float(data["num_draft_tokens"]),
                      float(data["num_accepted_tokens"]),
                      tuple(float(v) for v in data["accepted_per_pos"]),
                      str(data.get("source", "?")))
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceFormatError(f"{where}: spec_acceptance: bad or missing field "
                                   f"({exc})") from None
        return out.checked(where)

    def checked(self, where: str) -> "SpecAcceptance":
        """Refuse counts no server could report (one line naming ``where``)."""
        values = (self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens,
                  *self.accepted_per_pos)
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise TraceFormatError(f"{where}: spec-decode counters must be finite and >= 0")
        if not self.num_drafts or not self.accepted_per_pos:
            raise TraceFormatError(f"{where}: no drafts counted (was speculative decoding "
                                   "on while it was recorded?)")
        slack = 1e-6 * max(1.0, self.num_drafts)
        if any(a > self.num_drafts + slack for a in self.accepted_per_pos) or any(
                self.accepted_per_pos[i] > self.accepted_per_pos[i - 1] + slack
                for i in range(1, len(self.accepted_per_pos))):
            raise TraceFormatError(f"{where}: accepted per position must be non-increasing "
                                   "and at most the drafts")
        return self


def read_spec_acceptance(paths: Sequence[str | Path]) -> SpecAcceptance:
    """The acceptance of ``paths``: one server log, or one or two ``/metrics`` scrapes
    (told apart by content: a log has ``SpecDecoding metrics:`` lines)."""
    files = [Path(p) for p in paths]
    if not 1 <= len(files) <= 2:
        raise TraceFormatError("spec metrics: one server log, or one or two /metrics "
                               f"scrapes (before and after), got {len(files)} files")
    texts = []
    for f in files:
        try:
            texts.append(f.read_text(encoding="utf-8", errors="replace"))
        except OSError as exc:
            raise TraceFormatError(f"cannot read ({exc.strerror})", path=str(f)) from None
    if any(LOG_MARKER in t for t in texts):
        if len(files) != 1:
            raise TraceFormatError("spec metrics: give one server log (its lines are summed)",
                                   path=str(files[1]))
        return parse_log(texts[0], str(files[0]))
    counts = [parse_prometheus(t, str(f)) for t, f in zip(texts, files)]
    if len(counts) == 1:
        return check_scrape(counts[0], str(files[0]))
    return _difference(counts[0], counts[1], f"{files[0]}, {files[1]}")


def parse_log(text: str, where: str) -> SpecAcceptance:
    """Sum a server log's ``SpecDecoding metrics`` lines (see the module docstring)."""
    drafts = draft_tokens = accepted = 0.0
    per_pos: list[float] = []
    lines = 0
    for number, line in enumerate(text.splitlines(), 1):
        if LOG_MARKER not in line:
            continue
        fields = _log_fields(line, where, number)
        rates, drafted = fields["Per-position acceptance rate"], fields["Drafted"]
        if per_pos and len(rates) != len(per_pos):
            raise TraceFormatError(f"field 'Per-position acceptance rate': {len(rates)} "
                                   f"positions, earlier lines had {len(per_pos)} (one "
                                   "num_speculative_tokens per log)", path=where, line=number)
        n = drafted / len(rates)
        per_pos = [p + r * n for p, r in zip(per_pos or [0.0] * len(rates), rates)]
        drafts += n
        draft_tokens += drafted
        accepted += fields["Accepted"]
        lines += 1
    if not lines:
        raise TraceFormatError(f"no '{LOG_MARKER[:-1]}' line (is it a vLLM server log with "
                               "speculative decoding on?)", path=where)
    return SpecAcceptance(drafts, draft_tokens, accepted, tuple(per_pos),
                          f"server log {where} ({lines} lines)").checked(where)


def _log_fields(line: str, where: str, number: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, pattern in _LOG_FIELDS.items():
        m = re.search(pattern, line)
        try:
            if m is None:
                raise ValueError("missing")
            raw = m.group("v").strip()
            if name == "Per-position acceptance rate":
                value: Any = [_number(v, raw, "rates in [0, 1]") for v in raw.split(",")]
                if any(v > 1.0 for v in value):
                    raise ValueError(f"{raw!r} are not rates in [0, 1]")
            else:
                value = _number(raw, raw, "a count")
        except ValueError as exc:
            raise TraceFormatError(f"field {name!r}: {exc} in the '{LOG_MARKER[:-1]}' line",
                                   path=where, line=number, field=name) from None
        out[name] = value
    return out


def _number(text: str, raw: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{raw!r} is not {what}")
    return value


def parse_prometheus(text: str, where: str) -> SpecAcceptance:
    """The spec-decode counters of one ``/metrics`` scrape, summed over engines."""
    totals = {PROM_DRAFTS: 0.0, PROM_DRAFT_TOKENS: 0.0, PROM_ACCEPTED: 0.0}
    seen: set[str] = set()
    per_pos: dict[int, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line.startswith("vllm:spec_decode_"):
            continue
        m = _PROM_LINE.match(line)
        if m is None:
            raise TraceFormatError("not a Prometheus sample line", path=where, line=number)
        name = m.group("name").removesuffix("_total")
        if name.endswith("_created"):
            continue
        try:
            value = float(m.group("value"))
            if not math.isfinite(value) or value < 0:
                raise ValueError
        except ValueError:
            raise TraceFormatError(f"field {name!r}: value {m.group('value')!r} is not a "
                                   "count", path=where, line=number, field=name) from None
        if name == PROM_PER_POS:
            pos = _POSITION.search(m.group("labels") or "")
            if pos is None or not pos.group("p").isdigit():
                raise TraceFormatError(f"field {name!r}: no integer position label",
                                       path=where, line=number, field=name)
            i = int(pos.group("p"))
            per_pos[i] = per_pos.get(i, 0.0) + value
        elif name in totals:
            totals[name] += value
            seen.add(name)
    missing = sorted(set(totals) - seen)
    if missing or not per_pos:
        raise TraceFormatError(f"no {', '.join(missing or [PROM_PER_POS])} counter (a vLLM "
                               "/metrics scrape with speculative decoding on?)", path=where)
    if sorted(per_pos) != list(range(len(per_pos))):
        raise TraceFormatError(f"{PROM_PER_POS}: positions {sorted(per_pos)} are not "
                               "0..k-1", path=where, field=PROM_PER_POS)
    return SpecAcceptance(totals[PROM_DRAFTS], totals[PROM_DRAFT_TOKENS], totals[PROM_ACCEPTED],
                          tuple(per_pos[i] for i in range(len(per_pos))), f"metrics {where}")


def check_scrape(acceptance: SpecAcceptance, where: str) -> SpecAcceptance:
    """One scrape on its own must hold drafts (two are checked as their difference)."""
    return acceptance.checked(where)


def _difference(before: SpecAcceptance, after: SpecAcceptance, where: str) -> SpecAcceptance:
    if len(before.accepted_per_pos) != len(after.accepted_per_pos):
        raise TraceFormatError(f"{where}: the scrapes count different positions (another "
                               "deployment?)")
    out = SpecAcceptance(after.num_drafts - before.num_drafts,
                         after.num_draft_tokens - before.num_draft_tokens,
                         after.num_accepted_tokens - before.num_accepted_tokens,
                         tuple(a - b for a, b in zip(after.accepted_per_pos,
                                                     before.accepted_per_pos)),
                         f"metrics {where}")
    if min(out.num_drafts, out.num_draft_tokens, out.num_accepted_tokens,
           *out.accepted_per_pos) < 0:
        raise TraceFormatError(f"{where}: a counter went down (a restart between the "
                               "scrapes, or before and after swapped?)")
    return out.checked(where)


def trace_spec_acceptance(trace: Any) -> SpecAcceptance | None:
    """The acceptance a trace's metadata holds (ingest --spec-metrics), or None; ``trace``
    is a path or a ``Trace``."""
    if trace is None:
        return None
    meta = getattr(trace, "metadata", None)
    if meta is None:
        from tuner.trace.store import read_trace

        meta = read_trace(trace).metadata
    raw = getattr(meta, "spec_acceptance", None)
    return None if raw is None else SpecAcceptance.from_dict(raw, f"{trace}: metadata")


__all__ = ["LOG_MARKER", "SpecAcceptance", "parse_log", "parse_prometheus",
           "read_spec_acceptance", "trace_spec_acceptance"]
