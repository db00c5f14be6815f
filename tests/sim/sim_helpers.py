"""Helpers for the twin's tests: a tiny request type, replay helpers, random traces.

The request type has the attributes ``Simulator`` reads from ``tuner.trace.TraceRequest``
so these tests do not depend on the trace package. (A uniquely named module, not
``conftest``: several test folders have a ``conftest`` and ``from conftest import``
would pick whichever was imported first.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tuner.sim.engine import Simulator
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions


@dataclass
class Req:
    request_id: str
    arrival_s: float
    input_len: int
    output_len: int
    block_hashes: list[int]
    output_block_hashes: list[int] | None = None
    priority: int = 0


def prompt_hashes(family: int, input_len: int, block_size: int = 16,
                  shared_blocks: int | None = None, unique: int = 0) -> list[int]:
    """Chained-hash stand-ins: requests of one ``family`` share their first
    ``shared_blocks`` blocks (all by default); later blocks are unique per ``unique``."""
    n = input_len // block_size
    shared = n if shared_blocks is None else min(n, shared_blocks)
    return [family * 1_000_000 + i for i in range(shared)] + [
        (family * 1_000 + unique + 1) * 1_000_000_000 + i for i in range(shared, n)]


def session_trace(n: int, seed: int = 1, rate: float = 20.0) -> list[Req]:
    """``n`` Poisson arrivals of 20-900-token prompts over six prompt families that share
    their first 20 blocks (the fleet and P/D tests' traffic: hits to route and to keep)."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        length = rng.randint(20, 900)
        out.append(Req(f"r{i}", t, length, rng.randint(1, 60),
                       prompt_hashes(rng.randint(0, 5), length, shared_blocks=20, unique=i)))
    return out


def fixed_step(batch) -> float:
    return 0.01 + 1e-5 * batch.num_tokens


def nonlinear_step(batch) -> float:
    """A step time nonlinear in the batch sums, so that a wrong batch changes the clock."""
    return (0.004 + 3e-6 * batch.num_prefill_tokens + 2e-5 * batch.num_decode_reqs
            + 1e-8 * batch.decode_ctx_tokens + 1e-12 * batch.prefill_attn_pairs
            + 1e-7 * batch.num_decode_reqs ** 1.5)


def assert_identical(a, b) -> None:
    """Two replays gave byte-identical records (repr is exact for floats)."""
    assert repr(a.requests) == repr(b.requests)
    assert a.counters == b.counters
    assert repr(a.steps) == repr(b.steps)
    assert repr(a.itl_samples) == repr(b.itl_samples)
    assert repr(a.timeseries) == repr(b.timeseries)
    assert repr(a.simulated_s) == repr(b.simulated_s)


def replay(requests, settings=None, cache=None, **options):
    """Run the simulator with invariants checked after every step."""
    options.setdefault("check_invariants", True)
    sim = Simulator(requests, settings or SchedulerSettings(), cache or CacheSettings(),
                    fixed_step, options=SimOptions(**options))
    result = sim.run()
    check_result(requests, result)
    return sim, result


def check_result(requests, result) -> None:
    """Every non-rejected request finished with exactly its output length."""
    by_id = {r.request_id: r for r in requests}
    for rr in result.requests:
        if rr.status == "rejected":
            continue
        assert rr.status == "finished", rr
        assert rr.output_len == by_id[rr.request_id].output_len, rr
        assert rr.first_scheduled_s <= rr.first_token_s <= rr.finish_s, rr
    tokens = sum(c for _, c in result.itl_samples)
    expected = sum(r.output_len - 1 for r in result.requests if r.status == "finished")
    if "spec_num_drafts" in result.counters:  # one gap per burst (per request and step)
        assert expected - result.counters["spec_num_accepted_tokens"] <= tokens <= expected
    else:
        assert tokens == expected


def random_trace(seed: int, n: int = 40, *, block_size: int = 16, families: int = 4,
                 max_input: int = 300, max_output: int = 60, rate: float = 20.0,
                 with_output_hashes: bool = False) -> list[Req]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate)
        input_len = rng.randint(1, max_input)
        output_len = rng.randint(1, max_output)
        fam = rng.randrange(families)
        hashes = prompt_hashes(fam, input_len, block_size,
                               shared_blocks=rng.randint(0, input_len // block_size), unique=i)
        outs = None
        if with_output_hashes and rng.random() < 0.5:
            outs = [7_000_000_000_000 + i * 1000 + j for j in range(output_len // block_size + 2)]
        out.append(Req(f"r{i}", t, input_len, output_len, hashes, outs,
                       priority=rng.randint(0, 3)))
    return out


#: Which scheduler path the scheduler-level tests build: the decode-group fast path
#: (SimOptions.fast_forward=True) or the plain step; the ``both_paths`` fixture
#: (tests/sim/conftest.py) runs a test on each.
PATH = {"fast_forward": True}
