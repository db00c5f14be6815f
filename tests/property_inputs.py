"""Generated extreme inputs for every ingest format and numeric CLI option (run in a child
under a memory cap by tests/test_property_inputs.py; see tests/bounded.py).

Each check feeds values from :data:`EXTREMES` (huge, negative, NaN, infinities, wrong
types) and asserts the contract of every command: no traceback, exit 0 or 2, a one-line
``Error:`` naming the file and line for a bad record, and no exit 0 with a wrong result
(an output that exists must read back through the trace checks).
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.cli import cli

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "agentic_1h.parquet"

#: Numbers no field may hold: huge, negative, NaN and the infinities, past int64/float.
BAD_NUMBERS = st.one_of(
    st.integers(min_value=2**24 + 1, max_value=10**400),
    st.integers(max_value=-1, min_value=-(10**400)),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e300, -1e300]),
    st.floats(min_value=0.1, max_value=1e6).filter(lambda v: v != int(v)),
)
#: Values of the wrong type.
WRONG_TYPES = st.one_of(st.text(max_size=8), st.booleans(), st.none(),
                        st.lists(st.integers(), max_size=2), st.just({"x": 1}))
EXTREMES = st.one_of(BAD_NUMBERS, WRONG_TYPES)


def _invoke(args: list[str]) -> tuple[int, str]:
    res = CliRunner().invoke(cli, args, catch_exceptions=True)
    exc = res.exception
    assert exc is None or isinstance(exc, SystemExit), (
        f"{args}: uncaught {type(exc).__name__}: {exc}\n{res.output[-2000:]}")
    assert "Traceback" not in res.output, res.output
    assert res.exit_code in (0, 2), f"{args}: exit {res.exit_code}\n{res.output[-2000:]}"
    return res.exit_code, res.output


def _expect_bad_record(src: Path, out: Path, field: str, value: Any) -> None:
    code, output = _invoke(["ingest", str(src), "-o", str(out)])
    assert code == 2, f"{field}={value!r} was accepted:\n{output}"
    last = output.strip().splitlines()[-1]
    assert last.startswith(f"Error: {src}:2: "), f"{field}={value!r}: {last}"
    assert not out.exists()


def _dump(obj: dict[str, Any]) -> str:
    return json.dumps(obj, allow_nan=True)


# -- ingest formats ------------------------------------------------------------------------
MOONCAKE = {"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}
BAILIAN = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0, "input_length": 20,
           "output_length": 2, "type": "text", "turn": 1, "hash_ids": [1, 2]}
OPENAI = {"timestamp": 1_700_000_000, "request": {"prompt": "hi there"},
          "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


def _hashed(tmp: Path, base: dict[str, Any], field: str, value: Any) -> Path:
    bad = {**base, "timestamp": 1, field: value}
    later = {**base, "timestamp": 2}
    src = tmp / "in.jsonl"
    # good, bad, good: the span is anchored on the records' median, a good one (with one
    # good record beside a far timestamp either could be the corrupt one)
    src.write_text(_dump(base) + "\n" + _dump(bad) + "\n" + _dump(later) + "\n")
    return src


def _mooncake_field(value: Any, field: str) -> bool:
    """Whether ``value`` is bad for ``field`` (the perturbation may land on a good one)."""
    if field == "timestamp":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return True
        return not (abs(value) < 1e15)  # NaN compares False: bad
    return True  # every EXTREMES value is a bad length (huge, < 0, fraction, wrong type)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(["input_length", "output_length", "timestamp", "hash_ids"]),
       value=EXTREMES, bailian=st.booleans())
def check_hashed_jsonl(field: str, value: Any, bailian: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        base = BAILIAN if bailian else MOONCAKE
        if bailian and field == "timestamp":
            field = "turn"
        if not _mooncake_field(value, field):
            return
        src = _hashed(tmp, base, field, value)
        _expect_bad_record(src, tmp / "o.parquet", field, value)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(["prompt_tokens", "completion_tokens", "timestamp",
                              "priority"]), value=EXTREMES)
def check_openai_jsonl(field: str, value: Any) -> None:
    if field == "priority" and isinstance(value, int) and not isinstance(value, bool) \
            and abs(value) < 2**31:
        return  # a good priority
    if field == "priority" and (value is None or value is False or value == 0):
        return  # "no priority"
    if field == "timestamp" and isinstance(value, str):
        return  # free text is parsed as ISO-8601 or a number; covered by the numbers
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        bad = json.loads(json.dumps(OPENAI))
        if field in ("prompt_tokens", "completion_tokens"):
            bad["usage"][field] = value
        elif field == "priority":
            bad["request"]["priority"] = value
        else:
            bad["timestamp"] = value
        src = tmp / "in.jsonl"
        later = {**OPENAI, "timestamp": OPENAI["timestamp"] + 1}
        # good, bad, good: the span is anchored on the records' median, a good one
        src.write_text(_dump(OPENAI) + "\n" + _dump(bad) + "\n" + _dump(later) + "\n")
        _expect_bad_record(src, tmp / "o.parquet", field, value)


CSV_BAD = st.one_of(st.sampled_from(["nan", "inf", "-inf", "-5", "1e400", "1e29", "1.5", "",
                                     "abc", "0x10", "1_0"]),
                    st.integers(min_value=2**24 + 1, max_value=10**60).map(str))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(column=st.integers(min_value=0, max_value=2), value=CSV_BAD, azure=st.booleans())
def check_csv(column: int, value: str, azure: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        src = tmp / "in.csv"
        if azure:
            row = ["2023-11-16 18:15:46.68", "30", "3"]
            if column == 0 and value in ("-5", "1.5"):
                return
            row[column] = value if column else value + "x"
            head = "TIMESTAMP,ContextTokens,GeneratedTokens"
            good = "2023-11-16 18:15:45.00,30,3"
        else:
            row = ["1", "gpt", "30", "3", "33", "x"]
            if column == 0:
                try:
                    t = float(value)
                except ValueError:
                    t = math.nan
                if math.isfinite(t) and abs(t) < 3e7:
                    return  # a relative clock within the 366-day span is a good time
            row[[0, 2, 3][column]] = value
            head = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
            good = "0,gpt,30,3,33,x"
        src.write_text(f"{head}\n{good}\n{','.join(row)}\n")
        code, output = _invoke(["ingest", str(src), "-o", str(tmp / "o.parquet")])
        assert code == 2, f"column {column}={value!r} was accepted:\n{output}"
        assert output.strip().splitlines()[-1].startswith(f"Error: {src}:3: "), output


VLLM = ("INFO 12-01 10:00:0{i} [logger.py:1] Received request cmpl-{i}: params: "
        "SamplingParams(max_tokens={mt}), prompt_token_ids: [{ids}], lora_request: None.\n")


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(token=st.one_of(st.integers(min_value=2**32, max_value=10**40),
                       st.integers(max_value=-1, min_value=-(10**40)),
                       st.sampled_from(["nan", "1.5", "abc", "1e3"])),
       max_tokens=st.integers(min_value=2**24 + 1, max_value=10**40), which=st.booleans())
def check_vllm_log(token: Any, max_tokens: int, which: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        src = tmp / "v.log"
        bad = (VLLM.format(i=1, mt=5, ids=f"1, {token}") if which
               else VLLM.format(i=1, mt=max_tokens, ids="1, 2"))
        src.write_text(VLLM.format(i=0, mt=5, ids="1, 2, 3") + bad)
        code, output = _invoke(["ingest", str(src), "-o", str(tmp / "o.parquet")])
        assert code == 2, f"{token!r}/{max_tokens} accepted:\n{output}"
        assert output.strip().splitlines()[-1].startswith(f"Error: {src}:2: "), output


# -- numeric CLI options -------------------------------------------------------------------
OPTION_TEXT = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "NaN", "1e400", "-1e400", "1e308", "-1", "0",
                     "-0", "1e-320", "abc", "", "1,5", "0x1f", str(10**30), str(-(10**30))]),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr))

#: Commands whose numeric options are probed, with the arguments that make them run.
COMMANDS: dict[str, list[str]] = {
    "replay": ["replay", "{trace}", "--model", "llama-3.1-8b", "--json"],
    "trace slice": ["trace", "slice", "{trace}", "--last", "5m", "-o", "{out}"],
    "trace synth": ["trace", "synth", "--kind", "random", "--num-prompts", "20", "-o",
                    "{out}"],
    "ingest": ["ingest", str(ROOT / "traces" / "mooncake_synthetic.jsonl"), "-o", "{out}"],
    "cluster job": ["cluster", "job", "--name", "x", "--pods", "1", "--storage",
                    "postgresql://u@h/d", "--trace", "t.parquet", "-o", "{dir}"],
}


def numeric_options(path: str) -> list[str]:
    """Every option of ``path`` (``trace synth``) whose type is a number."""
    command: click.Command = cli
    for name in path.split():
        command = command.commands[name]  # type: ignore[attr-defined]
    return sorted(p.opts[0] for p in command.params if isinstance(p, click.Option)
                  and isinstance(p.type, (click.types.FloatParamType,
                                          click.types.IntParamType)))


def _small_trace(tmp: Path) -> Path:
    out = tmp / "small.parquet"
    if not out.exists():
        _invoke(["trace", "slice", str(TRACE), "--last", "2m", "-o", str(out)])
    return out


def check_option(path: str) -> None:
    options = numeric_options(path)
    assert options, path

    @settings(max_examples=max(10, 2 * len(options)), deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(option=st.sampled_from(options), text=OPTION_TEXT)
    def run(option: str, text: str) -> None:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            trace = _small_trace(Path(os.environ["PROPERTY_CACHE"]))
            out = tmp / "o.parquet"
            args = [a.format(trace=trace, out=out, dir=tmp / "k8s") for a in COMMANDS[path]]
            if option in args:  # replace the command's own value
                args[args.index(option) + 1] = text
            else:
                args += [option, text]
            code, output = _invoke(args)
            if code == 0 and out.exists():
                from tuner.trace import read_trace

                read_trace(out)  # an output that exists passes every reader's checks
            if code == 0 and path == "replay":
                summary = json.loads(output[output.index("{"):])
                assert summary["num_requests"] > summary.get("num_rejected", 0), output

    run()


def main() -> None:
    """``python -c 'from tests.property_inputs import main; main()' CHECK``."""
    name = sys.argv[1]
    with tempfile.TemporaryDirectory() as cache:
        os.environ["PROPERTY_CACHE"] = cache
        os.environ.setdefault("TUNER_SALT", "test-salt-0123456789abcdef")
        if name.startswith("option:"):
            check_option(name[len("option:"):])
        else:
            globals()[f"check_{name}"]()
    print("PROPERTY OK")
