"""The published P/D serving results ``bench/pd_check.py`` replays: the CSV's schema, and
the check that every row is one the twin can replay (so a broken row fails loudly, in
``tests/perf/test_pd_published.py``, before any replay runs).

One CSV row is one published configuration of one source (``source`` names it, and
``source_url`` / ``source_file`` say where each figure is). A metric cell left empty means
the source does not publish that figure (or it cannot be read off its figure: the row's
``notes`` say which); a filled cell is compared with the twin. Nothing here is fitted:
the rows check the clock.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSV = ROOT / "bench" / "data" / "pd_published.csv"

#: layouts: an aggregated deployment (``replicas`` x ``dp`` engines of ``tp`` GPUs), a
#: disaggregated one in the twin's pull flow (``pd``), or the push flow (``pd-push``: listed
#: for the record, not replayed by this check)
LAYOUTS = ("aggregated", "pd", "pd-push")
LINKS = ("same-node", "cross-node", "auto")
#: the figures a row may publish, in the order the check prints them; seconds unless named
METRICS = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "itl_mean_s", "itl_p50_s",
           "itl_p90_s", "slo_met", "output_tput_tok_s")
#: per source, the SLO its ``slo_met`` counts (TTFT below, ITL below), as the source states
#: it; a source without one publishes no ``slo_met``
SLOS: dict[str, tuple[float, float]] = {
    "moriio-blog": (1.0, 0.050),  # vllm.ai/blog/moriio-kv-connector, Table 3
}
COLUMNS = ("id", "source", "layout", "hardware", "model", "model_config", "engine", "tp",
           "dp", "replicas", "num_prefill", "num_decode", "expert_parallel", "link", "isl",
           "osl", "num_prompts", "rate_rps", "max_num_batched_tokens", "max_num_seqs",
           "max_model_len", "gpu_memory_utilization", "prefix_caching", *METRICS,
           "workload", "measured", "source_url", "source_file", "notes")


class RowError(ValueError):
    """A CSV row the twin cannot replay; the message names file, line and field."""


@dataclass(frozen=True)
class Row:
    """One published configuration (a validated CSV row)."""

    id: str
    source: str
    layout: str  # LAYOUTS
    line: int  # the CSV line, for messages
    raw: dict[str, str]

    def num(self, key: str) -> float:
        return float(self.raw[key])

    def int(self, key: str) -> int:
        return int(self.raw[key])

    @property
    def rate(self) -> float | None:
        """Poisson requests/s, or None: every request at t=0 (``vllm bench serve``'s
        default ``--request-rate inf``)."""
        value = float(self.raw["rate_rps"])
        return None if math.isinf(value) else value

    @property
    def model_path(self) -> str:
        """What ``Target.model`` gets: the bundled config.json where the row names one (a
        model neither a preset nor in aiconfigurator-core), else the Hugging Face id."""
        return str(ROOT / self.raw["model_config"]) if self.raw["model_config"] else self.raw["model"]

    def published(self) -> list[str]:
        """The metrics this row publishes, in print order."""
        return [m for m in METRICS if self.raw[m] != ""]


def load_rows(path: Path = DEFAULT_CSV) -> list[Row]:
    """Every row of ``path``, validated; RowError on the first bad one."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise RowError(f"{path}: missing column(s) {', '.join(missing)}")
        rows = [check_row(r, path, reader.line_num) for r in reader]
    seen: set[str] = set()
    for row in rows:
        if row.id in seen:
            raise RowError(f"{path}:{row.line}: id {row.id!r} appears twice")
        seen.add(row.id)
    return rows


def check_row(r: dict[str, str], path: Path, line: int) -> Row:
    """``r`` as a Row, or RowError naming the first field that is wrong and why."""
    def bad(field: str, why: str) -> RowError:
        return RowError(f"{path}:{line}: field {field} = {r.get(field)!r}: {why}")

    def integer(field: str, low: int) -> int:
        try:
            value = int(r[field])
        except ValueError:
            raise bad(field, "an integer") from None
        if value < low:
            raise bad(field, f"an integer >= {low}")
        return value

    for field in ("id", "source", "model", "engine", "workload", "measured", "source_file"):
        if not r[field].strip():
            raise bad(field, "must not be empty")
    if r["layout"] not in LAYOUTS:
        raise bad("layout", f"one of {', '.join(LAYOUTS)}")
    from tuner.perf.presets import list_hardware

    if r["hardware"] not in list_hardware():
        raise bad("hardware", f"a hardware preset ({', '.join(list_hardware())})")
    if r["model_config"] and not (ROOT / r["model_config"]).is_file():
        raise bad("model_config", "a config.json path relative to the repository root")
    for field in ("tp", "dp", "replicas", "isl", "osl", "num_prompts"):
        integer(field, 1)
    for field in ("max_num_batched_tokens", "max_num_seqs"):
        integer(field, 0)  # 0: vLLM's default for the hardware
    if integer("max_model_len", 1) < int(r["isl"]) + int(r["osl"]):
        raise bad("max_model_len", "must hold isl + osl")
    p, d = integer("num_prefill", 0), integer("num_decode", 0)
    if r["layout"] == "aggregated":
        for field, set_ in (("num_prefill", p), ("num_decode", d), ("link", r["link"])):
            if set_:
                raise bad(field, "an aggregated row has num_prefill = num_decode = 0 and "
                          "no link")
    else:
        if p < 1 or d < 1:
            raise bad("num_prefill" if p < 1 else "num_decode", "a P/D row needs >= 1 of each")
        if r["link"] not in LINKS:
            raise bad("link", f"one of {', '.join(LINKS)}")
        for field in ("dp", "replicas"):
            if int(r[field]) != 1:
                raise bad(field, "a P/D row's pools are num_prefill / num_decode engines: "
                          "dp = replicas = 1")
    for field in ("expert_parallel", "prefix_caching"):
        if r[field] not in ("on", "off"):
            raise bad(field, "on or off")
    try:
        rate = float(r["rate_rps"])
    except ValueError:
        raise bad("rate_rps", "requests/s > 0, or inf (all at t=0)") from None
    if not rate > 0:
        raise bad("rate_rps", "requests/s > 0, or inf (all at t=0)")
    try:
        util = float(r["gpu_memory_utilization"])
    except ValueError:
        raise bad("gpu_memory_utilization", "a fraction in (0, 1]") from None
    if not 0 < util <= 1:
        raise bad("gpu_memory_utilization", "a fraction in (0, 1]")
    for metric in METRICS:
        if r[metric] == "":
            continue
        try:
            value = float(r[metric])
        except ValueError:
            raise bad(metric, "a number, or empty (not published)") from None
        if not (math.isfinite(value) and value >= 0):
            raise bad(metric, "a finite number >= 0")
    if not any(r[m] != "" for m in METRICS):
        raise bad("ttft_mean_s", "a row publishes at least one metric")
    if r["slo_met"] != "" and r["source"] not in SLOS:
        raise bad("slo_met", f"source {r['source']!r} has no SLO in SLOS")
    if not r["source_url"].startswith("https://"):
        raise bad("source_url", "an https:// address")
    return Row(r["id"], r["source"], r["layout"], line, dict(r))
