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


#: The blocker's decode steps (see ``attempt``).
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


async def waiting(server: VllmServer) -> float:
    return (await server.scrape_async()).value("vllm:num_requests_waiting", 0.0)


async def queued(server: VllmServer, n: int, blocker: asyncio.Task) -> bool:
    """Wait until ``n`` requests are waiting behind the blocker; False if the blocker ended
    first (then the scenario proves nothing: the plugin never saw both at once)."""
    end = time.monotonic() + 20
    while time.monotonic() < end and not blocker.done():
        if await waiting(server) >= n:
            return True
        await asyncio.sleep(0.002)
    return False


async def attempt(server: VllmServer, seed: int) -> dict:
    warm_prompt, cold_prompt = tokens(seed, 96), tokens(seed + 1, 96)  # 3 blocks each
    warm0 = await request(server, warm_prompt, 1)  # runs alone; its 3 blocks stay cached
    first = asyncio.Event()
    # 2 blocks: one prompt token and 63 decode steps (the last sampled token takes no slot),
    # the longest a 2-block request can run, so cold and warm have time to queue behind it
    blocker = asyncio.create_task(request(server, tokens(seed + 2, 1), BLOCKER_TOKENS, first))
    await first.wait()
    cold = asyncio.create_task(request(server, cold_prompt, 1))  # arrives first ...
    cold_queued = await queued(server, 1, blocker)
    warm = asyncio.create_task(request(server, warm_prompt, 1))  # ... warm second
    both_queued = cold_queued and await queued(server, 2, blocker)
    b, c, w = await asyncio.gather(blocker, cold, warm)
    return {"warm0": warm0, "blocker": b, "cold": c, "warm": w, "both_queued": both_queued}


async def scenario(server: VllmServer) -> dict:
    """The scenario, again with fresh prompts while the blocker ended before cold and warm
    both queued (a fast CPU runs the blocker's decode steps in under half a second). Each attempt leaves the
    cache as the first found it: warm0 runs alone after the previous attempt freed all."""
    for seed in range(1, 61, 3):
        before = (await server.scrape_async()).value("vllm:prefix_cache_hits_total")
        result = await attempt(server, seed)
        after = (await server.scrape_async()).value("vllm:prefix_cache_hits_total")
        result["hits"] = after - before
        result["attempts"] = (seed + 2) // 3
        if result["both_queued"]:
            return result
    return result


def main() -> None:
    options = ServerOptions(vllm_python=sys.argv[1], model=str(MODEL_DIR), load_format="dummy",
                            block_size=32, num_gpu_blocks=5, max_model_len=128, dtype="float32",
                            enforce_eager=True, env=CPU_ENV, startup_timeout_s=400,
                            request_timeout_s=60)
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
