"""``synthesize``: deterministic synthetic traffic (agentic, chat, rag, random).

Every kind models a token stream per session and derives block ids from it at
``hash_block_size`` granularity, so prefix sharing is exactly what that stream implies:

* **agentic**: a few shared system-prompt variants (tools + instructions, 8-16k tokens),
  then a task; each turn's prompt is the previous prompt + the previous output + a tool
  result (or, now and then, a user message after a human think time). Turns follow one
  another after the assumed service time of the previous turn plus a tool delay, so a
  session's requests never overlap. A session whose context would pass
  ``max_context_tokens`` compacts: it restarts from its system prompt plus a summary.
* **chat**: shorter sessions, a shared system prompt, user messages after human think
  times.
* **rag**: single-turn requests: a shared system prompt, ``docs_per_request`` documents
  retrieved from a Zipf-popular corpus (most relevant first), and a question.
* **random**: ``num_prompts`` unique prompts with lengths uniform in
  ``[range_ratio * isl, isl]`` and outputs in ``[range_ratio * osl, osl]``, as
  ``vllm bench serve --dataset-name random`` (InferenceMAX runs); all at t=0 unless a
  ``rate`` is given.

Block ids (no content exists, so nothing is salted): a block made only of shared content
(system prompts, documents) gets the same id wherever the same content follows the same
parent block; every other block gets a fresh id. Ids are ``tag << 32 | counter`` with a
seed-derived 32-bit tag: near-sequential values that compress to a few bytes each in
Parquet (the bundled 1-hour sample stays small) and cannot meet another trace's salted
64-bit hashes in practice. The prompt's partial last block gets its own id, and the
blocks that a turn's generated tokens complete are listed in ``output_block_hashes``;
the next turn's prompt repeats them, as vLLM's cache would see it.

Determinism: one ``numpy.random.Generator`` (PCG64) per session seeded by ``(seed,
session)``; the same arguments give the same rows and byte-identical Parquet files.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from tuner.errors import ConfigError
from tuner.trace.reblock import mix64
from tuner.trace.schema import MAX_SPAN_S, MAX_TOKENS, SCHEMA, TraceMetadata
from tuner.trace.store import Trace

Kind = Literal["agentic", "chat", "rag", "random"]
KINDS = ("agentic", "chat", "rag", "random")


@dataclass(frozen=True)
class AgenticParams:
    """Shape of agentic (coding-agent style) sessions; token counts are means."""

    system_prompt_variants: int = 4  # distinct shared system prompts
    system_prompt_tokens: tuple[int, int] = (8_000, 16_000)  # uniform range per variant
    task_tokens: float = 1_500  # first user message (lognormal mean)
    turns: float = 20  # LLM calls per session (geometric, mean)
    max_turns: int = 200
    output_tokens: float = 350  # per call (lognormal mean, sigma 0.9)
    max_output_tokens: int = 8_192
    tool_output_tokens: float = 2_500  # tool result appended after a call (lognormal mean, sigma 1.0)
    max_tool_output_tokens: int = 32_000
    tool_delay_s: float = 2.0  # tool execution between calls (lognormal mean)
    user_turn_prob: float = 0.08  # chance a gap is a human message instead of a tool result
    user_tokens: float = 200
    think_time_s: float = 30.0  # human think time (lognormal mean)
    max_context_tokens: int = 131_072  # compaction threshold (Llama-3.1 context)
    summary_tokens: int = 4_000  # context kept after compaction (besides the system prompt)
    assumed_decode_tps: float = 40.0  # per-request decode speed used to space turns
    assumed_prefill_tps: float = 20_000.0  # uncached prefill speed used to space turns


@dataclass(frozen=True)
class ChatParams:
    system_prompt_variants: int = 3
    system_prompt_tokens: tuple[int, int] = (300, 2_000)
    turns: float = 3.5
    max_turns: int = 40
    user_tokens: float = 150
    output_tokens: float = 350
    max_output_tokens: int = 4_096
    think_time_s: float = 25.0
    assumed_decode_tps: float = 40.0
    assumed_prefill_tps: float = 20_000.0


@dataclass(frozen=True)
class RagParams:
    system_prompt_tokens: int = 800
    corpus_size: int = 20_000
    zipf_a: float = 1.2
    docs_per_request: int = 5
    doc_tokens: float = 500
    question_tokens: float = 60
    output_tokens: float = 250
    max_output_tokens: int = 4_096


@dataclass(frozen=True)
class RandomParams:
    isl: int = 1_024
    osl: int = 1_024
    range_ratio: float = 1.0
    num_prompts: int = 640


_PARAMS = {"agentic": AgenticParams, "chat": ChatParams, "rag": RagParams, "random": RandomParams}


class _Ids:
    """Block-id allocator: ``tag << 32 | counter``."""

    def __init__(self, seed: int, kind: str) -> None:
        tag = mix64(seed * 0x100000001B3 + sum(map(ord, kind))) & 0xFFFF_FFFF
        self.base = (tag | 1) << 32
        self.counter = 0

    def next(self) -> int:
        self.counter += 1
        return self.base | self.counter

    def take(self, n: int) -> range:
        start = self.base | (self.counter + 1)
        self.counter += n
        return range(start, start + n)


class _Stream:
    """One growing token stream cut into blocks (append-only; see module doc)."""

    __slots__ = ("hbs", "ids", "memo", "full", "tail_len", "tail_key")

    def __init__(self, hbs: int, ids: _Ids, memo: dict[Any, int]) -> None:
        self.hbs, self.ids, self.memo = hbs, ids, memo
        self.full: list[int] = []
        self.tail_len = 0
        self.tail_key: tuple[Any, ...] | None = ()  # None once the tail holds unique tokens

    def copy(self) -> "_Stream":
        s = _Stream(self.hbs, self.ids, self.memo)
        s.full, s.tail_len, s.tail_key = list(self.full), self.tail_len, self.tail_key
        return s

    @property
    def num_tokens(self) -> int:
        return len(self.full) * self.hbs + self.tail_len

    def add(self, length: int, shared_key: Any = None) -> None:
        """Append ``length`` tokens: unique ones, or shared content named ``shared_key``."""
        pos, hbs = 0, self.hbs
        while pos < length:
            if shared_key is None and self.tail_len == 0 and length - pos >= hbs:
                n = (length - pos) // hbs  # fast path: whole unique blocks
                self.full.extend(self.ids.take(n))
                pos += n * hbs
                continue
            take = min(hbs - self.tail_len, length - pos)
            if shared_key is None:
                self.tail_key = None
            elif self.tail_key is not None:
                self.tail_key = self.tail_key + ((shared_key, pos, pos + take),)
            self.tail_len += take
            pos += take
            if self.tail_len == hbs:
                self.full.append(self._block_id(self.tail_key))
                self.tail_len, self.tail_key = 0, ()

    def _block_id(self, key: tuple[Any, ...] | None, partial: bool = False) -> int:
        if key is None:
            return self.ids.next()
        memo_key = (self.full[-1] if self.full else 0, key, partial)
        bid = self.memo.get(memo_key)
        if bid is None:
            bid = self.memo[memo_key] = self.ids.next()
        return bid

    def partial_id(self) -> int | None:
        return self._block_id(self.tail_key, partial=True) if self.tail_len else None


@dataclass
class _Row:
    request_id: str
    arrival_s: float
    input_len: int
    output_len: int
    chain: int  # index into the chains list
    n_prompt_full: int
    partial: int | None
    n_after_output: int
    session_id: str | None
    parent_id: str | None
    turn: int | None


class _Builder:
    def __init__(self, hbs: int, seed: int, kind: str) -> None:
        self.hbs = hbs
        self.ids = _Ids(seed, kind)
        self.memo: dict[Any, int] = {}
        self.rows: list[_Row] = []
        self.chains: list[list[int]] = []

    def new_chain(self, stream: _Stream) -> int:
        self.chains.append(stream.full)  # the stream keeps appending to this same list
        return len(self.chains) - 1

    def table(self) -> pa.Table:
        rows = self.rows
        chains = [np.asarray(c, dtype=np.uint64) for c in self.chains]
        pvals, plens, ovals, olens = [], [], [], []
        for r in rows:
            arr = chains[r.chain]
            pv = arr[:r.n_prompt_full]
            if r.partial is not None:
                pv = np.concatenate([pv, np.asarray([r.partial], dtype=np.uint64)])
            pvals.append(pv)
            plens.append(len(pv))
            ov = arr[r.n_prompt_full:r.n_after_output]
            ovals.append(ov)
            olens.append(len(ov))
        return pa.table({
            "request_id": pa.array([r.request_id for r in rows], pa.string()),
            "arrival_s": pa.array([r.arrival_s for r in rows], pa.float64()),
            "input_len": pa.array([r.input_len for r in rows], pa.int32()),
            "output_len": pa.array([r.output_len for r in rows], pa.int32()),
            "block_hashes": _list_array(pvals, plens),
            "output_block_hashes": _list_array(ovals, olens),
            "session_id": pa.array([r.session_id for r in rows], pa.string()),
            "parent_id": pa.array([r.parent_id for r in rows], pa.string()),
            "turn": pa.array([r.turn for r in rows], pa.int32()),
            "priority": pa.array([0] * len(rows), pa.int32()),
            "cache_salt": pa.nulls(len(rows), pa.string()),
            "model": pa.nulls(len(rows), pa.string()),
            "status": pa.nulls(len(rows), pa.string()),
        }, schema=SCHEMA.remove_metadata())


def _list_array(vals: list[np.ndarray], lens: list[int]) -> pa.ListArray:
    offsets = np.concatenate([[0], np.cumsum(lens, dtype=np.int64)])
    flat = np.concatenate(vals) if vals else np.zeros(0, dtype=np.uint64)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, pa.uint64()))


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, lo: int, hi: int) -> int:
    """An integer lognormal draw with the given *mean* (not median), clipped to [lo, hi]."""
    mu = math.log(max(mean, 1e-9)) - sigma * sigma / 2
    return int(min(hi, max(lo, round(rng.lognormal(mu, sigma)))))


def _lognormal_s(rng: np.random.Generator, mean: float, sigma: float = 0.8) -> float:
    mu = math.log(max(mean, 1e-9)) - sigma * sigma / 2
    return float(rng.lognormal(mu, sigma))


def synthesize(kind: Kind, *, duration_s: float | None = None, rate: float | None = None,
               seed: int = 0, hash_block_size: int = 64, **params: Any) -> Trace:
    """A deterministic synthetic trace.

    Args:
        kind: ``agentic``, ``chat``, ``rag`` or ``random``.
        duration_s: trace length in seconds (required except for ``random``).
        rate: mean requests per second (sessions start at ``rate / mean turns``); for
            ``random``, a Poisson rate, or ``None``/``inf`` for all requests at t=0.
        seed: the only source of randomness.
        hash_block_size: tokens per block id (64 matches vLLM's block size on ROCm).
        **params: fields of the kind's parameter dataclass (:class:`AgenticParams`,
            :class:`ChatParams`, :class:`RagParams`, :class:`RandomParams`).

    Raises:
        ConfigError: unknown kind or parameter, or missing/invalid duration or rate.
    """
    if kind not in _PARAMS:
        raise ConfigError(f"unknown synth kind {kind!r}; choose one of {', '.join(KINDS)}")
    cls = _PARAMS[kind]
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ConfigError(f"unknown {kind} parameter(s) {unknown}; known: {sorted(known)}")
    p = _check_params(_with_ranges(cls(**params), kind), kind)
    if not 1 <= hash_block_size <= MAX_TOKENS:
        raise ConfigError(f"hash_block_size must be 1 to {MAX_TOKENS:,}, got {hash_block_size}")
    if kind != "random":
        if not duration_s or not duration_s > 0:
            raise ConfigError(f"{kind} needs a positive duration (--duration), got {duration_s}")
        if not duration_s <= MAX_SPAN_S:
            raise ConfigError(f"--duration {duration_s:g} s: a trace spans at most "
                              f"{MAX_SPAN_S / 86400:.0f} days")
        if not rate or not 0 < rate < math.inf:  # NaN fails too
            raise ConfigError(f"{kind} needs a positive finite rate (--rate), got {rate}")
        if rate * duration_s > MAX_SYNTH_REQUESTS:
            raise ConfigError(f"--rate {rate:g} x --duration {duration_s:g} s is about "
                              f"{rate * duration_s:.3g} requests; synth makes at most "
                              f"{MAX_SYNTH_REQUESTS:,}")
    elif rate is not None and not 0 < rate <= math.inf:
        raise ConfigError(f"--rate {rate}: must be > 0 (omit it for all requests at t=0)")
    b = _Builder(hash_block_size, seed, kind)
    if kind == "agentic":
        _agentic(b, p, duration_s, rate, seed)  # type: ignore[arg-type]
    elif kind == "chat":
        _chat(b, p, duration_s, rate, seed)  # type: ignore[arg-type]
    elif kind == "rag":
        _rag(b, p, duration_s, rate, seed)  # type: ignore[arg-type]
    else:
        _random(b, p, rate, seed)  # type: ignore[arg-type]
    if not b.rows:
        raise ConfigError(f"{kind} synth produced no requests; raise --rate or --duration")
    meta = TraceMetadata(hash_block_size=hash_block_size, source_format=f"synth:{kind}",
                         tokenizer=None, salt_fingerprint=None)
    return Trace.from_arrow(b.table(), meta)


#: Requests one synth call makes at most (memory: a row holds its block hashes).
MAX_SYNTH_REQUESTS = 10_000_000

#: Bounds of the kinds' parameters by name: (lowest, highest); a lowest of None means
#: "more than 0". Every other number must be finite and in [0, 1e9].
_PARAM_BOUNDS: dict[str, tuple[float | None, float]] = {
    "turns": (1, 10_000), "max_turns": (1, 10_000), "system_prompt_variants": (1, 100_000),
    "corpus_size": (1, 10_000_000), "docs_per_request": (0, 10_000),
    "num_prompts": (1, MAX_SYNTH_REQUESTS), "user_turn_prob": (0, 1),
    "zipf_a": (None, 100), "assumed_decode_tps": (None, 1e9), "assumed_prefill_tps": (None, 1e9),
    "isl": (1, MAX_TOKENS), "osl": (1, MAX_TOKENS),
}


def _check_params(p: Any, kind: str) -> Any:
    """Every parameter a finite number in its range (``--param turns=-3`` ended in a
    traceback; a huge one would allocate without bound)."""
    for f in dataclasses.fields(p):
        value = getattr(p, f.name)
        values = value if isinstance(value, tuple) else (value,)
        lo, hi = _PARAM_BOUNDS.get(
            f.name, (0, MAX_TOKENS if "tokens" in f.name else 1e9))
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"{kind} parameter {f.name}: expected a finite number, "
                                  f"got {v!r}")
            if (v <= 0 if lo is None else v < lo) or v > hi:
                low = "more than 0" if lo is None else f"at least {lo:g}"
                raise ConfigError(f"{kind} parameter {f.name}: {v!r} must be {low} and at "
                                  f"most {hi:,.0f}")
        if isinstance(value, tuple) and value[0] > value[1]:
            raise ConfigError(f"{kind} parameter {f.name}: range {list(value)} has lo > hi")
    return p


def _with_ranges(p: Any, kind: str) -> Any:
    """Accept ``N`` or ``[lo, hi]`` for range-valued parameters (``--param x=N`` gives an int)."""
    changes = {}
    for f in dataclasses.fields(p):
        value = getattr(p, f.name)
        if not isinstance(f.default, tuple) or isinstance(value, tuple):
            continue
        try:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                changes[f.name] = (int(value), int(value))
            elif isinstance(value, list) and len(value) == 2:
                changes[f.name] = (int(value[0]), int(value[1]))
            else:
                raise ValueError(value)
        except (TypeError, ValueError, OverflowError):  # NaN, inf, text
            raise ConfigError(f"{kind} parameter {f.name} must be N or [lo, hi], "
                              f"got {value!r}") from None
    return dataclasses.replace(p, **changes) if changes else p


def _session_starts(rng: np.random.Generator, session_rate: float, lo: float, hi: float) -> np.ndarray:
    n = rng.poisson(session_rate * (hi - lo))
    return np.sort(rng.uniform(lo, hi, size=n))


def _variants(b: _Builder, rng: np.random.Generator, n: int, lo: int, hi: int) -> list[_Stream]:
    out = []
    for v in range(n):
        s = _Stream(b.hbs, b.ids, b.memo)
        s.add(int(rng.integers(lo, hi + 1)), shared_key=("system", v))
        out.append(s)
    return out


def _agentic(b: _Builder, p: AgenticParams, duration: float, rate: float, seed: int) -> None:
    top = np.random.default_rng([seed, 0])
    systems = _variants(b, top, p.system_prompt_variants, *p.system_prompt_tokens)
    mean_gap = p.output_tokens / p.assumed_decode_tps + p.tool_delay_s
    warmup = 2 * p.turns * mean_gap  # start sessions early so t=0 is already steady state
    starts = _session_starts(top, rate / p.turns, -warmup, duration)
    for si, start in enumerate(starts):
        rng = np.random.default_rng([seed, 1, si])
        variant = int(rng.integers(0, p.system_prompt_variants))
        stream = systems[variant].copy()
        stream.add(_lognormal(rng, p.task_tokens, 0.8, 16, 32_000))
        chain = b.new_chain(stream)
        n_turns = max(1, min(p.max_turns, int(rng.geometric(1.0 / max(p.turns, 1.0)))))
        t, parent, new_tokens = float(start), None, stream.num_tokens
        sid = f"agentic-{si:06d}"
        for turn in range(1, n_turns + 1):
            out_len = _lognormal(rng, p.output_tokens, 0.9, 1, p.max_output_tokens)
            if stream.num_tokens + out_len > p.max_context_tokens:  # compaction
                stream = systems[variant].copy()
                stream.add(p.summary_tokens)
                chain = b.new_chain(stream)
                new_tokens = stream.num_tokens
            rid = f"{sid}-{turn:03d}"
            n_full, partial, n_in = len(stream.full), stream.partial_id(), stream.num_tokens
            stream.add(out_len)
            if t >= 0 and t < duration:
                b.rows.append(_Row(rid, t, n_in, out_len, chain, n_full, partial,
                                   len(stream.full), sid, parent, turn))
                parent = rid
            elif t >= duration:
                break
            service = new_tokens / p.assumed_prefill_tps + out_len / p.assumed_decode_tps
            if rng.random() < p.user_turn_prob:
                gap = _lognormal_s(rng, p.think_time_s)
                added = _lognormal(rng, p.user_tokens, 0.8, 1, 8_000)
            else:
                gap = _lognormal_s(rng, p.tool_delay_s)
                added = _lognormal(rng, p.tool_output_tokens, 1.0, 1, p.max_tool_output_tokens)
            stream.add(added)
            new_tokens = added + out_len
            t += service + gap


def _chat(b: _Builder, p: ChatParams, duration: float, rate: float, seed: int) -> None:
    top = np.random.default_rng([seed, 0])
    systems = _variants(b, top, p.system_prompt_variants, *p.system_prompt_tokens)
    warmup = 2 * p.turns * (p.think_time_s + p.output_tokens / p.assumed_decode_tps)
    starts = _session_starts(top, rate / p.turns, -warmup, duration)
    for si, start in enumerate(starts):
        rng = np.random.default_rng([seed, 1, si])
        stream = systems[int(rng.integers(0, p.system_prompt_variants))].copy()
        chain = b.new_chain(stream)
        n_turns = max(1, min(p.max_turns, int(rng.geometric(1.0 / max(p.turns, 1.0)))))
        t, parent = float(start), None
        sid = f"chat-{si:06d}"
        for turn in range(1, n_turns + 1):
            user = _lognormal(rng, p.user_tokens, 1.0, 1, 16_000)
            stream.add(user)
            out_len = _lognormal(rng, p.output_tokens, 0.9, 1, p.max_output_tokens)
            rid = f"{sid}-{turn:03d}"
            n_full, partial, n_in = len(stream.full), stream.partial_id(), stream.num_tokens
            stream.add(out_len)
            if t >= duration:
                break
            if t >= 0:
                b.rows.append(_Row(rid, t, n_in, out_len, chain, n_full, partial,
                                   len(stream.full), sid, parent, turn))
                parent = rid
            t += (user / p.assumed_prefill_tps + out_len / p.assumed_decode_tps
                  + _lognormal_s(rng, p.think_time_s))


def _rag(b: _Builder, p: RagParams, duration: float, rate: float, seed: int) -> None:
    top = np.random.default_rng([seed, 0])
    base = _Stream(b.hbs, b.ids, b.memo)
    base.add(p.system_prompt_tokens, shared_key=("system", 0))
    doc_len: dict[int, int] = {}
    arrivals = _session_starts(top, rate, 0.0, duration)
    for ri, t in enumerate(arrivals):
        rng = np.random.default_rng([seed, 1, ri])
        docs: list[int] = []
        while len(docs) < p.docs_per_request:
            d = int(rng.zipf(p.zipf_a)) - 1
            if d < p.corpus_size and d not in docs:
                docs.append(d)
        docs.sort()  # most popular (most relevant) first
        stream = base.copy()
        for d in docs:
            if d not in doc_len:
                doc_len[d] = _lognormal(np.random.default_rng([seed, 2, d]), p.doc_tokens, 0.5, 32, 8_000)
            stream.add(doc_len[d], shared_key=("doc", d))
        stream.add(_lognormal(rng, p.question_tokens, 0.6, 4, 2_000))
        chain = b.new_chain(stream)
        out_len = _lognormal(rng, p.output_tokens, 0.8, 1, p.max_output_tokens)
        n_full, partial, n_in = len(stream.full), stream.partial_id(), stream.num_tokens
        stream.add(out_len)
        b.rows.append(_Row(f"rag-{ri:07d}", float(t), n_in, out_len, chain, n_full, partial,
                           len(stream.full), None, None, None))


def _random(b: _Builder, p: RandomParams, rate: float | None, seed: int) -> None:
    if p.num_prompts <= 0 or p.isl <= 0 or p.osl <= 0:
        raise ConfigError("random needs positive --num-prompts, --isl and --osl")
    if not 0 < p.range_ratio <= 1:
        raise ConfigError(f"--range-ratio must be in (0, 1], got {p.range_ratio}")
    rng = np.random.default_rng([seed, 3])
    isl = rng.integers(max(1, math.floor(p.range_ratio * p.isl)), p.isl + 1, size=p.num_prompts)
    osl = rng.integers(max(1, math.floor(p.range_ratio * p.osl)), p.osl + 1, size=p.num_prompts)
    if rate is None or math.isinf(rate):
        arrivals = np.zeros(p.num_prompts)
    else:
        if rate <= 0:
            raise ConfigError(f"rate must be positive, got {rate}")
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=p.num_prompts))
        arrivals -= arrivals[0]
    for i in range(p.num_prompts):
        stream = _Stream(b.hbs, b.ids, b.memo)
        stream.add(int(isl[i]))
        chain = b.new_chain(stream)
        n_full, partial = len(stream.full), stream.partial_id()
        stream.add(int(osl[i]))
        b.rows.append(_Row(f"random-{i:06d}", float(arrivals[i]), int(isl[i]), int(osl[i]),
                           chain, n_full, partial, len(stream.full), None, None, None))
