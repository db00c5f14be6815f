"""vLLM's API server as a queue in front of the engine core: the frontend's CPU cost.

``vllm serve`` (0.33.0) runs the OpenAI-compatible server in its own process (one asyncio
event loop per process, ``--api-server-count`` processes; the default is the data-parallel
size, ``entrypoints/cli/serve.py`` 107-125), beside the engine core it talks to over
ZMQ (``v1/engine/core_client.py``). Everything a client sees passes through it:

* **per request, on the way in**: the HTTP request is parsed and validated, the prompt
  rendered and tokenised (``renderers/base.py``: the Hugging Face tokenizer in a thread
  executor, still under the GIL for the Python parts), ``SamplingParams`` built and the
  request sent to the engine (``v1/engine/async_llm.py`` ``add_request``). The engine
  does not see the request before this is done, so it is on the TTFT path.
* **per output token, on the way out**: the output handler task receives each engine
  step's outputs for every running request, detokenises them incrementally
  (``v1/engine/output_processor.py`` ``process_outputs``, ``v1/engine/detokenizer.py``),
  puts a ``RequestOutput`` into each request's queue, and the streaming generator writes
  one server-sent-event chunk per token (``entrypoints/openai/`` serving code).

One process is one core: at high concurrency its work per second approaches a second
and every request waits in its queue, which is how a burst of hundreds of requests on a
small model sees TTFTs the engine alone does not explain. The model here is a single
FIFO server per API process, deterministic service, fed by the requests' intake and by
one output batch per engine step; its mean wait is the M/D/1 value
``rho S / (2 (1 - rho))`` (``S`` the mean service of one item, ``rho`` the utilisation).
Above ``rho = 1`` the server, not the engine, sets the pace: the client-side span
stretches to the server's work and the rates shrink with it.

Coefficients and their sources (:class:`ApiServerCost`):

* ``request_s`` 1 ms: the fixed per-request Python path above (FastAPI/pydantic
  parsing, chat template, sampling parameters, ZMQ send, the final response). An
  engineering estimate for one CPython core; no public per-request profile of 0.33 was
  found.
* ``prompt_token_s`` 1 µs: Hugging Face fast (Rust) tokenizers encode on the order of a
  million tokens per second on one core, so an 8k-token prompt costs about 8 ms.
* ``output_token_s`` 40 µs: incremental detokenisation, the ``RequestOutput``, the
  asyncio queue hand-off and one SSE chunk per token. Bounded by vLLM PR #11636
  (the V1 two-process API server): at 55 requests/s of 250 input / 200 output tokens
  (11,000 output tokens/s) the server was within 3 % of the offline ``LLM`` engine, so
  one process handled that rate without saturating, i.e. under about 80 µs a token.

They are priors, not fitted: the published rows with a TTFT (concurrency 64) load the
server to a few percent, so they cannot identify these costs; a burst or a
high-concurrency row would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Utilisation the M/D/1 wait is evaluated at, at most: the formula diverges at 1, and
#: above it the stretch of the span (not the wait) carries the saturation.
MAX_WAIT_UTILISATION = 0.95


@dataclass(frozen=True, slots=True)
class ApiServerCost:
    """CPU seconds the API server spends per request and per token (see the module)."""

    request_s: float = 1.0e-3  # per request: parse, render, add_request, final response; s
    prompt_token_s: float = 1.0e-6  # per prompt token: tokenisation; s
    output_token_s: float = 40e-6  # per output token: detokenise + SSE chunk; s
    servers: int = 1  # API server processes (--api-server-count), >= 1

    def request_work_s(self, input_len: np.ndarray, output_len: np.ndarray) -> np.ndarray:
        """Server CPU seconds each request costs in all (intake plus every token out)."""
        return self.request_s + self.prompt_token_s * input_len + self.output_token_s * output_len

    def intake_s(self, input_len: np.ndarray) -> np.ndarray:
        """Seconds from a request's arrival at the server to its arrival at the engine,
        without queueing: parsing and tokenising its prompt."""
        return self.request_s + self.prompt_token_s * input_len


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """How loaded the API server was over a run (for the client-side figures)."""

    utilisation: float  # server CPU seconds per second per process (rho), >= 0
    wait_s: float  # mean queueing delay of one item (M/D/1 at min(rho, 0.95)), s
    stretch: float  # client span / engine span: 1 unless rho > 1 (server-bound)


def server_load(cost: ApiServerCost, input_len: np.ndarray, output_len: np.ndarray,
                span_s: float, num_steps: int) -> ServerLoad:
    """The API server's load for a run of ``span_s`` seconds and ``num_steps`` engine steps.

    Items are the requests' intakes and one output batch per engine step (the output
    handler processes a step's outputs for all running requests at once), so the mean
    service time is the total work over requests plus steps.
    """
    work = float(cost.request_work_s(input_len, output_len).sum()) / max(1, cost.servers)
    if span_s <= 0.0 or work <= 0.0:
        return ServerLoad(0.0, 0.0, 1.0)
    rho = work / span_s
    items = len(input_len) / max(1, cost.servers) + max(1, num_steps)
    service = work / items
    r = min(rho, MAX_WAIT_UTILISATION)
    return ServerLoad(rho, r * service / (2.0 * (1.0 - r)), max(1.0, rho))


def client_ttft_s(cost: ApiServerCost, load: ServerLoad, engine_ttft_s: np.ndarray,
                  input_len: np.ndarray) -> np.ndarray:
    """TTFT as the client measures it: the intake (queued), the engine's own TTFT (from
    its arrival to its first sampled token), and the first token's way out (queued)."""
    return (engine_ttft_s + cost.intake_s(input_len) + cost.output_token_s
            + 2.0 * load.wait_s)
