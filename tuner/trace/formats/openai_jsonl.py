"""OpenAI-style gateway logs: one JSON object per request with its body and response.

Accepted layouts (the first match wins):

* request body under ``request``, ``body`` or ``request_body`` (an OpenAI Batch-API line
  ``{"custom_id", "body": {...}}`` or a gateway's ``{"request": {"body": {...}}}`` is
  unwrapped), or the body's fields (``messages`` / ``prompt``) at top level;
* response under ``response`` (``response.body`` unwrapped) or ``response_body``, with
  ``usage.prompt_tokens`` / ``usage.completion_tokens`` and ``choices[0]``'s
  ``message.content`` or ``text``;
* time under ``timestamp``, ``time``, ``created_at``, ``start_time`` or
  ``request_time`` (ISO-8601, naive = UTC, or Unix seconds, milliseconds, microseconds or
  nanoseconds, told apart by magnitude: :func:`epoch_seconds`), else
  ``response.created``;
* id under ``request_id``, ``id``, ``custom_id`` or ``response.id``; ``session_id`` /
  ``conversation_id`` at top level or in ``metadata``; ``priority`` and ``cache_salt``
  from the body (vLLM extensions).

Tokenization: with ``--tokenizer PATH`` (a directory with ``tokenizer.json`` or the file
itself) the ``tokenizers`` package encodes the text; messages go through the chat
template from ``tokenizer_config.json`` when there is one (rendered with jinja2, as
``transformers`` does, ``add_generation_prompt=True``). Without a tokenizer a documented
fallback applies: messages are rendered as ``<|role|>\\n{content}\\n`` followed by
``<|assistant|>\\n``, and every 4 UTF-8 bytes form one pseudo-token. Either way the
prompt is followed by the output text to form the token stream whose full blocks give
``output_block_hashes``, so a next turn that repeats the conversation hits them.

Lengths come from ``usage`` when present; block *positions* come from the prompt+output
token stream (see :func:`_stream_hashes`), so consecutive turns share their blocks even
when the fallback's pseudo-tokens do not count exactly like the server's tokenizer. The
fallback is an approximation of where block boundaries fall; with ``--tokenizer`` set to
the served model's tokenizer the blocks are exactly vLLM's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa

from tuner.errors import ConfigError
from tuner.loaders import load_json
from tuner.trace.formats._batch import IngestContext, epoch_seconds, make_batch, short_value
from tuner.trace.sources import iter_lines

_BATCH_ROWS = 8192
_TIME_KEYS = ("timestamp", "time", "created_at", "start_time", "request_time")
_ID_KEYS = ("request_id", "id", "custom_id")


class FallbackTokenizer:
    """4 UTF-8 bytes per pseudo-token; deterministic and prefix-stable."""

    identity = "fallback:utf8-4byte"

    def encode_text(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        pad = (-len(data)) % 4
        arr = np.frombuffer(data + b"\0" * pad, dtype="<u4")
        return arr.tolist()

    def render(self, messages: list[dict[str, Any]]) -> str:
        return "".join(f"<|{m.get('role', 'user')}|>\n{_content_text(m.get('content'))}\n"
                       for m in messages) + "<|assistant|>\n"

    def encode_prompt(self, body: dict[str, Any]) -> list[int]:
        return self.encode_text(_prompt_text(body, self.render))

    def encode_stream(self, body: dict[str, Any], output_text: str) -> list[int]:
        return self.encode_text(_prompt_text(body, self.render) + output_text)


class HFTokenizer:
    """A local Hugging Face tokenizer (``tokenizers``) plus its chat template."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer
        p = Path(path)
        file = p / "tokenizer.json" if p.is_dir() else p
        if not file.exists():
            raise ConfigError(f"{path}: no tokenizer.json found; pass a tokenizer directory "
                              "or its tokenizer.json")
        self._tok = Tokenizer.from_file(str(file))
        digest = hashlib.sha256(file.read_bytes()).hexdigest()[:12]
        self.identity = f"{p.name}:{digest}"
        self._template = None
        self._special: dict[str, str] = {}
        config = file.parent / "tokenizer_config.json"
        if config.exists():
            cfg = load_json(config, "tokenizer config", mapping=True).data
            tmpl = cfg.get("chat_template")
            if isinstance(tmpl, list):
                tmpl = next((t.get("template") for t in tmpl if t.get("name") == "default"), None)
            if tmpl:
                self._template = _compile_template(tmpl)
            for key in ("bos_token", "eos_token"):
                v = cfg.get(key)
                self._special[key] = v.get("content", "") if isinstance(v, dict) else (v or "")

    def encode_text(self, text: str, *, special: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=special).ids

    def _render(self, messages: list[dict[str, Any]]) -> tuple[str, bool]:
        if self._template is None:
            return FallbackTokenizer().render(messages), True
        text = self._template.render(messages=messages, add_generation_prompt=True,
                                     **self._special)
        return text, False

    def encode_prompt(self, body: dict[str, Any]) -> list[int]:
        if "messages" in body:
            text, special = self._render(body["messages"])
            return self.encode_text(text, special=special)
        return self.encode_text(_prompt_text(body, None), special=True)

    def encode_stream(self, body: dict[str, Any], output_text: str) -> list[int]:
        return self.encode_prompt(body) + self.encode_text(output_text)


def _compile_template(source: str) -> Any:
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ConfigError("the tokenizer has a chat template; install jinja2 "
                          "(pip install 'vllm-sched-tuner[tokenizers]') to render it") from None

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _prompt_text(body: dict[str, Any], render: Any) -> str:
    if "messages" in body and render is not None:
        return render(body["messages"])
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = "".join(p for p in prompt if isinstance(p, str))
    return prompt or ""


def _unwrap(obj: Any, key: str = "body") -> Any:
    if isinstance(obj, dict) and isinstance(obj.get(key), dict):
        return obj[key]
    return obj


def _parse_time(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        try:
            return epoch_seconds(float(v))
        except OverflowError:  # an integer past float's range: no time
            return None
    if isinstance(v, str):
        try:
            dt = datetime.fromisoformat(v.strip().replace("Z", "+00:00"))
        except ValueError:
            try:
                return _parse_time(float(v))
            except (ValueError, OverflowError):
                return None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        return dt.timestamp()
    return None


class OpenAIJsonlReader:
    HAS_IDS = True
    EPOCH_CLOCK = True

    def read(self, fh: IO[bytes], ctx: IngestContext) -> Iterator[pa.Table]:
        tok: Any = HFTokenizer(ctx.tokenizer) if ctx.tokenizer else FallbackTokenizer()
        ctx.tokenizer_identity = tok.identity
        rows: list[dict[str, Any]] = []
        for line_no, raw in iter_lines(fh):
            if not raw.strip():
                continue
            row = self._parse(raw, line_no, ctx, tok)
            if row is not None:
                rows.append(row)
            if len(rows) >= _BATCH_ROWS:
                yield self._batch(rows)
                rows = []
        if rows:
            yield self._batch(rows)

    def _batch(self, rows: list[dict[str, Any]]) -> pa.Table:
        keys = [k for k in rows[0] if k != "_line"]
        cols = {k: [r[k] for r in rows] for k in keys}
        return make_batch(cols, np.asarray([r["_line"] for r in rows], dtype=np.int64),
                          field_names={"arrival_s": "timestamp",
                                       "input_len": "usage.prompt_tokens",
                                       "output_len": "usage.completion_tokens"})

    def _parse(self, raw: bytes, line_no: int, ctx: IngestContext, tok: Any) -> dict[str, Any] | None:
        obj = ctx.json_object(raw, line_no)
        if obj is None:
            return None
        body = _unwrap(_unwrap(obj.get("request") or obj.get("body") or obj.get("request_body")
                               or obj))
        if not isinstance(body, dict) or not ("messages" in body or "prompt" in body):
            ctx.bad(line_no, "request", "no request body with messages or prompt", raw)
            return None
        resp = _unwrap(obj.get("response") or obj.get("response_body") or {})
        resp = resp if isinstance(resp, dict) else {}
        t = None
        for key in _TIME_KEYS:
            if key in obj:
                t = _parse_time(obj[key])
                if t is None:
                    ctx.bad(line_no, key, f"not a time ({obj[key]!r})", raw)
                    return None
                break
        if t is None and "created" in resp:
            t = _parse_time(resp["created"])
        if t is None:
            ctx.bad(line_no, "timestamp", f"missing (one of {', '.join(_TIME_KEYS)})", raw)
            return None
        rid = next((str(obj[k]) for k in _ID_KEYS if obj.get(k) is not None), None)
        rid = rid or (str(resp["id"]) if resp.get("id") else f"{ctx.stem}-{line_no}")
        usage = resp.get("usage") or obj.get("usage") or {}
        output_text = _output_text(resp)
        try:
            prompt_ids = tok.encode_prompt(body)
        except (ValueError, TypeError) as exc:
            ctx.bad(line_no, "messages", f"cannot render ({exc})", raw)
            return None
        failed = bool(obj.get("error") or resp.get("error")
                      or _int_or(obj.get("status_code"), 200) >= 400)
        input_len = usage.get("prompt_tokens", len(prompt_ids))
        output_len = usage.get("completion_tokens")
        if output_len is None:  # no usage: count the output text, or nothing for a failure
            output_len = (len(tok.encode_text(output_text)) if output_text
                          else 0 if failed else body.get("max_tokens"))
        # Bounded before _stream_hashes: it allocates one hash per block of these lengths.
        for name, v in (("usage.prompt_tokens", input_len), ("usage.completion_tokens", output_len)):
            if not isinstance(v, int) or isinstance(v, bool):
                ctx.bad(line_no, name, f"not an integer ({short_value(v)})", raw)
                return None
        if (ctx.token_count(line_no, "usage.prompt_tokens", input_len, raw, minimum=1) is None
                or ctx.token_count(line_no, "usage.completion_tokens", output_len, raw) is None):
            return None
        # Only an absent priority (or JSON null/false) means vLLM's default 0: "" or 0.0 is a
        # value the log wrote, and is checked like any other.
        given = body.get("priority")
        priority = ctx.bounded_int(line_no, "priority", 0 if given in (None, False) else given,
                                   raw, -(2**31), 2**31 - 1)
        if priority is None:
            return None
        for key in ("cache_salt", "model"):
            if body.get(key) is not None and not isinstance(body[key], str):
                ctx.bad(line_no, key, f"not a string ({short_value(body[key])})", raw)
                return None
        blocks, out_blocks = _stream_hashes(
            ctx, rid, tok.encode_stream(body, output_text) if output_text else prompt_ids,
            input_len, output_len)
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        session = obj.get("session_id") or obj.get("conversation_id") or meta.get("session_id")
        status = "failed" if failed else None
        return {
            "_line": line_no, "request_id": rid, "arrival_s": t, "input_len": input_len,
            "output_len": output_len, "block_hashes": blocks, "output_block_hashes": out_blocks,
            "session_id": None if session is None else str(session),
            "priority": priority,
            "cache_salt": body.get("cache_salt"), "model": body.get("model"), "status": status,
        }


def _int_or(v: Any, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a JSON Infinity
        return default


def _output_text(resp: dict[str, Any]) -> str:
    choices = resp.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    c = choices[0]
    msg = c.get("message") or {}
    return _content_text(msg.get("content")) if msg else (c.get("text") or "")


def _stream_hashes(ctx: IngestContext, rid: str, stream: list[int], input_len: int,
                   output_len: int) -> tuple[list[int], list[int]]:
    """Prompt and output block hashes from the prompt+output token stream.

    Positions come from the stream, lengths from ``usage``: the prompt gets the stream's
    first ``floor(input_len / B)`` full blocks plus a partial-block hash, the output the
    next ``floor((input_len + output_len) / B) - floor(input_len / B)``. A next turn whose
    text starts with this prompt + output then shares every one of those blocks, even
    when the fallback's 4-byte pseudo-tokens do not count exactly like the server's
    tokenizer. Where the stream is too short, request-unique hashes fill in.
    """
    hbs, h = ctx.hash_block_size, ctx.hasher
    full = h.token_block_hashes(stream, hbs, include_partial=False)
    n_in = input_len // hbs
    n_all = (input_len + output_len) // hbs
    full = full + [h.unique_hash(rid, "pad", i) for i in range(len(full), max(n_all, n_in + 1))]
    prompt = full[:n_in]
    if input_len % hbs:
        # The partial block's hash names the block that will complete it plus its length,
        # so it never equals a full block's hash.
        prompt.append(h.unique_hash("partial", full[n_in], input_len % hbs))
    return prompt, full[n_in:n_all]
