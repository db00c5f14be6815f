"""Read vLLM's Prometheus ``/metrics`` exposition: counters, gauges, histograms.

The ``vllm-serve`` backend scrapes ``/metrics`` before and after a replay (and samples a
few gauges while it runs); the difference of the counters is the replay's share, because
a server that was attached to may have served other traffic before. Names follow
``vllm/v1/metrics/loggers.py`` @ 0.32/0.33 (../shared/spec/vllm-v1-scheduler.md §6):
counters carry a ``_total`` suffix in the exposition, every sample carries the labels
``model_name`` and ``engine``; sums here add up every label set (all engines).

Only the text exposition format 0.0.4 is read (what ``prometheus_client`` writes):
``# HELP``/``# TYPE`` comments, then ``name{label="value",...} value [timestamp]`` lines.
Label values may hold escaped ``\\"``, ``\\\\`` and ``\\n``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: vLLM metric names the backend reads (exposition names, counters with ``_total``).
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREEMPTIONS = "vllm:num_preemptions_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
NUM_RUNNING = "vllm:num_requests_running"
NUM_WAITING = "vllm:num_requests_waiting"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
#: Latency histograms whose before/after difference the backend reports.
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
              "vllm:iteration_tokens_total")


class ExpositionError(ValueError):
    """A ``/metrics`` line is not Prometheus text format; the message names the line."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One exposition line: a name, its labels and a value."""

    name: str  # full sample name, e.g. vllm:prefix_cache_hits_total or ..._bucket
    labels: tuple[tuple[str, str], ...]  # sorted (label, value) pairs
    value: float

    def label(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return default


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram summed over label sets: cumulative buckets, sum, count."""

    buckets: tuple[tuple[float, float], ...]  # (upper bound le, cumulative count), ascending
    sum: float
    count: float

    def minus(self, before: "Histogram | None") -> "Histogram":
        """This histogram's increase since ``before`` (None: since zero)."""
        if before is None:
            return self
        prev = dict(before.buckets)
        return Histogram(tuple((le, c - prev.get(le, 0.0)) for le, c in self.buckets),
                         self.sum - before.sum, self.count - before.count)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else math.nan

    def quantile(self, q: float) -> float:
        """Prometheus ``histogram_quantile``: linear inside the bucket holding rank q*count."""
        if self.count <= 0 or not self.buckets:
            return math.nan
        rank = q * self.count
        lo_bound, lo_count = 0.0, 0.0
        for le, c in self.buckets:
            if c >= rank:
                if math.isinf(le):
                    return lo_bound  # the +Inf bucket: the last finite bound, as Prometheus
                width = c - lo_count
                frac = (rank - lo_count) / width if width > 0 else 1.0
                return lo_bound + (le - lo_bound) * frac
            lo_bound, lo_count = le, c
        return lo_bound


@dataclass(slots=True)
class MetricsSnapshot:
    """Every sample of one scrape, with sums over label sets by name."""

    samples: list[Sample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)  # metric family -> counter/gauge/...

    def names(self) -> set[str]:
        return {s.name for s in self.samples}

    def value(self, name: str, default: float = math.nan) -> float:
        """Sum of ``name`` over every label set; ``default`` when absent."""
        found = [s.value for s in self.samples if s.name == name]
        return math.fsum(found) if found else default

    def labels_of(self, name: str) -> list[dict[str, str]]:
        """The label sets of ``name`` (info metrics such as ``vllm:cache_config_info``)."""
        return [dict(s.labels) for s in self.samples if s.name == name]

    def histogram(self, name: str) -> Histogram | None:
        """The histogram family ``name`` (without ``_bucket``) summed over label sets."""
        buckets: dict[float, float] = {}
        for s in self.samples:
            if s.name == name + "_bucket":
                le = s.label("le")
                if le is None:
                    continue
                bound = float("inf") if le in ("+Inf", "Inf", "inf") else float(le)
                buckets[bound] = buckets.get(bound, 0.0) + s.value
        if not buckets:
            return None
        return Histogram(tuple(sorted(buckets.items())), self.value(name + "_sum", 0.0),
                         self.value(name + "_count", 0.0))


def parse_exposition(text: str) -> MetricsSnapshot:
    """Parse Prometheus text exposition into a :class:`MetricsSnapshot`.

    Raises:
        ExpositionError: a sample line cannot be parsed (message: ``line N: ...``).
    """
    snap = MetricsSnapshot()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                snap.types[parts[2]] = parts[3].strip()
            continue
        try:
            snap.samples.append(_parse_sample(line))
        except (ValueError, IndexError) as exc:
            raise ExpositionError(f"/metrics line {lineno}: {exc}: {raw[:120]!r}") from None
    return snap


def _parse_sample(line: str) -> Sample:
    brace = line.find("{")
    space = line.find(" ")
    labels: list[tuple[str, str]] = []
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        pos = brace + 1
        while True:
            while pos < len(line) and line[pos] in " ,":
                pos += 1
            if line[pos] == "}":
                pos += 1
                break
            eq = line.index("=", pos)
            key = line[pos:eq].strip()
            if line[eq + 1] != '"':
                raise ValueError(f"label {key!r} value is not quoted")
            value, pos = _read_quoted(line, eq + 2)
            labels.append((key, value))
        rest = line[pos:].split()
    else:
        name, *rest = line.split()
    if not name or not rest:
        raise ValueError("expected 'name[{labels}] value'")
    return Sample(name=name, labels=tuple(sorted(labels)), value=_parse_value(rest[0]))


def _read_quoted(line: str, pos: int) -> tuple[str, int]:
    """The label value starting at ``pos`` (after the opening quote) and the index after it."""
    out: list[str] = []
    while True:
        ch = line[pos]
        if ch == "\\":
            nxt = line[pos + 1]
            out.append({"n": "\n", '"': '"', "\\": "\\"}.get(nxt, "\\" + nxt))
            pos += 2
        elif ch == '"':
            return "".join(out), pos + 1
        else:
            out.append(ch)
            pos += 1


def _parse_value(text: str) -> float:
    low = text.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    if low == "nan":
        return math.nan
    return float(text)


def counter_deltas(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, float]:
    """The replay's share of vLLM's counters (after - before), under tuner's counter names.

    Keys match ``ReplayResult.counters`` of the other backends (``prefix_cache_queries``,
    ``prefix_cache_hits``, ``preemptions``) plus ``prompt_tokens`` and
    ``generation_tokens``. A counter missing from the scrape is left out.
    """
    out: dict[str, float] = {}
    for key, name in (("prefix_cache_queries", PREFIX_QUERIES), ("prefix_cache_hits", PREFIX_HITS),
                      ("preemptions", PREEMPTIONS), ("prompt_tokens", PROMPT_TOKENS),
                      ("generation_tokens", GENERATION_TOKENS)):
        a = after.value(name)
        if math.isnan(a):
            continue
        b = before.value(name, 0.0)
        out[key] = a - (0.0 if math.isnan(b) else b)
    return out


def histogram_deltas(before: MetricsSnapshot, after: MetricsSnapshot
                     ) -> dict[str, dict[str, float]]:
    """Count, mean, p50 and p90 of each latency histogram's increase over the replay."""
    out: dict[str, dict[str, float]] = {}
    for name in HISTOGRAMS:
        h = after.histogram(name)
        if h is None:
            continue
        d = h.minus(before.histogram(name))
        out[name] = {"count": d.count, "mean": d.mean, "p50": d.quantile(0.5),
                     "p90": d.quantile(0.9)}
    return out
