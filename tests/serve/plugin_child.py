"""Child process for test_serve_plugin.py: launch a server with the PR #54625 plugin, run
the warm/cold eviction scenario, print the result as one JSON line, then wait to be
interrupted (the parent sends SIGINT, as Ctrl-C would, and checks the server is gone).

Usage: python plugin_child.py VLLM_PYTHON
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

from serve_env import CPU_ENV, MODEL_DIR

import tuner.serve.http as http
from tuner.serve.server import ServerOptions, VllmServer
from tuner.sim.settings import SchedulerSettings

# 5 blocks of 32 (block 0 is the null block: 4 usable, 128 tokens), one request at a time.
SETTINGS = SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=1,
                             cache_aware_admission_window=4, cache_aware_admission_threshold=0.0)


#: The blocker's decode steps (see ``scenario``).
BLOCKER_TOKENS = 63


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(3, 999) for _ in range(n)]


async def request(server: VllmServer, prompt: list[int], max_tokens: int,
                  first: asyncio.Event | None = None) -> dict:
    payload = {"model": server.model_name, "prompt": prompt, "max_tokens": max_tokens,
               "ignore_eos": True, "temperature": 0.0, "stream": True, "return_token_ids": True,
               "stream_options": {"include_usage": True}}
    out = {"first_s": None, "cached": None, "tokens": 0}
    assert server.endpoint is not None
    async with http.SseStream(server.endpoint, "/v1/completions", payload) as events:
        async for t, obj in events:
            for choice in obj.get("choices") or ():
                if choice.get("token_ids") and out["first_s"] is None:
                    out["first_s"] = t
                    if first is not None:
                        first.set()
                out["tokens"] += len(choice.get("token_ids") or [])
            usage = obj.get("usage")
            if usage:
                out["cached"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return out


async def engine_call(server: VllmServer, path: str) -> None:
    """POST one of vLLM's development endpoints (VLLM_SERVER_DEV_MODE=1) and check it worked."""
    assert server.endpoint is not None
    status, body = await http.post_json(server.endpoint, path, {})
    if status != 200:
        raise RuntimeError(f"POST {path}: HTTP {status}: {body[:200]!r}")


def added_requests(server: VllmServer) -> int:
    """How many requests the API server has handed to the engine core: the
    ``Added request`` lines ``--enable-log-requests`` logs after each send."""
    assert server.log_path is not None
    with open(server.log_path, errors="replace") as log:
        return log.read().count("Added request ")


async def wait_added(server: VllmServer, n: int) -> None:
    """Wait until the engine core has been sent ``n`` requests in all (60 s at most):
    the engine is paused, so nothing races this wait."""
    end = time.monotonic() + 60
    while added_requests(server) < n:
        if time.monotonic() > end:
            raise RuntimeError(f"the server logged {added_requests(server)} added requests, "
                               f"expected {n}: {server.log_path}")
        await asyncio.sleep(0.01)


async def scenario(server: VllmServer) -> dict:
    """The PR's eviction scenario, made deterministic with vLLM's pause: while the blocker
    runs, ``/pause?mode=keep`` freezes the engine (no step, queued requests stay queued),
    cold and then warm are added -- each send confirmed by the server's own log before the
    next, so they reach the engine in that order -- and ``/resume`` lets the blocker finish.
    At its end both wait together and the scheduler picks which to admit. No timing race:
    on a fast CPU the 63-step blocker ends in a quarter second, faster than a metrics
    scrape under load, which made the earlier wait-and-retry version flaky."""
    warm_prompt, cold_prompt = tokens(1, 96), tokens(2, 96)  # 3 blocks each
    before = (await server.scrape_async()).value("vllm:prefix_cache_hits_total")
    warm0 = await request(server, warm_prompt, 1)  # runs alone; its 3 blocks stay cached
    first = asyncio.Event()
    # 2 blocks: one prompt token and 63 decode steps (the last sampled token takes no slot)
    blocker = asyncio.create_task(request(server, tokens(3, 1), BLOCKER_TOKENS, first))
    await first.wait()
    # keep: freeze the running blocker too; clear_cache=false: keep warm0's cached blocks
    await engine_call(server, "/pause?mode=keep&clear_cache=false")
    sent = added_requests(server)
    cold = asyncio.create_task(request(server, cold_prompt, 1))  # arrives first ...
    await wait_added(server, sent + 1)
    warm = asyncio.create_task(request(server, warm_prompt, 1))  # ... warm second
    await wait_added(server, sent + 2)
    await engine_call(server, "/resume")
    b, c, w = await asyncio.gather(blocker, cold, warm)
    after = (await server.scrape_async()).value("vllm:prefix_cache_hits_total")
    return {"warm0": warm0, "blocker": b, "cold": c, "warm": w, "hits": after - before}


def main() -> None:
    options = ServerOptions(vllm_python=sys.argv[1], model=str(MODEL_DIR), load_format="dummy",
                            block_size=32, num_gpu_blocks=5, max_model_len=128, dtype="float32",
                            enforce_eager=True, startup_timeout_s=400, request_timeout_s=60,
                            # the pause/resume endpoints and the "Added request" log lines
                            env=CPU_ENV + (("VLLM_SERVER_DEV_MODE", "1"),),
                            extra_args=("--enable-log-requests",))
    server = VllmServer(options).start(SETTINGS)
    result = asyncio.run(scenario(server))
    result["pgid"] = server.pgid
    result["startup_s"] = server.startup_s
    result["command"] = server.command
    print(json.dumps(result), flush=True)
    while True:  # until the parent's SIGINT (KeyboardInterrupt after the server is stopped)
        time.sleep(0.5)


if __name__ == "__main__":
    main()
