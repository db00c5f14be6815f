"""Opening log files: transparent gzip/zstd, line chunks, and format detection by content."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tuner.errors import TraceFormatError

FORMATS = ("mooncake", "bailian", "vllm-log", "openai-jsonl", "azure-csv", "burstgpt-csv")

_GZIP_MAGIC = b"\x1f\x8b"
_PARQUET_MAGIC = b"PAR1"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

#: How far into a file detection looks for vLLM request-logger lines (startup logs are long).
_DETECT_MAX_LINES = 20_000

#: Longest line any reader accepts. A record of MAX_TOKENS token ids written as a vLLM
#: log list is about 130 MiB; a longer "line" is a binary file or a missing newline, and
#: reading it whole would take the memory of the machine.
MAX_LINE_BYTES = 256 << 20


def json_problem(exc: ValueError) -> str:
    """Why ``json.loads`` refused a line, in words (it raises two kinds of ValueError).

    ``json.loads`` on bytes decodes them first, so a non-UTF-8 byte raises
    ``UnicodeDecodeError``, which has no ``msg`` as ``JSONDecodeError`` has.
    """
    if isinstance(exc, UnicodeDecodeError):
        bad = exc.object[exc.start:exc.start + 1]
        return f"not UTF-8 (byte 0x{bad.hex()} at column {exc.start + 1})"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg})"
    return f"not valid JSON ({exc})"


def open_binary(path: str | os.PathLike[str]) -> Any:
    """Open ``path`` for reading bytes, decompressing gzip or zstd (by magic number)."""
    p = Path(path)
    check_source(p)
    try:
        raw = open(p, "rb")  # noqa: SIM115 - returned to the caller
    except OSError as exc:
        raise TraceFormatError(f"cannot open: {exc.strerror}", path=str(p)) from None
    head = raw.read(4)
    raw.seek(0)
    if head == _PARQUET_MAGIC:
        raw.close()
        raise TraceFormatError("is a Parquet file (a trace already?): ingest reads request "
                               "logs; give the trace itself to trace stats, replay or tune",
                               path=str(p))
    if head[:2] == _GZIP_MAGIC:
        return _Decompressed(gzip.GzipFile(fileobj=raw), str(p), "gzip", raw)
    if head == _ZSTD_MAGIC:
        return _Decompressed(_ZstdFrames(raw), str(p), "zstd", raw)
    return raw


def check_source(path: Path) -> None:
    """A source must be a regular file: ingest reads it twice (format detection, then
    the records) and reports progress by position, which a pipe cannot give."""
    hint = ("save the input to a file first (e.g. `... > requests.jsonl`) and ingest that")
    if str(path) == "-":
        raise TraceFormatError(f"'-': ingest reads files, not standard input; {hint}")
    try:
        st = os.stat(path)
    except OSError:
        return  # opening it names the problem
    if stat.S_ISDIR(st.st_mode):
        raise TraceFormatError("is a folder; give the log files in it (e.g. DIR/*.jsonl)",
                               path=str(path))
    if not stat.S_ISREG(st.st_mode):
        raise TraceFormatError(f"is a pipe or device, not a file; {hint}", path=str(path))


class _ZstdFrames:
    """zstd frames read one after another; a file that ends inside a frame raises EOFError.

    ``zstandard``'s ``stream_reader`` returns what it has at the end of the input and says
    nothing, so a truncated upload would ingest as a shorter (or empty) log.
    """

    def __init__(self, raw: IO[bytes], chunk_bytes: int = 1 << 20) -> None:
        import zstandard

        self._zstd = zstandard
        self._raw = raw
        self._chunk = chunk_bytes
        self._obj = zstandard.ZstdDecompressor().decompressobj()
        self._in_frame = False
        self._buf = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buf) < size:
            data = self._raw.read(self._chunk)
            if not data:
                if self._in_frame:
                    raise EOFError("the file ends inside a zstd frame")
                break
            self._feed(data)
        if size < 0:
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:size], self._buf[size:]
        return out

    def _feed(self, data: bytes) -> None:
        while data:
            self._in_frame = True
            self._buf += self._obj.decompress(data)
            if not self._obj.eof:
                return
            self._in_frame = False
            data = self._obj.unused_data
            self._obj = self._zstd.ZstdDecompressor().decompressobj()

    def close(self) -> None:
        self._raw.close()


class _Decompressed:
    """A decompressing reader whose failures name the file.

    A truncated ``.gz`` raises ``EOFError`` mid-read, which Click takes for Ctrl-D and turns
    into a bare ``Aborted!``; corrupt data raises ``BadGzipFile``/``zlib.error``/
    ``ZstdError``. All become ``FILE: gzip data is truncated or corrupt (...)``.
    """

    def __init__(self, stream: Any, path: str, kind: str, raw: IO[bytes]) -> None:
        self._stream = stream
        self._path = path
        self._kind = kind
        self.name = path  # for messages, as an open file's name
        self.fileobj = raw  # the compressed file, for progress by bytes read

    def read(self, size: int = -1) -> bytes:
        try:
            return self._stream.read(size)
        except (EOFError, OSError, zlib.error) as exc:
            raise self._error(exc) from None
        except Exception as exc:  # zstandard.ZstdError derives from Exception only
            if type(exc).__name__ != "ZstdError":
                raise
            raise self._error(exc) from None

    def _error(self, exc: BaseException) -> TraceFormatError:
        detail = str(exc) or type(exc).__name__
        return TraceFormatError(f"{self._kind} data is truncated or corrupt ({detail})",
                                path=self._path)

    def close(self) -> None:
        self._stream.close()
        self.fileobj.close()

    def __enter__(self) -> "_Decompressed":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_line_chunks(fh: IO[bytes], chunk_bytes: int = 16 << 20) -> Iterator[tuple[int, bytes]]:
    """``(first_line_number, bytes)`` pieces of whole lines, about ``chunk_bytes`` each.

    Line numbers are 1-based. Memory stays bounded by the chunk size whatever the file size.
    """
    line_no = 1
    rest = b""
    while True:
        block = fh.read(chunk_bytes)
        if not block:
            break
        data = rest + block
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > MAX_LINE_BYTES:
                # One line may not hold the whole memory: no log writes lines this long.
                raise TraceFormatError(
                    f"line is longer than {MAX_LINE_BYTES >> 20} MiB (no newline); not a "
                    "log of one record per line", path=getattr(fh, "name", None) or None,
                    line=line_no)
            rest = data
            continue
        chunk, rest = data[:cut + 1], data[cut + 1:]
        yield line_no, chunk
        line_no += chunk.count(b"\n")
    if rest:
        yield line_no, rest + b"\n"


def iter_lines(fh: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """``(line_number, line_without_newline)`` for every line."""
    for first, chunk in iter_line_chunks(fh):
        for i, line in enumerate(chunk.split(b"\n")[:-1]):
            yield first + i, line.rstrip(b"\r")


def detect_format(path: str | os.PathLike[str]) -> str:
    """The input format of ``path``, judged by content (compressed files included).

    Rules, on the first non-empty lines: a CSV header ``TIMESTAMP,ContextTokens,...`` is
    azure-csv and ``Timestamp,Model,Request tokens,...`` burstgpt-csv; a JSON object with
    ``hash_ids`` and ``chat_id`` is bailian, with ``hash_ids`` and ``timestamp`` mooncake;
    a JSON object with ``messages``, ``prompt``, ``usage``, ``request`` or ``body`` is
    openai-jsonl; a vLLM request-logger line (``Received request`` / ``Generated
    response``) within the first 20,000 lines is vllm-log.

    Raises:
        TraceFormatError: empty file, or no rule matches.
    """
    p = str(path)
    with open_binary(path) as fh:
        first: bytes | None = None
        first_no = 0
        for line_no, line in iter_lines(fh):
            if line_no > _DETECT_MAX_LINES:
                break
            if first is None:
                if not line.strip():
                    continue
                first, first_no = line.strip(), line_no
                fmt = _classify_first_line(first)
                if fmt is not None:
                    return fmt
            if b"Received request " in line or b"Generated response " in line:
                return "vllm-log"
    if first is None:
        raise TraceFormatError("empty input: no records", path=p)
    snippet = first[:60].decode("utf-8", "replace")
    if "\ufffd" in snippet or "\x00" in snippet:
        raise TraceFormatError("format: binary data, not a text log; pass --format only for "
                               f"logs ({'|'.join(FORMATS)})", path=p, line=first_no,
                               field="format")
    raise TraceFormatError(
        f"format: unknown format (first line starts {snippet!r}); pass --format "
        f"{'|'.join(FORMATS)}", path=p, line=first_no, field="format")


def _classify_first_line(line: bytes) -> str | None:
    if line.startswith(b"{"):
        try:
            obj = json.loads(line)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        if "hash_ids" in obj:
            return "bailian" if "chat_id" in obj else "mooncake"
        if {"messages", "prompt", "usage", "request", "body", "response"} & obj.keys():
            return "openai-jsonl"
        return None
    try:
        header = next(csv.reader(io.StringIO(line.decode("utf-8-sig", "replace"))))
    except (StopIteration, csv.Error):
        return None
    cols = [c.strip().lower() for c in header]
    if cols[:3] == ["timestamp", "contexttokens", "generatedtokens"]:
        return "azure-csv"
    if cols[:4] == ["timestamp", "model", "request tokens", "response tokens"]:
        return "burstgpt-csv"
    return None
