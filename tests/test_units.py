"""Numbers for people (issue 17 item 13): units beside values, no exponents, tables that
are not cut at 80 columns in a pipe."""

from __future__ import annotations

import math
import pathlib

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.units import DIFF, FIXED, FRONT, METRIC, REPORT, TICK, cell, duration, number

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("seconds,text", [
    (0.5023, "502 ms"), (0.01234, "12.3 ms"), (0.000151, "0.151 ms"), (1.302, "1.30 s"),
    (17.3575, "17.4 s"), (71.84451, "71.8 s"), (553.11, "553 s"), (3821.2, "3,821 s"),
    (0.0, "0 ms"), (math.nan, "-"), (None, "-")])
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize("value,unit,text", [
    (13020.5, "tok/s/GPU", "13,020 tok/s/GPU"), (4.944, "tok/s/user", "4.94 tok/s/user"),
    (0.9248, "", "0.925"), (208.287, "", "208"), (1e12, "", "1,000,000,000,000")])
def test_number(value: float, unit: str, text: str) -> None:
    assert number(value, unit) == text
    assert "e+" not in text


#: One value of each kind a table cell meets.
KINDS = [None, True, False, 8192, 0.9248, 1234.5, 5000.0, 12345.6, math.nan, math.inf, "fp8"]


@pytest.mark.parametrize("style,texts", [
    # the HTML report: en dash, yes/no, grouped ints, 4 significant digits, whole from 1e4
    (REPORT, ["\u2013", "yes", "no", "8,192", "0.9248", "1234", "5,000", "12,346", "\u2013",
              "\u2013", "fp8"]),
    # the Pareto front: on/off, ints as typed; no exponent (was 1.235e+04) and no "nan"
    (FRONT, ["-", "on", "off", "8192", "0.9248", "1234", "5,000", "12,346", "-", "-", "fp8"]),
    # the replay summary: fixed decimals (ints too), a unit without a space
    (FIXED.with_(digits=1, unit="x"), ["-", "yes", "no", "8,192.0x", "0.9x", "1,234.5x",
                                       "5,000.0x", "12,345.6x", "-", "-", "fp8"]),
    # the profile diff: values as profiles hold them, floats for people
    (DIFF, ["-", "True", "False", "8192", "0.925", "1,234", "5,000", "12,346", "-", "-", "fp8"]),
    # chart ticks
    (TICK, ["-", "yes", "no", "8192", "0.9248", "1234", "5000", "12.3456k", "-", "-", "fp8"]),
])
def test_cell_styles(style, texts) -> None:  # type: ignore[no-untyped-def]
    assert [cell(v, style) for v in KINDS] == texts


@pytest.mark.parametrize("value,unit,text", [
    (0.98, "s", "980 ms"), (1.456, "s", "1.46 s"), (624.2, "s", "624 s"),
    (21.34, "tok/s/user", "21.3 tok/s/user"), (207.14, "tok/s/GPU", "207.1 tok/s/GPU"),
    (0.4567, "", "0.457"), (math.nan, "s", "-")])
def test_cell_metric(value: float, unit: str, text: str) -> None:
    assert cell(value, METRIC.with_(unit=unit)) == text


def test_significant_digits_never_print_an_exponent() -> None:
    """``fmt(width, 3)`` in the trace report printed ``1.23e+03`` for a 1,234.5 s bin."""
    assert cell(1234.5, REPORT.with_(digits=3)) == "1,234"
    assert cell(999.4, REPORT.with_(digits=3)) == "999"
    assert cell(0.012345, REPORT.with_(digits=3)) == "0.0123"


def test_every_table_formats_through_cell() -> None:
    """The six tables that each had their own formatter now call :func:`cell`."""
    from tuner.cli._jobs import _fmt as diff_cell
    from tuner.metrics.tables import _fixed
    from tuner.report.charts import fmt_num
    from tuner.report.html import fmt
    from tuner.tune.result import _fmt as front_cell
    from tuner.tune.select import fmt_metric

    for v in KINDS:
        assert fmt(v) == cell(v, REPORT)
        assert front_cell(v) == cell(v, FRONT)
        assert diff_cell(v) == cell(v, DIFF)
    for v in (0.0, 0.25, 12.0, 1500.0, 2e6, 1e-5):
        assert fmt_num(v) == cell(v, TICK)
        assert _fixed(v, 2) == cell(v, FIXED.with_(digits=2))
    assert fmt_metric("ttft_p50_s", 0.98) == "980 ms"
    assert fmt_metric("p90_interactivity", 21.34) == "21.3 tok/s/user"


def test_replay_summary_in_a_pipe(tmp_path: pathlib.Path) -> None:
    trace = REPO / "tests" / "data" / "trace" / "mooncake_synthetic.jsonl"
    out = tmp_path / "m.parquet"
    assert CliRunner().invoke(cli, ["ingest", str(trace), "-o", str(out)],
                              env={"TUNER_SALT": "x"}).exit_code == 0
    result = CliRunner().invoke(cli, ["replay", str(out), "--hardware", "mi355x", "--model",
                                      "llama-3.1-70b", "--tp", "8", "--measure-to", "120"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "e+" not in text and "…" not in text
    ttft = next(line for line in text.splitlines() if "TTFT" in line)
    cells = [c.strip() for c in ttft.split("│") if c.strip()][1:]
    assert len(cells) == 3 and all(c.endswith((" ms", " s")) for c in cells), ttft
    assert "(ms)" not in text  # the unit rides with each value
