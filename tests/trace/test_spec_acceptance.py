"""Measured speculative-decoding acceptance: vLLM server logs and /metrics scrapes into
the trace metadata (tuner.trace.spec_acceptance), and replays reading it back."""

from __future__ import annotations

import json
import pathlib

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import TraceFormatError
from tuner.trace import read_trace
from tuner.trace.spec_acceptance import parse_log, parse_prometheus, read_spec_acceptance


def log_line(length: float, accepted: int, drafted: int, rates: str) -> str:
    """vLLM 0.33.0's line (v1/spec_decode/metrics.py:121), with its logger prefix."""
    return (f"INFO 12-01 10:00:00 [metrics.py:121] SpecDecoding metrics: Mean acceptance "
            f"length: {length:.2f}, Accepted throughput: 10.00 tokens/s, Drafted throughput: "
            f"20.00 tokens/s, Accepted: {accepted} tokens, Drafted: {drafted} tokens, "
            f"Per-position acceptance rate: {rates}, Avg Draft acceptance rate: "
            f"{100 * accepted / drafted:.1f}%")


SCRAPE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {d0}
vllm:spec_decode_num_drafts_total{{engine="1",model_name="m"}} {d1}
vllm:spec_decode_num_drafts_created{{engine="0",model_name="m"}} 1.7e9
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {t}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {a}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
"""


def test_log_lines_are_summed_weighted_by_drafts() -> None:
    """Two intervals, k = 2: 500 drafts at 0.8/0.6 and 1500 at 0.4/0.2: the rates over
    the log are 0.5 / 0.3 and the mean acceptance length 1 + 1600 / 2000."""
    text = "\n".join(["startup", log_line(2.4, 700, 1000, "0.800, 0.600"),
                      log_line(1.6, 900, 3000, "0.400, 0.200")])
    acc = parse_log(text, "server.log")
    assert acc.num_drafts == 2000 and acc.num_draft_tokens == 4000
    assert acc.rates == pytest.approx((0.5, 0.3))
    assert acc.mean_acceptance_length == pytest.approx(1.8)
    assert acc.acceptance_text() == "0.5,0.3"
    assert acc.source == "server log server.log (2 lines)"


@pytest.mark.parametrize("line, message", [
    (log_line(2.4, 700, 1000, "0.800, x"),
     "server.log:2: field 'Per-position acceptance rate': '0.800, x' is not rates in [0, 1]"),
    (log_line(2.4, 700, 1000, "0.8").replace("Drafted: 1000", "Drafted: many"),
     "server.log:2: field 'Drafted': 'many' is not a count"),
    (log_line(2.4, 700, 1000, "0.8, 0.6, 0.4"),
     "server.log:2: field 'Per-position acceptance rate': 3 positions, earlier lines had 2"),
])
def test_a_bad_log_line_names_file_line_and_field(line: str, message: str) -> None:
    good = log_line(2.4, 700, 1000, "0.800, 0.600")
    with pytest.raises(TraceFormatError) as err:
        parse_log(good + "\n" + line if "positions" in message else "x\n" + line,
                  "server.log")
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_metrics_scrapes_sum_engines_and_take_the_difference(tmp_path: pathlib.Path) -> None:
    one = parse_prometheus(SCRAPE.format(d0=60, d1=40, t=200, a=130, p0=80, p1=50), "m")
    assert one.num_drafts == 100 and one.rates == (0.8, 0.5)
    before, after = tmp_path / "before.prom", tmp_path / "after.prom"
    before.write_text(SCRAPE.format(d0=60, d1=40, t=200, a=130, p0=80, p1=50))
    after.write_text(SCRAPE.format(d0=160, d1=40, t=400, a=230, p0=150, p1=80))
    diff = read_spec_acceptance([before, after])
    assert diff.num_drafts == 100 and diff.rates == (0.7, 0.3)
    with pytest.raises(TraceFormatError, match="a counter went down"):
        read_spec_acceptance([after, before])
    bad = tmp_path / "bad.prom"
    bad.write_text(SCRAPE.format(d0=1, d1=0, t=2, a="NaN", p0=1, p1=0))
    with pytest.raises(TraceFormatError, match=r"bad.prom:7: field "
                                               r"'vllm:spec_decode_num_accepted_tokens': "
                                               r"value 'NaN' is not a count"):
        read_spec_acceptance([bad])
    empty = tmp_path / "empty.prom"
    empty.write_text("vllm:num_requests_running 3\n")
    with pytest.raises(TraceFormatError, match="no vllm:spec_decode_num_accepted_tokens"):
        read_spec_acceptance([empty])


def test_ingest_stores_it_and_replay_uses_it(tmp_path: pathlib.Path,
                                             mooncake_head_trace: pathlib.Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(log_line(2.4, 700, 1000, "0.800, 0.600") + "\n")
    src = mooncake_head_trace.parent / "log.jsonl"  # the fixture's 40 Mooncake records
    out = tmp_path / "spec.parquet"
    r = CliRunner().invoke(cli, ["ingest", str(src), "-o", str(out), "--spec-metrics",
                                 str(log)])
    assert r.exit_code == 0, r.output
    meta = read_trace(out).metadata.spec_acceptance
    assert meta["rates"] == [0.8, 0.6] and meta["num_drafts"] == 500
    cfg = '{"method": "mtp", "num_speculative_tokens": 2}'
    r = CliRunner().invoke(cli, ["replay", str(out), "--model", "llama-3.1-8b", "--hardware",
                                 "h200", "--speculative-config", cfg, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["speculative"]["acceptance"] == [0.8, 0.6]  # not mtp's 0.85
    r = CliRunner().invoke(cli, ["replay", str(out), "--model", "llama-3.1-8b", "--hardware",
                                 "h200", "--speculative-config", cfg, "--spec-acceptance",
                                 "0.5", "--json"])
    assert json.loads(r.output)["speculative"]["acceptance"] == [0.5, 0.25]  # the flag wins
    # a trace without it is written as before (no key in the metadata JSON)
    assert "spec_acceptance" not in read_trace(mooncake_head_trace).metadata.to_json()


def test_bad_spec_metrics_is_one_line_and_writes_nothing(
        tmp_path: pathlib.Path, mooncake_head_trace: pathlib.Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("x\n" + log_line(2.4, 700, 1000, "0.800, 0.600").replace(
        "Accepted: 700", "Accepted: -3") + "\n")
    out = tmp_path / "spec.parquet"
    r = CliRunner().invoke(cli, ["ingest", str(mooncake_head_trace.parent / "log.jsonl"),
                                 "-o", str(out),
                                 "--spec-metrics", str(log)])
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1] == (
        f"Error: {log}:2: field 'Accepted': '-3' is not a count in the 'SpecDecoding "
        "metrics' line")
    assert not out.exists()

