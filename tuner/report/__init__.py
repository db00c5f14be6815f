"""Reports people look at (stage ``report``: after ``profile``).

One self-contained HTML page (inline CSS and SVG, no script, nothing fetched) for a
trace, a study or a profile. Public API::

    page = tuner.report.trace_report("trace.parquet")
    page = tuner.report.study_report(profile="profiles/p.yaml")     # or study=, storage=
    page = tuner.report.replay_report("replay.parquet")   # tuner replay --out
    tuner.report.write_page(page, "report.html")

Charts are pure SVG builders in :mod:`tuner.report.charts`; ``docs/reports.md`` says what
each chart shows and how to read it.
"""

from __future__ import annotations

from tuner.report.charts import (Chart, PointGroup, Series, bar_chart, cdf_chart, hbar_chart,
                                 histogram_chart,
                                 line_chart, scatter_chart)
from tuner.report.html import Figures, Note, Page, Section, Table, write_page
from tuner.report.study_data import ReportData, find_study_storage, load_report_data
from tuner.report.replay_report import replay_report
from tuner.report.study_report import study_report
from tuner.report.trace_report import trace_report, trace_sections

__all__ = [
    "Chart", "Figures", "Note", "Page", "PointGroup", "ReportData", "Section", "Series", "Table",
    "bar_chart", "cdf_chart", "find_study_storage", "hbar_chart", "histogram_chart", "line_chart", "load_report_data",
    "replay_report", "scatter_chart", "study_report", "trace_report", "trace_sections", "write_page",
]
