"""Numbers for people (issue 17 item 13): units beside values, no exponents, tables that
are not cut at 80 columns in a pipe."""

from __future__ import annotations

import math
import pathlib

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.units import duration, number

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
