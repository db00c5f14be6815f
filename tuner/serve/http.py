"""A minimal asyncio HTTP/1.1 client for vLLM's OpenAI server: one request per connection.

Why not aiohttp/httpx: tuner's environment has neither, and the replay needs only two
things -- ``GET`` a small body (``/health``, ``/metrics``) and ``POST`` a JSON body whose
streamed Server-Sent-Events response is read line by line with the client time of each
event. uvicorn answers a stream with ``Transfer-Encoding: chunked`` and everything else
with ``Content-Length``; both are handled, nothing else (no TLS, no redirects, no
keep-alive: ``Connection: close`` keeps the state machine trivial and costs one local TCP
handshake per request, well under a millisecond next to a model step).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any


class HttpError(ConnectionError):
    """The server could not be reached, closed early or answered malformed HTTP."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Host, port and path prefix of a base URL such as ``http://127.0.0.1:8000``."""

    host: str
    port: int
    prefix: str  # path before /v1/..., usually ""

    @classmethod
    def parse(cls, url: str) -> "Endpoint":
        parts = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme != "http":
            raise ValueError(f"endpoint {url!r}: only plain http:// is supported")
        if not parts.hostname:
            raise ValueError(f"endpoint {url!r} has no host")
        return cls(parts.hostname, parts.port or 80, parts.path.rstrip("/"))

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.prefix}"


async def _open(ep: Endpoint, method: str, path: str, body: bytes | None
                ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int, dict[str, str]]:
    try:
        reader, writer = await asyncio.open_connection(ep.host, ep.port, limit=1 << 22)
    except OSError as exc:
        raise HttpError(f"cannot connect to {ep.url}: {exc.strerror or exc}") from None
    head = [f"{method} {ep.prefix}{path} HTTP/1.1", f"Host: {ep.host}:{ep.port}",
            "Connection: close", "Accept: */*"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + (body or b""))
    try:
        await writer.drain()
        status_line = await reader.readline()
        if not status_line:
            raise HttpError(f"{ep.url}{path}: connection closed before a response")
        parts = status_line.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise HttpError(f"{ep.url}{path}: malformed status line {status_line[:80]!r}")
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
    except (OSError, asyncio.IncompleteReadError) as exc:
        writer.close()
        raise HttpError(f"{ep.url}{path}: {exc}") from None
    except BaseException:
        writer.close()
        raise
    return reader, writer, int(parts[1]), headers


async def _body_chunks(reader: asyncio.StreamReader, headers: dict[str, str]
                       ) -> AsyncIterator[bytes]:
    """The response body as it arrives (de-chunked)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise HttpError("connection closed inside a chunked body")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()  # trailer end
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)  # CRLF after each chunk
            yield data
    elif "content-length" in headers:
        remaining = int(headers["content-length"])
        while remaining > 0:
            data = await reader.read(min(remaining, 1 << 16))
            if not data:
                raise HttpError("connection closed before Content-Length bytes arrived")
            remaining -= len(data)
            yield data
    else:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                return
            yield data


async def get(ep: Endpoint, path: str) -> tuple[int, bytes]:
    """``GET path`` -> (status, body)."""
    return await _whole_response(ep, "GET", path, None)


async def post_json(ep: Endpoint, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
    """``POST path`` with a JSON body -> (status, body), not streamed."""
    return await _whole_response(ep, "POST", path, json.dumps(payload).encode())


async def _whole_response(ep: Endpoint, method: str, path: str,
                          body: bytes | None) -> tuple[int, bytes]:
    """Send one request and read its whole body; a broken body is an :class:`HttpError`."""
    reader, writer, status, headers = await _open(ep, method, path, body)
    try:
        data = b"".join([c async for c in _body_chunks(reader, headers)])
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        raise HttpError(f"{ep.url}{path}: {exc}") from None
    finally:
        writer.close()
    return status, data


class SseStream:
    """``POST`` a JSON body and iterate the Server-Sent-Events ``data:`` payloads.

    Each item is ``(t_s, obj)``: ``time.perf_counter()`` when the event's line was
    complete, and the decoded JSON (``[DONE]`` ends the iteration). A non-200 answer raises
    :class:`HttpError` with the server's message. Use as ``async with``.
    """

    def __init__(self, ep: Endpoint, path: str, payload: dict[str, Any]) -> None:
        self._ep, self._path, self._payload = ep, path, payload
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> AsyncIterator[tuple[float, Any]]:
        reader, writer, status, headers = await _open(
            self._ep, "POST", self._path, json.dumps(self._payload).encode())
        self._writer = writer
        if status != 200:
            try:
                body = b"".join([c async for c in _body_chunks(reader, headers)])
            except (OSError, asyncio.IncompleteReadError, ValueError, HttpError):
                body = b""
            raise HttpError(f"HTTP {status} from {self._path}: {_message(body)}")
        return self._events(reader, headers)

    async def __aexit__(self, *exc: Any) -> None:
        if self._writer is not None:
            self._writer.close()

    async def _events(self, reader: asyncio.StreamReader, headers: dict[str, str]
                      ) -> AsyncIterator[tuple[float, Any]]:
        buf = b""
        try:
            async for chunk in _body_chunks(reader, headers):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    yield time.perf_counter(), json.loads(data)
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise HttpError(f"{self._path}: stream broken: {exc}") from None
        raise HttpError(f"{self._path}: stream ended without [DONE]")


def _message(body: bytes) -> str:
    """The ``message`` of an OpenAI-style error body, else its first 200 characters."""
    try:
        obj = json.loads(body)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:300]
    except (ValueError, AttributeError):
        pass
    return body[:200].decode("utf-8", "replace")
