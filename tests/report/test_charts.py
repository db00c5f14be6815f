"""The SVG chart builders: valid SVG, one element per datum, labels escaped."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from tuner.report.charts import (MAX_LINE_POINTS, PointGroup, Series, bar_chart, cdf_chart, ecdf,
                                 hbar_chart, tick_texts,
                                 histogram_chart, line_chart, nice_ticks, scatter_chart, thin)

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # raises on malformed XML
    assert root.tag == SVG + "svg"
    return root


def count(root: ET.Element, tag: str, cls: str | None = None) -> int:
    return sum(1 for e in root.iter(SVG + tag) if cls is None or e.get("class") == cls)


def texts(root: ET.Element) -> list[str]:
    return [e.text or "" for e in root.iter(SVG + "text")]


def test_scatter_draws_one_marker_per_point_and_labels_axes() -> None:
    chart = scatter_chart(
        [PointGroup("trials", [(1.0, 2.0), (2.0, 3.0), (3.0, 1.0)]),
         PointGroup("front", [(2.0, 3.0), (3.0, 1.0)], connect=True),
         PointGroup("baseline", [(1.0, 2.0)], marker="diamond"),
         PointGroup("chosen", [(2.0, 3.0)], marker="star")],
        title="t <&> title", caption="c", x_label="throughput (tok/s/GPU)",
        y_label="p90 interactivity (tok/s)")
    root = parse(chart.svg)
    circles = [c for c in root.iter(SVG + "circle")]
    # 5 data circles + 2 legend circles (trials, front)
    assert len(circles) == 5 + 2
    markers = [p for p in root.iter(SVG + "path") if p.get("class") == "marker"]
    assert len(markers) == 2 + 2  # diamond + star, and their legend swatches
    assert count(root, "path", "line") == 1  # the front's connecting line
    assert "throughput (tok/s/GPU)" in texts(root)
    assert "p90 interactivity (tok/s)" in texts(root)
    assert root.find(SVG + "title").text == "t <&> title"


def test_scatter_skips_non_finite_points() -> None:
    root = parse(scatter_chart([PointGroup("p", [(1.0, 1.0), (math.nan, 2.0), (2.0, math.inf)])],
                               title="t", caption="", x_label="x (s)", y_label="y (s)").svg)
    assert len([c for c in root.iter(SVG + "circle")]) == 1 + 1  # one point + legend


def test_line_chart_one_path_per_series_and_thinning() -> None:
    n = 10 * MAX_LINE_POINTS
    xs = [float(i) for i in range(n)]
    chart = line_chart([Series("a", xs, [math.sin(x / 100) for x in xs]),
                        Series("b", xs[:10], [1.0] * 10, dashed=True)],
                       title="t", caption="c", x_label="time (s)", y_label="KV usage (fraction)")
    root = parse(chart.svg)
    paths = [p for p in root.iter(SVG + "path") if p.get("class") == "line"]
    assert [p.get("data-label") for p in paths] == ["a", "b"]
    assert paths[0].get("d").count("L") == MAX_LINE_POINTS - 1
    assert paths[1].get("stroke-dasharray") == "6 4"


def test_histogram_one_bar_per_bin_counts_add_up() -> None:
    values = [1.0, 2.0, 2.5, 3.0, 10.0, 100.0, 1000.0]
    root = parse(histogram_chart(values, n_bins=12, log_x=True, title="t", caption="c",
                                 x_label="prompt length (tokens)").svg)
    bars = [r for r in root.iter(SVG + "rect") if r.get("class") == "bar"]
    assert len(bars) == 12
    total = sum(int(b.find(SVG + "title").text.rsplit(": ", 1)[1]) for b in bars)
    assert total == len(values)


def test_bar_chart_groups_and_categories() -> None:
    root = parse(bar_chart(["train", "holdout"], [("baseline", [0.5, 0.4]), ("tuned", [0.6, 0.5])],
                           title="hit rate", caption="c", y_label="hit rate (fraction)").svg)
    bars = [r for r in root.iter(SVG + "rect") if r.get("class") == "bar"]
    assert len(bars) == 4
    assert {"train", "holdout", "baseline", "tuned"} <= set(texts(root))
    # the taller bar is the larger value
    h = {b.find(SVG + "title").text: float(b.get("height")) for b in bars}
    assert h["tuned train: 0.6"] > h["baseline train: 0.5"]


def test_ecdf_and_cdf_chart() -> None:
    xs, ys = ecdf([3.0, 1.0, 2.0, 2.0, math.nan])
    assert xs == [1.0, 2.0, 3.0] and ys == pytest.approx([0.25, 0.75, 1.0])
    root = parse(cdf_chart([("baseline", [1.0, 2.0]), ("tuned", [0.5, 1.5, 2.5])], log_x=True,
                           title="TTFT", caption="c", x_label="TTFT (s)").svg)
    assert len([p for p in root.iter(SVG + "path") if p.get("class") == "line"]) == 2
    assert "fraction of requests (CDF)" in texts(root)


def test_nice_ticks_and_thin() -> None:
    assert nice_ticks(0, 10) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(0.0, 1.0)[0] == 0 and nice_ticks(0.0, 1.0)[-1] == 1
    assert all(float(t).is_integer() for t in nice_ticks(0, 3, integer=True))
    tx, ty = thin(list(range(1000)), list(range(1000)), 10)
    assert len(tx) == 10 and tx[0] == 0 and tx[-1] == 999


def test_output_is_deterministic() -> None:
    def make() -> str:
        return line_chart([Series("a", [0, 1, 2], [3, 1, 2])], title="t", caption="c",
                          x_label="x (s)", y_label="y (s)").svg
    assert make() == make()


def test_hbar_chart_rows_and_long_labels() -> None:
    cats = ["cache_aware_admission_window", "max_num_batched_tokens", "watermark"]
    root = parse(hbar_chart(cats, [("p90", [0.2, 0.7, 0.1]), ("tput", [0.5, 0.5, 0.0])],
                            title="importance", caption="c",
                            x_label="importance (share, 0-1)").svg)
    bars = [r for r in root.iter(SVG + "rect") if r.get("class") == "bar"]
    assert len(bars) == 6
    assert set(cats) <= set(texts(root))
    w = {b.find(SVG + "title").text: float(b.get("width")) for b in bars}
    assert w["p90 max_num_batched_tokens: 0.7"] > w["p90 cache_aware_admission_window: 0.2"]
    # the widest label fits left of the plot area
    assert min(float(b.get("x")) for b in bars) >= 6.2 * len(cats[0])


def test_tick_labels_are_distinct_on_narrow_ranges() -> None:
    assert tick_texts([23.015, 23.02, 23.025, 23.03]) == ["23.015", "23.020", "23.025", "23.030"]
    assert tick_texts([0, 0.25, 0.5, 0.75, 1.0]) == ["0.00", "0.25", "0.50", "0.75", "1.00"]
    assert tick_texts([0, 2, 4]) == ["0", "2", "4"]
    assert tick_texts([0, 5000, 10000, 15000]) == ["0", "5000", "10k", "15k"]
    root = parse(scatter_chart([PointGroup("p", [(23.016, 1.0), (23.04, 2.0)])], title="t",
                               caption="", x_label="x (tok/s)", y_label="y (tok/s)").svg)
    labels = [t for t in texts(root) if t.startswith("23.")]
    assert len(labels) == len(set(labels)) >= 3
