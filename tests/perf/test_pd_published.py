"""bench/data/pd_published.csv: every published P/D row parses and is one the twin can
replay, and a broken row fails with its file, line and field (bench/pd_published.py).
The replays themselves are bench/pd_check.py's (about 15 s); one cheap row is replayed
here so a row's model config and layout keep resolving."""

from __future__ import annotations

import csv
import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pd_check imports pd_published by name
    spec.loader.exec_module(module)
    return module


pub = _load("pd_published")


def test_every_row_parses_and_each_source_has_aggregated_and_pd_rows():
    rows = pub.load_rows()
    by_source: dict[str, set[str]] = {}
    for row in rows:
        by_source.setdefault(row.source, set()).add(row.layout)
        assert row.published(), row.id
        assert row.raw["source_url"].startswith("https://")
    assert set(by_source) == {"moriio-blog", "pythonsheets-efa"}
    for source, layouts in by_source.items():
        assert {"aggregated", "pd"} <= layouts, source
    efa = [r for r in rows if r.source == "pythonsheets-efa"]
    assert len(efa) == 15 and all(r.rate is None for r in efa)  # --request-rate inf
    assert Path(efa[0].model_path).is_file()


def _rows_text() -> tuple[list[str], list[dict[str, str]]]:
    with open(pub.DEFAULT_CSV, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _write(tmp_path: Path, fields: list[str], rows: list[dict[str, str]]) -> Path:
    path = tmp_path / "rows.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.mark.parametrize(("row_id", "field", "value"), [
    ("efa-route4-i1024-o256", "hardware", "h900"),
    ("efa-route4-i1024-o256", "tp", "eight"),
    ("efa-route4-i1024-o256", "dp", "0"),
    ("efa-route4-i1024-o256", "layout", "split"),
    ("efa-route4-i1024-o256", "rate_rps", "-1"),
    ("efa-route4-i1024-o256", "max_model_len", "1000"),
    ("efa-route4-i1024-o256", "gpu_memory_utilization", "1.5"),
    ("efa-route4-i1024-o256", "ttft_mean_s", "fast"),
    ("efa-route4-i1024-o256", "itl_mean_s", "nan"),
    ("efa-route4-i1024-o256", "source_url", "www.pythonsheets.com"),
    ("efa-route4-i1024-o256", "model_config", "bench/data/models/missing.json"),
    ("efa-route4-i1024-o256", "num_decode", "2"),  # aggregated rows have no pools
    ("efa-route4-i1024-o256", "slo_met", "3"),  # the source states no SLO
    ("efa-pd1p3d-i1024-o256", "num_decode", "0"),
    ("efa-pd1p3d-i1024-o256", "link", "ethernet"),
    ("efa-pd1p3d-i1024-o256", "replicas", "2"),
    ("moriio-1xTP8", "expert_parallel", "yes"),
    ("moriio-1xTP8", "source_file", ""),
])
def test_a_broken_row_names_its_line_and_field(tmp_path, row_id, field, value):
    fields, rows = _rows_text()
    index = next(i for i, r in enumerate(rows) if r["id"] == row_id)
    rows[index][field] = value
    path = _write(tmp_path, fields, rows)
    with pytest.raises(pub.RowError, match=rf"rows\.csv:{index + 2}: field {field} = "):
        pub.load_rows(path)


def test_a_row_without_any_published_metric_fails(tmp_path):
    fields, rows = _rows_text()
    for metric in pub.METRICS:
        rows[0][metric] = ""
    with pytest.raises(pub.RowError, match=r"rows\.csv:2: .*at least one metric"):
        pub.load_rows(_write(tmp_path, fields, rows))


def test_a_duplicate_id_and_a_missing_column_fail(tmp_path):
    fields, rows = _rows_text()
    with pytest.raises(pub.RowError, match="appears twice"):
        pub.load_rows(_write(tmp_path, fields, rows + [dict(rows[-1])]))
    with pytest.raises(pub.RowError, match="missing column.*output_tput_tok_s"):
        pub.load_rows(_write(tmp_path, [f for f in fields if f != "output_tput_tok_s"],
                             [{k: v for k, v in r.items() if k != "output_tput_tok_s"}
                              for r in rows]))


def test_one_efa_row_replays_to_finite_figures_for_every_published_metric():
    check = _load("pd_check")
    row = next(r for r in pub.load_rows() if r.id == "efa-pd2p2d-i512-o1024")
    figures = check.replay_row(row, seed=0)
    for metric in row.published():
        assert math.isfinite(figures[metric]) and figures[metric] > 0, metric
    # a burst of 1024 prompts queues at the prefill pool: the first token waits far longer
    # than one decode step
    assert figures["ttft_mean_s"] > 10 * figures["itl_mean_s"]
