"""The log of ``vllm serve --enable-log-requests --enable-log-outputs`` (vLLM 0.30-0.33).

Line formats, from ``vllm/entrypoints/logger.py`` (``RequestLogger``) across releases
(``%s``/``%r`` are Python logging placeholders; every line has vLLM's prefix
``LEVEL MM-DD HH:MM:SS [file.py:N]``, optionally led by ``(APIServer pid=N)`` and colours):

* inputs, older form (one INFO line)::

    Received request ID: prompt: %r, params: %s, prompt_token_ids: %s, lora_request: %s, ...

* inputs, newer form: INFO ``Received request ID: params: %s, lora_request: %s.`` plus,
  at DEBUG, ``Request ID details: prompt: %r, prompt_token_ids: %s, prompt_embeds
  shape: %s.``; with ``--enable-log-request-prompts`` the INFO line ends with
  ``, prompt_token_ids: [...]`` instead (capped at ``--max-log-len``, default 512 ids).
* outputs: ``Generated response ID[ (streaming delta| (streaming complete)]: output: %r,
  output_token_ids: %s, finish_reason: %s``, or the newer pair INFO ``Generated response
  ID: output: %r, finish_reason: %s`` + DEBUG ``Generated response ID details:
  output_token_ids: %s``. Streaming logs one delta line per chunk and a final
  ``(streaming complete)`` line whose ids may be ``None`` (the deltas' ids are summed).
* ``Aborted request(s) ID[, ID...]`` marks requests the engine aborted.

Arrival = the timestamp of the ``Received request`` line. vLLM's log clock has
one-second resolution and no year: the year is taken from the file's modification time
(rolling over at a month that goes backwards) and the clock is read as UTC. Token ids
become salted block hashes; they are never stored. Requests still open at the end of the
log are kept with ``status = "unfinished"`` and the tokens generated so far.
Truncated id lists (``--max-log-len``) cannot be detected: run vLLM without it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO, Any

import numpy as np
import pyarrow as pa

from tuner.trace.formats._batch import MAX_TOKEN_ID, IngestContext, make_batch
from tuner.trace.sources import iter_lines

_ESC = r"(?:\x1b\[[0-9;]*m)*"
_PREFIX = re.compile(
    rf"^{_ESC}(?:\([^)]*\)\s+)?{_ESC}(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL){_ESC}\s+"
    r"(?P<ts>(?:(?P<year>\d{4})-)?(?P<md>\d\d-\d\d)[ T](?P<hms>\d\d:\d\d:\d\d)(?P<frac>[.,]\d+)?)"
    rf"\s+{_ESC}\[[^\]]*\]{_ESC}\s+(?P<msg>.*)$")
_RECEIVED = re.compile(r"^Received request (?P<id>\S+?): (?P<rest>.*)$")
_DETAILS_IN = re.compile(r"^Request (?P<id>\S+?) details: (?P<rest>.*)$")
_GENERATED = re.compile(
    r"^Generated response (?P<id>\S+?)(?P<stream> \(streaming (?:delta|complete)\))?"
    r"(?P<details> details)?: (?P<rest>.*)$")
_ABORTED = re.compile(r"^Aborted request(?:\(s\)|s)? (?P<ids>.+?)\.?$")
_FINISH = re.compile(r"finish_reason: (?P<reason>\S+?)\.?$")
_MAX_TOKENS = re.compile(r"\bmax_tokens=(?P<n>\d+)")
_IDS_INPUT = "prompt_token_ids: "
_BAD_IDS = "not a list of token ids (integers 0 to 2**32-1)"
_IDS_OUTPUT = "output_token_ids: "

#: In-flight requests kept at most; beyond it the oldest is closed as "unfinished".
_MAX_PENDING = 200_000
_BATCH_ROWS = 16_384


@dataclass
class _Pending:
    line: int
    arrival_s: float
    prompt_ids: list[int] | None = None
    output_ids: list[int] = field(default_factory=list)
    status: str | None = None
    done: bool = False
    max_tokens: int | None = None  # from the logged SamplingParams
    output_logged: bool = False  # a "Generated response" line was seen


_IDS_RE = {
    # The real id list follows the prompt/output text and is followed by a known field (or
    # the end of the line), so ids quoted inside the text itself are never taken for it.
    _IDS_INPUT: re.compile(r"prompt_token_ids: (\[[^\]]*\]|None)"
                           r"(?=, prompt_embeds|, lora_request|\.?$)"),
    _IDS_OUTPUT: re.compile(r"output_token_ids: (\[[^\]]*\]|None)(?=, finish_reason: \S+$|$)"),
}


def _parse_ids(rest: str, key: str) -> list[int] | None | str:
    """The logged id list for ``key``; ``None`` if absent; "None" if logged as None."""
    found = list(_IDS_RE[key].finditer(rest))
    if not found:
        return None
    text = found[-1].group(1)
    if text == "None":
        return "None"
    body = text[1:-1].strip()
    if not body:
        return []
    try:
        ids = [int(x) for x in body.split(",")]
    except ValueError:
        return "bad"
    # Hashed as uint32 (vLLM's token id width): one outside it is not a token id.
    return ids if 0 <= min(ids) and max(ids) <= MAX_TOKEN_ID else "bad"


class VllmLogReader:
    HAS_IDS = True
    EPOCH_CLOCK = True

    def __init__(self) -> None:
        self._early: dict[str, list[int]] = {}  # prompt ids logged before their request line

    def read(self, fh: IO[bytes], ctx: IngestContext) -> Iterator[pa.Table]:
        self._early = {}
        pending: dict[str, _Pending] = {}
        rows: list[tuple[str, _Pending]] = []
        year = _file_year(fh)
        last_month = 0
        for line_no, raw in iter_lines(fh):
            if b"request" not in raw and b"response" not in raw and b"Request" not in raw:
                continue
            m = _PREFIX.match(raw.decode("utf-8", "replace"))
            if m is None:
                continue
            msg = m.group("msg")
            if m.group("year"):
                year = int(m.group("year"))
            month = int(m.group("md")[:2])
            if month < last_month:  # December -> January
                year += 1
            last_month = month
            self._handle(msg, m, year, line_no, raw, pending, ctx)
            while pending:
                rid, head = next(iter(pending.items()))
                if not head.done and len(pending) <= _MAX_PENDING:
                    break
                if not head.done:
                    head.status = head.status or "unfinished"
                del pending[rid]
                rows.append((rid, head))
            if len(rows) >= _BATCH_ROWS:
                batch = self._batch(rows, ctx)
                rows = []
                if batch is not None:
                    yield batch
        for rid, req in pending.items():
            if not req.done:
                req.status = req.status or "unfinished"
            rows.append((rid, req))
        if rows:
            batch = self._batch(rows, ctx)
            if batch is not None:
                yield batch

    def _handle(self, msg: str, m: re.Match[str], year: int, line_no: int, raw: bytes,
                pending: dict[str, _Pending], ctx: IngestContext) -> None:
        if (r := _RECEIVED.match(msg)) is not None:
            rid = r.group("id")
            if rid in pending:
                ctx.bad(line_no, "request_id", f"duplicate request id {rid!r}", raw)
                return
            t = _timestamp(m, year)
            if t is None:
                ctx.bad(line_no, "timestamp", f"not a date ({m.group('ts')!r})", raw)
                return
            req = _Pending(line=line_no, arrival_s=t, prompt_ids=self._early.pop(rid, None))
            cap = _MAX_TOKENS.search(r.group("rest"))
            req.max_tokens = int(cap.group("n")) if cap else None
            ids = _parse_ids(r.group("rest"), _IDS_INPUT)
            if ids == "bad":
                ctx.bad(line_no, "prompt_token_ids", _BAD_IDS, raw)
                return
            if isinstance(ids, list):
                req.prompt_ids = ids
            pending[rid] = req
        elif (r := _DETAILS_IN.match(msg)) is not None:
            # Newer vLLM logs this DEBUG line *before* "Received request": park the ids.
            ids = _parse_ids(r.group("rest"), _IDS_INPUT)
            if ids == "bad":
                ctx.bad(line_no, "prompt_token_ids", _BAD_IDS, raw)
            elif isinstance(ids, list):
                req = pending.get(r.group("id"))
                if req is not None:
                    req.prompt_ids = ids
                else:
                    self._early[r.group("id")] = ids
        elif (r := _GENERATED.match(msg)) is not None:
            req = pending.get(r.group("id"))
            if req is None or req.done:
                return  # output of a request received before the log starts
            rest = r.group("rest")
            req.output_logged = True
            ids = _parse_ids(rest, _IDS_OUTPUT)
            if ids == "bad":
                ctx.bad(line_no, "output_token_ids", _BAD_IDS, raw)
                pending.pop(r.group("id"), None)
                return
            stream = r.group("stream") or ""
            if isinstance(ids, list):
                if "delta" in stream:
                    req.output_ids.extend(ids)
                else:
                    req.output_ids = ids
            if r.group("details"):
                return
            fin = _FINISH.search(rest)
            reason = fin.group("reason") if fin else "None"
            # A request ends with its first line that carries a finish reason (the last
            # streaming delta says e.g. "stop") or with the "(streaming complete)" line.
            if "complete" in stream or reason != "None":
                req.done = True
                if reason == "abort":
                    req.status = "aborted"
        elif (r := _ABORTED.match(msg)) is not None:
            for rid in re.split(r"[,\s\[\]']+", r.group("ids")):
                # The engine may name a request by its logged id plus a suffix of its own
                # (vLLM 0.32: "cmpl-<hex>-0-<8 hex>" for the logged "cmpl-<hex>-0").
                req = pending.get(rid) or pending.get(rid.rsplit("-", 1)[0])
                if req is not None:
                    req.status, req.done = "aborted", True

    def _batch(self, rows: list[tuple[str, _Pending]], ctx: IngestContext) -> pa.Table | None:
        hbs = ctx.hash_block_size
        h = ctx.hasher
        cols: dict[str, list[Any]] = {k: [] for k in (
            "request_id", "arrival_s", "input_len", "output_len", "block_hashes",
            "output_block_hashes", "status")}
        lines = []
        for rid, req in rows:
            if req.prompt_ids is None:
                ctx.bad(req.line, "prompt_token_ids",
                        "not logged for this request; run vLLM with VLLM_LOGGING_LEVEL=DEBUG "
                        "(0.33 logs prompt ids only at DEBUG) and --enable-log-requests")
                continue
            output_ids = req.output_ids
            status = req.status
            if not req.output_logged:
                # No output line at all: "still open at the end of the log" cannot be told
                # from "finished unlogged", so the status stays unknown (unless aborted).
                status = None if status == "unfinished" else status
                filled = ctx.fill_output_len(req.line, req.max_tokens)
                if filled is None:
                    continue
                # Generated tokens are unknown: their blocks get no hashes (no prefix
                # sharing through this answer), only its length is modelled.
                output_len, output_ids = filled, []
            else:
                output_len = len(output_ids)
            prompt = req.prompt_ids
            n_full = len(prompt) // hbs
            blocks = h.token_block_hashes(prompt, hbs)
            stream = prompt + output_ids
            parent = blocks[n_full - 1] if n_full else 0
            out_blocks = h.token_block_hashes(stream, hbs, parent=parent, include_partial=False,
                                              start=n_full * hbs)
            cols["request_id"].append(rid)
            cols["arrival_s"].append(req.arrival_s)
            cols["input_len"].append(len(prompt))
            cols["output_len"].append(output_len)
            cols["block_hashes"].append(blocks)
            cols["output_block_hashes"].append(out_blocks)
            cols["status"].append(status)
            lines.append(req.line)
        if not lines:
            return None
        return make_batch(cols, np.asarray(lines, dtype=np.int64),
                          field_names={"arrival_s": "timestamp", "input_len": "prompt_token_ids",
                                       "output_len": "output_token_ids"})


def _timestamp(m: re.Match[str], year: int) -> float | None:
    try:
        dt = datetime.strptime(f"{year}-{m.group('md')} {m.group('hms')}", "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    frac = m.group("frac")
    return dt.replace(tzinfo=timezone.utc).timestamp() + (float("0." + frac[1:]) if frac else 0.0)


def _file_year(fh: IO[bytes]) -> int:
    raw = getattr(fh, "fileobj", None) or fh
    try:
        mtime = os.fstat(raw.fileno()).st_mtime
    except (OSError, AttributeError, ValueError):
        return datetime.now(timezone.utc).year
    return datetime.fromtimestamp(mtime, tz=timezone.utc).year
