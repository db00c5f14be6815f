"""Every length and count in every ingest format is bounded before anything is sized by it.

Issue: one openai-jsonl record with ``prompt_tokens`` 10**29 ran seven minutes and reached
7 GB (its block hashes were generated before the length was checked); a Mooncake
``input_length`` of 10**29 ended in an OverflowError traceback. Each case here runs in a
child under a memory and time cap (tests/bounded.py) and must end in one line naming the
file, the line and the field, exit 2, and no output file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.bounded import run_tuner
from tuner.cli import cli

HUGE = 10**29

OPENAI = {"timestamp": 1, "request": {"prompt": "hi"},
          "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
MOONCAKE = {"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}
BAILIAN = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0, "input_length": 10,
           "output_length": 2, "type": "text", "turn": 1, "hash_ids": [1]}
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BURST = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
VLLM = ("INFO 12-01 10:00:00 [logger.py:1] Received request cmpl-1: params: "
        "SamplingParams(max_tokens={mt}), prompt_token_ids: {ids}, lora_request: None.\n")


def _jsonl(rec: dict) -> str:
    return json.dumps(rec) + "\n"


CASES = {
    # name: (file name, text, expected "FIELD: reason" start)
    "openai prompt_tokens 1e29": ("a.jsonl", _jsonl({**OPENAI, "usage": {
        "prompt_tokens": HUGE, "completion_tokens": 2}}), "usage.prompt_tokens: 1e+29 tokens is absurd"),
    "openai completion_tokens 1e29": ("a.jsonl", _jsonl({**OPENAI, "usage": {
        "prompt_tokens": 3, "completion_tokens": HUGE}}), "usage.completion_tokens: 1e+29 tokens"),
    "openai max_tokens fallback 1e30": ("a.jsonl", _jsonl(
        {"timestamp": 1, "request": {"prompt": "hi", "max_tokens": 10**30}}), "usage.completion_tokens: 1e+30"),
    "openai priority 1e20": ("a.jsonl", _jsonl({**OPENAI, "request": {
        "prompt": "hi", "priority": 10**20}}), "priority: 1e+20 is out of range"),
    "openai priority text": ("a.jsonl", _jsonl({**OPENAI, "request": {
        "prompt": "hi", "priority": "abc"}}), "priority: not an integer"),
    "openai model not a string": ("a.jsonl", _jsonl({**OPENAI, "request": {
        "prompt": "hi", "model": {"x": 1}}}), "model: not a string"),
    "openai timestamp 1e400 integer": ("a.jsonl", json.dumps(OPENAI).replace(
        '"timestamp": 1', '"timestamp": 1' + "0" * 400) + "\n", "timestamp: not a time"),
    "mooncake input_length 1e29": ("m.jsonl", _jsonl({**MOONCAKE, "input_length": HUGE}),
                                   "input_length: 1e+29 tokens is absurd"),
    "mooncake input_length 2**64-16": ("m.jsonl", _jsonl({**MOONCAKE, "input_length": 2**64 - 16}),
                                       "input_length: 9,223,372,036,854,775,807 tokens is absurd"),
    "mooncake output_length 1e29": ("m.jsonl", _jsonl({**MOONCAKE, "output_length": HUGE}),
                                    "output_length: 1e+29 tokens is absurd"),
    "mooncake timestamp 1e400 integer": ("m.jsonl", json.dumps(MOONCAKE).replace(
        '"timestamp": 0', '"timestamp": 1' + "0" * 400) + "\n", "timestamp: not a number"),
    "bailian chat_id 1e23": ("b.jsonl", _jsonl({**BAILIAN, "chat_id": 10**23}),
                             "chat_id: 1e+23 is out of range"),
    "bailian turn 1e23": ("b.jsonl", _jsonl({**BAILIAN, "turn": 10**23}), "turn: 1e+23 is out"),
    "azure ContextTokens 1e29": ("z.csv", AZURE + "2023-11-16 18:15:46.68,1e29,3\n",
                                 "ContextTokens: 1e+29 tokens is absurd"),
    "azure ContextTokens 1e400": ("z.csv", AZURE + "2023-11-16 18:15:46.68,1e400,3\n",
                                  "ContextTokens: not an integer"),
    "burstgpt Response tokens -5": ("g.csv", BURST + "1,gpt,3,-5,7,x\n",
                                    "Response tokens: -5 tokens is negative"),
    "vllm-log max_tokens 1e30": ("v.log", VLLM.format(mt=10**30, ids="[1, 2, 3]"),
                                 "max_tokens: 1e+30 tokens is absurd"),
    "vllm-log token id 2**40": ("v.log", VLLM.format(mt=5, ids=f"[1, {2**40}]"),
                                "prompt_token_ids: not a list of token ids"),
    "vllm-log token id -1": ("v.log", VLLM.format(mt=5, ids="[1, -1]"),
                             "prompt_token_ids: not a list of token ids"),
}


#: The cases that hung or blew up memory on the old code run in a bounded child; the rest
#: (tracebacks) run in-process, which is quicker.
BOUNDED = {"openai prompt_tokens 1e29", "openai completion_tokens 1e29",
           "openai max_tokens fallback 1e30"}


def _ingest(tmp_path: Path, name: str, *args: str) -> tuple[int, str]:
    if name in BOUNDED:
        run = run_tuner("ingest", *args, cwd=tmp_path)
        assert not run.timed_out, f"{name}: hung"
        assert not run.traceback, run.output
        return run.returncode, run.output
    result = CliRunner().invoke(cli, ["ingest", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"uncaught {result.exception!r}")
    return result.exit_code, result.output


@pytest.mark.parametrize("name", list(CASES))
def test_absurd_count_is_one_line(tmp_path: Path, name: str) -> None:
    file, text, expected = CASES[name]
    src = tmp_path / file
    src.write_text(text)
    out = tmp_path / "o.parquet"
    code, output = _ingest(tmp_path, name, str(src), "-o", str(out))
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith(f"Error: {src}:"), lines[0]
    assert expected in lines[0], lines[0]
    assert not out.exists()


def test_a_line_without_end_is_refused_before_it_fills_memory(tmp_path: Path) -> None:
    """A "line" of 300 MiB (a binary file, no newline) is refused, not read whole."""
    src = tmp_path / "m.jsonl"
    with open(src, "wb") as fh:
        fh.write(b'{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n')
        block = b"x" * (1 << 20)
        for _ in range(300):
            fh.write(block)
    run = run_tuner("ingest", str(src), "-o", str(tmp_path / "o.parquet"),
                    "--format", "mooncake", cwd=tmp_path, memory_mb=4096, timeout_s=300)
    assert not run.traceback, run.output[-2000:]
    assert run.returncode == 2, run.output[-2000:]
    assert "line is longer than 256 MiB" in run.output


@pytest.mark.parametrize("option", [["--hash-block-size", str(HUGE)],
                                    ["--output-len", str(HUGE)]])
def test_ingest_count_options_are_bounded(tmp_path: Path, option: list[str]) -> None:
    src = tmp_path / "m.jsonl"
    src.write_text(_jsonl(MOONCAKE))
    run = run_tuner("ingest", str(src), "-o", str(tmp_path / "o.parquet"), *option,
                    cwd=tmp_path)
    assert not run.traceback, run.output
    assert run.returncode == 2, run.output
    assert option[0] in run.output or "must be 1 to" in run.output
