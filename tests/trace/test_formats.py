"""Each input format from fixtures in its real layout: bailian, azure-csv, burstgpt-csv,
vllm-log (two logger generations, streaming, aborts), openai-jsonl (fallback and a real
tokenizer with a chat template)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.errors import TraceFormatError
from tuner.trace import detect_format, ingest, read_trace, trace_stats


def _ingest(src: Path, tmp_path: Path, **kw):
    out = tmp_path / "out.parquet"
    report = ingest([src], out, progress=False, **kw)
    return report, read_trace(out)


@pytest.mark.parametrize("name,fmt", [
    ("mooncake_synthetic.jsonl", "mooncake"), ("bailian_sample.jsonl", "bailian"),
    ("azure_code_sample.csv", "azure-csv"), ("burstgpt_sample.csv", "burstgpt-csv"),
    ("vllm_033_debug.log", "vllm-log"), ("vllm_legacy_info.log", "vllm-log"),
    ("openai_gateway.jsonl", "openai-jsonl"),
])
def test_detect_format(data: Path, name: str, fmt: str) -> None:
    assert detect_format(data / name) == fmt


def test_bailian_sessions_and_hit_rate(data: Path, tmp_path: Path) -> None:
    report, trace = _ingest(data / "bailian_sample.jsonl", tmp_path)
    assert report.requests == 5 and trace.metadata.hash_block_size == 16
    rows = {r.request_id: r for r in trace.requests()}
    assert rows["170"].session_id == "159" and rows["170"].parent_id == "162"
    assert rows["162"].session_id == "159" and rows["162"].turn == 2
    assert rows["160"].session_id == "160" and rows["160"].parent_id is None
    assert rows["162"].block_hashes[:32] == rows["159"].block_hashes[:32]
    assert rows["162"].block_hashes[32] != rows["159"].block_hashes[32]  # partial vs full
    # By hand: 162 hits 32 blocks (512 tok), 163 hits [46, 47] (32), 170 hits 42 (672).
    assert trace_stats(trace).ideal_prefix_hit_rate == pytest.approx(1216 / 2032)
    assert trace.requests()[0].arrival_s == 0.0 and rows["170"].arrival_s == pytest.approx(29.386)


def test_bailian_duplicate_id(tmp_path: Path, data: Path) -> None:
    lines = (data / "bailian_sample.jsonl").read_text().splitlines()
    src = tmp_path / "dup.jsonl"
    src.write_text("\n".join(lines[:2] + [lines[0].replace('"timestamp": 61.114', '"timestamp": 62')]) + "\n")
    with pytest.raises(TraceFormatError) as err:
        ingest([src], tmp_path / "o.parquet", progress=False)
    assert str(err.value) == f"{src}:3: chat_id: duplicate request id '159'"
    report = ingest([src], tmp_path / "o.parquet", on_error="skip", progress=False)
    assert report.requests == 2 and report.duplicates == 1 and report.skipped == 1


def test_azure_csv(data: Path, tmp_path: Path) -> None:
    report, trace = _ingest(data / "azure_code_sample.csv", tmp_path)
    rows = trace.requests()
    assert [r.input_len for r in rows] == [374, 396, 879, 91, 91]
    assert [r.output_len for r in rows] == [44, 109, 31, 16, 4]
    assert rows[1].arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert trace.metadata.origin_utc == "2023-11-16T18:15:46.680590+00:00"
    assert len(rows[0].block_hashes) == 24  # ceil(374 / 16)
    assert trace_stats(trace).ideal_prefix_hit_rate == 0.0  # no prefix identity: unique
    assert trace_stats(trace).distinct_blocks == sum(-(-r.input_len // 16) for r in rows)


def test_azure_bad_row(tmp_path: Path) -> None:
    src = tmp_path / "az.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,10,2\n"
                   "2023-11-16 18:15:47.1,ten,2\n")
    with pytest.raises(TraceFormatError) as err:
        ingest([src], tmp_path / "o.parquet", progress=False)
    assert str(err.value) == f"{src}:3: ContextTokens: not an integer ('ten')"


def test_burstgpt_marks_failures(data: Path, tmp_path: Path) -> None:
    _, trace = _ingest(data / "burstgpt_sample.csv", tmp_path)
    rows = trace.requests()
    assert [r.status for r in rows] == [None, "failed", None, None]
    assert [r.model for r in rows] == ["ChatGPT", "ChatGPT", "GPT-4", "ChatGPT"]
    assert [r.arrival_s for r in rows] == [0.0, 40.0, 113.0, 117.0]
    assert trace.metadata.origin_utc is None
    assert trace_stats(trace).failed_or_aborted == 1


def test_vllm_033_log(data: Path, tmp_path: Path) -> None:
    report, trace = _ingest(data / "vllm_033_debug.log", tmp_path)
    rows = {r.request_id: r for r in trace.requests()}
    assert list(rows) == ["chatcmpl-a1", "chatcmpl-b2", "chatcmpl-c3", "chatcmpl-d4"]
    a1, b2, c3, d4 = rows.values()
    assert (a1.input_len, a1.output_len) == (74, 37)  # not the "[1, 2]" quoted in the text
    assert (c3.input_len, c3.output_len) == (136, 20)  # streaming deltas summed
    assert d4.status == "aborted" and d4.output_len == 3
    assert [r.arrival_s for r in rows.values()] == [0.0, 1.0, 19.0, 28.0]
    assert trace.metadata.origin_utc is not None and trace.metadata.origin_utc.endswith(
        "-11-29T10:00:12+00:00")
    # 74 prompt tokens: 4 full blocks + a partial; output completes 2 more (111 // 16 = 6).
    assert len(a1.block_hashes) == 5 and len(a1.output_block_hashes) == 2
    # Turn 2 (c3) repeats a1's prompt + output: its first 6 blocks are a1's cached blocks.
    assert c3.block_hashes[:6] == a1.block_hashes[:4] + a1.output_block_hashes
    assert c3.block_hashes[4] != a1.block_hashes[4]  # a1's partial block is not reused
    assert b2.block_hashes[:2] == a1.block_hashes[:2]  # shared 44-token system prompt
    assert b2.block_hashes[2] != a1.block_hashes[2]


def test_vllm_legacy_log(data: Path, tmp_path: Path) -> None:
    _, trace = _ingest(data / "vllm_legacy_info.log", tmp_path)
    first, second = trace.requests()
    assert (first.input_len, first.output_len, second.input_len) == (50, 20, 80)
    assert second.block_hashes[:4] == first.block_hashes[:3] + first.output_block_hashes
    assert second.arrival_s == 3.0


def test_vllm_log_without_prompt_ids(tmp_path: Path) -> None:
    src = tmp_path / "info.log"
    src.write_text(
        "INFO 11-29 10:00:12 [logger.py:79] Received request chatcmpl-x: params: "
        "SamplingParams(n=1, max_tokens=5), lora_request: None.\n"
        "INFO 11-29 10:00:13 [logger.py:118] Generated response chatcmpl-x: output: 'hi', "
        "finish_reason: stop\n")
    with pytest.raises(TraceFormatError) as err:
        ingest([src], tmp_path / "o.parquet", progress=False)
    assert str(err.value).startswith(f"{src}:1: prompt_token_ids: not logged for this request")


def test_vllm_log_duplicate_request(tmp_path: Path) -> None:
    line = ("INFO 11-29 10:00:12 [logger.py:43] Received request r-1: prompt: 'a', params: "
            "SamplingParams(n=1), prompt_token_ids: [1, 2, 3], lora_request: None.\n")
    src = tmp_path / "dup.log"
    src.write_text(line + line)
    with pytest.raises(TraceFormatError) as err:
        ingest([src], tmp_path / "o.parquet", progress=False)
    assert str(err.value) == f"{src}:2: request_id: duplicate request id 'r-1'"


def test_openai_fallback(data: Path, tmp_path: Path) -> None:
    report, trace = _ingest(data / "openai_gateway.jsonl", tmp_path, hash_block_size=4)
    rows = {r.request_id: r for r in trace.requests()}
    assert list(rows) == ["r1", "r2", "cmpl-3", "r4"]
    r1, r2, r3, r4 = rows.values()
    assert (r1.input_len, r1.output_len, r2.input_len) == (29, 24, 67)  # from usage
    assert r1.session_id == r2.session_id == "conv-1" and r2.priority == 2
    assert r2.arrival_s == pytest.approx(30.25) and r3.arrival_s == pytest.approx(60.5)
    assert r3.cache_salt == "tenant-a" and r3.model == "llama-3.1-8b"
    assert r4.status == "failed" and r4.output_len == 0
    assert trace.metadata.tokenizer == "fallback:utf8-4byte"
    assert len(r1.block_hashes) == 8 and len(r2.block_hashes) == 17  # ceil(len / 4)
    # r2's rendered prompt starts with r1's prompt + output: all of r1's full blocks match.
    assert r2.block_hashes[:7] == r1.block_hashes[:7]
    assert r1.output_block_hashes and r2.block_hashes[7] == r1.output_block_hashes[0]
    assert trace_stats(trace).ideal_hit_tokens > 7 * 4


def test_openai_bad_lines(tmp_path: Path) -> None:
    src = tmp_path / "gw.jsonl"
    src.write_text(json.dumps({"timestamp": "yesterday", "request": {"prompt": "x"}}) + "\n")
    with pytest.raises(TraceFormatError) as err:
        ingest([src], tmp_path / "o.parquet", format="openai-jsonl", progress=False)
    assert str(err.value) == f"{src}:1: timestamp: not a time ('yesterday')"
    src.write_text(json.dumps({"timestamp": 1, "request": {"input": "x"}}) + "\n")
    with pytest.raises(TraceFormatError, match=r"gw.jsonl:1: request: no request body"):
        ingest([src], tmp_path / "o.parquet", format="openai-jsonl", progress=False)


def _tiny_tokenizer(path: Path, template: bool) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = ["[UNK]", "<|", "|>", "user", "assistant", "system", "hello", "world", "again"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    if template:
        (path / "tokenizer_config.json").write_text(json.dumps({
            "bos_token": "", "chat_template":
            "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|> {% endif %}"}))
    return path


def test_openai_with_tokenizer_and_chat_template(tmp_path: Path) -> None:
    tok = _tiny_tokenizer(tmp_path / "tiny", template=True)
    src = tmp_path / "gw.jsonl"
    msgs = [{"role": "user", "content": "hello world"}]
    src.write_text(
        json.dumps({"timestamp": 0, "request": {"messages": msgs},
                    "response": {"choices": [{"message": {"content": "hello again"}}]}}) + "\n"
        + json.dumps({"timestamp": 1, "request": {"messages": msgs + [
            {"role": "assistant", "content": "hello again"}, {"role": "user", "content": "world"}]},
                      "response": {"choices": [{"message": {"content": "again"}}]}}) + "\n")
    report = ingest([src], tmp_path / "o.parquet", tokenizer=str(tok), hash_block_size=2,
                    progress=False)
    first, second = read_trace(tmp_path / "o.parquet").requests()
    # "<| user |> hello world <| assistant |>" = 8 tokens by hand; output "hello again" = 2.
    assert (first.input_len, first.output_len) == (8, 2)
    # second: 8 + "hello again" (2) + "<| user |> world <| assistant |>" (7) = 17 tokens.
    assert second.input_len == 17
    assert second.block_hashes[:5] == first.block_hashes[:4] + first.output_block_hashes
    meta = read_trace(tmp_path / "o.parquet").metadata
    assert meta.tokenizer.startswith("tiny:") and report.requests == 2


def test_openai_with_tokenizer_without_template(tmp_path: Path) -> None:
    tok = _tiny_tokenizer(tmp_path / "tiny", template=False)
    src = tmp_path / "gw.jsonl"
    src.write_text(json.dumps({"timestamp": 0, "request": {"prompt": "hello world again"},
                               "response": {"choices": [{"text": "world"}]}}) + "\n")
    _, trace = _ingest(src, tmp_path, tokenizer=str(tok), hash_block_size=2)
    (r,) = trace.requests()
    assert (r.input_len, r.output_len, len(r.block_hashes)) == (3, 1, 2)
