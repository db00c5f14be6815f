"""The streaming replay client against a fake OpenAI server (no vLLM): chunked SSE, usage,
errors, rejections and timeouts are all counted, nothing is dropped."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from tuner.serve.backend import replay_on_server
from tuner.serve.server import ServerOptions, VllmServer
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.trace import TraceRequest

METRICS = ('vllm:prefix_cache_queries_total{engine="0"} %d\n'
           'vllm:prefix_cache_hits_total{engine="0"} %d\n'
           'vllm:num_preemptions_total{engine="0"} 0\n'
           'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
           'vllm:cache_config_info{block_size="32",enable_prefix_caching="True"} 1\n')


class FakeServer:
    """Streams ``max_tokens`` tokens in chunked SSE; prompt[0] picks a misbehaviour:
    500 -> HTTP 500, 400 -> HTTP 400, 777 -> stalls, 555 -> stream cut short."""

    def __init__(self) -> None:
        self.queries = 0
        self.loop = asyncio.new_event_loop()
        self.port = 0
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            server = self.loop.run_until_complete(
                asyncio.start_server(self.handle, "127.0.0.1", 0))
            self.port = server.sockets[0].getsockname()[1]
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        started.wait(5)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        line = head.split("\r\n", 1)[0]
        length = 0
        for h in head.split("\r\n"):
            if h.lower().startswith("content-length:"):
                length = int(h.split(":", 1)[1])
        body = json.loads(await reader.readexactly(length)) if length else {}
        path = line.split()[1]
        if path == "/metrics":
            text = METRICS % (self.queries, self.queries // 2)
            writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(text)}\r\n\r\n{text}".encode())
        elif path == "/v1/models":
            text = json.dumps({"data": [{"id": "fake"}]})
            writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(text)}\r\n\r\n{text}".encode())
        elif path == "/v1/completions":
            await self.complete(body, writer)
        else:
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def complete(self, body: dict, writer: asyncio.StreamWriter) -> None:
        first = body["prompt"][0]
        if first in (400, 500):
            err = json.dumps({"error": {"message": f"fake {first}"}})
            writer.write(f"HTTP/1.1 {first} X\r\nContent-Length: {len(err)}\r\n\r\n{err}".encode())
            return
        self.queries += len(body["prompt"])
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")

        def chunk(obj: str) -> bytes:
            data = f"data: {obj}\n\n".encode()
            return f"{len(data):x}\r\n".encode() + data + b"\r\n"

        n = body["max_tokens"] - (1 if first == 555 else 0)
        for i in range(n):
            if first == 777:
                await asyncio.sleep(5)
            writer.write(chunk(json.dumps({"choices": [{"token_ids": [10 + i],
                                                         "finish_reason": None}]})))
            await writer.drain()
            await asyncio.sleep(0.002)
        usage = {"prompt_tokens": len(body["prompt"]),
                 "prompt_tokens_details": {"cached_tokens": 32}}
        writer.write(chunk(json.dumps({"choices": [], "usage": usage})))
        writer.write(chunk("[DONE]") + b"0\r\n\r\n")

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def fake():  # type: ignore[no-untyped-def]
    srv = FakeServer()
    yield srv
    srv.close()


def _req(rid: str, first_block: int, output_len: int, arrival: float = 0.0) -> TraceRequest:
    return TraceRequest(request_id=rid, arrival_s=arrival, input_len=40, output_len=output_len,
                        block_hashes=(first_block,))


def _attach(fake: FakeServer, timeout_s: float = 60.0) -> VllmServer:
    return VllmServer(ServerOptions(endpoint=f"http://127.0.0.1:{fake.port}",
                                    request_timeout_s=timeout_s, metrics_interval_s=0.05)
                      ).start(None)


def test_tokens_usage_and_counters_from_a_chunked_stream(fake: FakeServer) -> None:
    server = _attach(fake)
    assert server.model_name == "fake"
    reqs = [_req(f"r{i}", 100 + i, 5, arrival=0.01 * i) for i in range(4)]
    result = replay_on_server(server, reqs, block_size=32, load=OpenLoop(speedup=2.0))
    assert [r.status for r in result.requests] == ["finished"] * 4
    assert [r.output_len for r in result.requests] == [5] * 4
    assert all(r.num_cached_tokens == 32 and r.input_len == 40 for r in result.requests)
    assert all(r.first_token_s <= r.finish_s for r in result.requests)
    assert sum(n for _, n in result.itl_samples) == 4 * 4
    assert result.counters["prefix_cache_queries"] == 160
    assert result.counters["prefix_cache_hits"] == 80
    assert result.counters["num_errors"] == 0


def test_errors_rejections_and_short_streams_are_counted(fake: FakeServer) -> None:
    server = _attach(fake)
    # a block hash whose first token is 500/400/555 is hard to pick: patch the prompt instead
    from tuner.serve import client as serve_client

    original = serve_client.prompt_tokens
    firsts = {"ok": 9, "boom": 500, "bad": 400, "short": 555}

    def fake_prompt(factory, request):  # type: ignore[no-untyped-def]
        toks = original(factory, request)
        toks[0] = firsts[request.request_id]
        return toks

    serve_client.prompt_tokens = fake_prompt
    try:
        reqs = [_req(name, 1, 4) for name in firsts]
        result = replay_on_server(server, reqs, block_size=32, load=ClosedLoop(2))
    finally:
        serve_client.prompt_tokens = original
    status = {r.request_id: r.status for r in result.requests}
    assert status == {"ok": "finished", "boom": "error", "bad": "rejected", "short": "error"}
    assert result.counters["num_errors"] == 2 and result.counters["num_rejected"] == 1
    assert any("fake 500" in n for n in result.notes)
    assert {r.request_id: r.output_len for r in result.requests}["short"] == 3


def test_a_stalled_request_times_out_as_an_error(fake: FakeServer) -> None:
    server = _attach(fake, timeout_s=0.5)
    from tuner.serve import client as serve_client

    original = serve_client.prompt_tokens

    def stall(factory, request):  # type: ignore[no-untyped-def]
        toks = original(factory, request)
        toks[0] = 777 if request.request_id == "slow" else 9
        return toks

    serve_client.prompt_tokens = stall
    try:
        result = replay_on_server(server, [_req("slow", 1, 3), _req("fast", 2, 3)],
                                  block_size=32, load=ClosedLoop(2))
    finally:
        serve_client.prompt_tokens = original
    status = {r.request_id: r.status for r in result.requests}
    assert status == {"slow": "error", "fast": "finished"}
    assert result.counters["num_timeouts"] == 1


def test_a_closed_loop_without_the_missed_step_is_refused_on_a_real_server() -> None:
    """A real closed loop sends a replacement when the stream ended, after the engine
    scheduled its next step (docs/step-time-model.md §1.4): the twin-only switch that
    skips that step (the benchmark fit's recording) cannot describe a server replay."""
    from tuner.errors import ConfigError
    from tuner.serve.client import ReplayPlan

    ReplayPlan(requests=[], block_size=32, load=ClosedLoop(2))
    with pytest.raises(ConfigError, match="replacement_misses_step=False"):
        ReplayPlan(requests=[], block_size=32,
                   load=ClosedLoop(2, replacement_misses_step=False))
