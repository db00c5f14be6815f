"""Re-blocking: from the trace's hash block size to the KV block size of the replay.

Plain Python (no numpy/pyarrow) because the simulator calls it.

Rules (vLLM hashes only *full* blocks, so the result always has exactly
``floor(input_len / to_block_size)`` hashes):

* ``to == from``: the first ``floor(input_len / B)`` hashes, unchanged.
* ``to = k * from`` (grouping): target block ``t`` covers source blocks ``t*k .. t*k+k-1``,
  all of them full because target boundaries are source boundaries. Source hashes are
  chained (a format invariant: each one identifies its whole prefix), so the group's last
  hash identifies the target block's whole prefix: ``h_t = mix(G_k, s_{tk+k-1})``. Exact:
  two prompts share target block ``t`` iff they share source block ``tk+k-1``.
* ``from = k * to`` (splitting): source block ``i`` yields sub-blocks ``j = 0..k-1`` with
  derived hashes ``mix(mix(S, s_i), j)``; because ``s_i`` is chained, it already identifies
  the whole prefix. A source's *partial* last block (``ceil`` lists) yields the sub-blocks
  that are full inside it, derived from the partial block's hash; sub-blocks past
  ``input_len`` are dropped. Approximate where the source's granularity hides token
  identity: a later prompt whose block ``i`` is full does not share the sub-blocks of an
  earlier prompt's *partial* block ``i`` (their source hashes differ), exactly as at
  source granularity. With ``output_block_hashes`` known, see
  :func:`reblock_request_hashes`, which avoids even that for multi-turn reuse.
* anything else (e.g. 48 and 64) raises :class:`~tuner.errors.ConfigError`.

Both derived forms are elementwise (no chain through the previous target block), so
:meth:`tuner.trace.Trace.reblocked` computes them for a whole trace with numpy; this
module is the plain-Python reference the tests hold it to. A source list too short for
the full target blocks raises :class:`~tuner.errors.ConfigError`; no hash is invented.
"""

from __future__ import annotations

from collections.abc import Sequence

from tuner.errors import ConfigError
from tuner.trace.splitmix import GOLDEN as _GOLDEN
from tuner.trace.splitmix import MASK as _MASK
from tuner.trace.splitmix import mix64


def combine(parent: int, value: int) -> int:
    """Chain ``value`` onto ``parent`` (order-sensitive, 64-bit)."""
    return mix64((parent * _GOLDEN + mix64(value + _GOLDEN)) & _MASK)


# Domain tags keep grouped/split hashes apart from the source hashes they derive from.
_GROUP_SEED = 0x6772_6F75_7062_6C6B  # "groupblk"
_SPLIT_SEED = 0x7370_6C69_7462_6C6B  # "splitblk"


def reblock(block_hashes: Sequence[int], input_len: int, from_block_size: int,
            to_block_size: int) -> tuple[int, ...]:
    """Hashes of the ``floor(input_len / to_block_size)`` full KV blocks of a prompt.

    Args:
        block_hashes: chained hashes at ``from_block_size`` tokens per block (``floor`` or
            ``ceil`` of ``input_len / from_block_size`` entries; extra entries are ignored).
        input_len: prompt tokens the hashes cover (for output blocks: prompt + output).
        from_block_size: the trace's ``hash_block_size``.
        to_block_size: the KV block size ``B`` of the replay.

    Raises:
        ConfigError: the two sizes are not multiples of one another, or the source list is
            too short to cover the full target blocks.
    """
    f, t = from_block_size, to_block_size
    if f <= 0 or t <= 0:
        raise ConfigError(f"block sizes must be positive, got {from_block_size=} {to_block_size=}")
    n_target = input_len // t
    if t == f:
        _need(block_hashes, n_target, f, t)
        return tuple(block_hashes[:n_target])
    if t % f == 0:
        k = t // f
        _need(block_hashes, n_target * k, f, t)
        seed = _GROUP_SEED ^ k
        return tuple(combine(seed, block_hashes[(i + 1) * k - 1]) for i in range(n_target))
    if f % t == 0:
        k = f // t
        _need(block_hashes, -(-n_target // k), f, t)
        return tuple(combine(combine(_SPLIT_SEED, block_hashes[n // k]), n % k)
                     for n in range(n_target))
    raise ConfigError(
        f"cannot re-block from {from_block_size}-token to {to_block_size}-token blocks: one "
        "must be a multiple of the other; re-ingest with --hash-block-size "
        f"{_gcd(f, t)} (or a divisor of {to_block_size})")


def _need(block_hashes: Sequence[int], n: int, f: int, t: int) -> None:
    if len(block_hashes) < n:
        raise ConfigError(
            f"{len(block_hashes)} block hashes at {f} tokens cannot cover the {n} source "
            f"blocks that full {t}-token blocks need")


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def reblock_request_hashes(block_hashes: Sequence[int], output_block_hashes: Sequence[int],
                           input_len: int, output_len: int, from_block_size: int,
                           to_block_size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Prompt and output block hashes of one request at ``to_block_size``.

    Without output hashes this is just :func:`reblock`. With them, the prompt's full
    source blocks followed by the output blocks form one chain over
    ``input_len + output_len`` tokens; it is re-blocked as a whole and split at
    ``floor(input_len / B)``, so that a later turn's prompt (whose source blocks are that
    same chain) gets exactly the hashes this request leaves in the cache. For grouping this
    equals re-blocking the prompt alone; for splitting, the sub-blocks of the prompt's
    partial last block derive from the *completed* block (first output hash), which is
    what a follow-up turn will present.
    """
    f = from_block_size
    if not output_block_hashes:
        return reblock(block_hashes, input_len, f, to_block_size), ()
    n_full_prompt = input_len // f
    chain = list(block_hashes[:n_full_prompt]) + list(output_block_hashes)
    covered = min(input_len + output_len, len(chain) * f)
    if input_len > covered:  # inconsistent source: fall back to the prompt alone
        return reblock(block_hashes, input_len, f, to_block_size), ()
    whole = reblock(chain, covered, f, to_block_size)
    n_prompt = input_len // to_block_size
    return whole[:n_prompt], whole[n_prompt:]
