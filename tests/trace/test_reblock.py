"""Re-blocking against hand-computed expectations (issue 2: re-blocking rules)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.errors import ConfigError
from tuner.trace.reblock import combine, mix64, reblock, reblock_request_hashes

GROUP_SEED = 0x6772_6F75_7062_6C6B
SPLIT_SEED = 0x7370_6C69_7462_6C6B


def test_mix64_known_values() -> None:
    # splitmix64 finaliser; mix64(0) == 0 and a published first output of splitmix64(seed=0):
    # next() = mix64(0 + golden) = 0xE220A8397B1DCDAF.
    assert mix64(0) == 0
    assert mix64(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF


def test_identity_keeps_full_blocks_only() -> None:
    # 50 tokens at 16: blocks [0,16) [16,32) [32,48) full, [48,50) partial -> 3 hashes.
    assert reblock([11, 22, 33, 44], 50, 16, 16) == (11, 22, 33)
    assert reblock([11, 22, 33], 48, 16, 16) == (11, 22, 33)
    assert reblock([11], 15, 16, 16) == ()


def test_group_uses_each_groups_last_chained_hash_by_hand() -> None:
    # 16 -> 32 with 5 source hashes over 80 tokens: floor(80/32) = 2 target blocks.
    h = [1, 2, 3, 4, 5]
    t0 = combine(GROUP_SEED ^ 2, 2)
    t1 = combine(GROUP_SEED ^ 2, 4)
    assert reblock(h, 80, 16, 32) == (t0, t1)
    # 70 tokens: still 2 full 32-token blocks; 64 tokens: exactly 2; 63: 1.
    assert reblock(h, 70, 16, 32) == (t0, t1)
    assert reblock(h, 63, 16, 32) == (t0,)
    assert reblock(h, 80, 16, 64) == (combine(GROUP_SEED ^ 4, 4),)


def test_split_derives_sub_blocks_by_hand() -> None:
    # 64 -> 16, 2 source blocks (second partial) over 100 tokens: floor(100/16) = 6.
    h = [7, 9]
    expect = tuple(combine(combine(SPLIT_SEED, h[n // 4]), n % 4) for n in range(6))
    assert reblock(h, 100, 64, 16) == expect
    # The partial source block (tokens 64..100) yields sub-blocks 4 and 5 (64..96), not 6.
    assert len(reblock(h, 100, 64, 16)) == 6


@pytest.mark.parametrize("src,dst", [(48, 64), (64, 48), (16, 24)])
def test_incompatible_sizes_raise(src: int, dst: int) -> None:
    with pytest.raises(ConfigError, match="multiple"):
        reblock([1, 2, 3], 100, src, dst)


def test_too_few_hashes_raise() -> None:
    with pytest.raises(ConfigError, match="cannot cover"):
        reblock([1], 64, 16, 32)


def test_output_chain_makes_next_turn_hit_group_and_split() -> None:
    # Turn 1: 40-token prompt at 16-token source blocks: [a, b, partial p]; its output
    # (30 tokens) completes block c (tokens 32..48) and d (48..64); 70 tokens total.
    a, b, p, c, d = 101, 102, 999, 103, 104
    # Turn 2's prompt is turn 1's prompt + output + more: source blocks a b c d e.
    nxt = [a, b, c, d, 105]
    for target in (32, 64, 8):
        prompt1, out1 = reblock_request_hashes([a, b, p], [c, d], 40, 30, 16, target)
        assert len(prompt1) == 40 // target
        assert len(prompt1) + len(out1) == 70 // target
        second = reblock(nxt, 80, 16, target)
        cached = prompt1 + out1
        assert second[:len(cached)] == cached, target


@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=12),
       st.integers(0, 3), st.sampled_from([(16, 32), (16, 64), (64, 16), (32, 16), (16, 16)]))
def test_shared_prefix_gives_shared_target_blocks(prefix: list[int], extra: int,
                                                  sizes: tuple[int, int]) -> None:
    src, dst = sizes
    a = prefix + [1] * extra
    b = prefix + [2] * extra
    ra = reblock(a, len(a) * src, src, dst)
    rb = reblock(b, len(b) * src, src, dst)
    shared = (len(prefix) * src) // dst
    assert ra[:shared] == rb[:shared]
    if extra and len(ra) > shared:
        assert ra[shared] != rb[shared]


def _random_requests(rng: np.random.Generator, hbs: int, n: int) -> list:
    from tuner.trace import TraceRequest

    out = []
    for i in range(n):
        inp = int(rng.integers(1, 20 * hbs))
        outp = int(rng.integers(0, 6 * hbs))
        ceil = -(-inp // hbs)
        nb = ceil if rng.random() < 0.7 else inp // hbs
        blocks = tuple(int(x) for x in rng.integers(0, 2**63, size=nb))
        nout = (inp + outp) // hbs - inp // hbs if rng.random() < 0.5 else 0
        outs = tuple(int(x) for x in rng.integers(0, 2**63, size=nout))
        out.append(TraceRequest(f"r{i}", float(i), inp, outp, blocks, outs))
    return out


@pytest.mark.parametrize("src,dst", [(16, 16), (16, 32), (16, 64), (64, 16), (64, 32), (512, 16),
                                     (32, 64)])
def test_vectorised_trace_reblocking_matches_reference(src: int, dst: int) -> None:
    import numpy as np

    from tuner.trace import Trace, TraceMetadata

    meta = TraceMetadata(hash_block_size=src, source_format="t")
    reqs, expected, refused = [], [], []
    for r in _random_requests(np.random.default_rng(src * 1000 + dst), src, 300):
        try:
            prompt, output = reblock_request_hashes(r.block_hashes, r.output_block_hashes,
                                                    r.input_len, r.output_len, src, dst)
        except ConfigError:  # a floor list whose partial tail holds full target blocks
            refused.append(r)
            continue
        reqs.append(r)
        # Identity keeps stored outputs as they are.
        expected.append((prompt, r.output_block_hashes if src == dst else output))
    got = Trace.from_requests(reqs, meta).reblocked(dst).requests()
    for r, g, (prompt, output) in zip(reqs, got, expected):
        assert g.block_hashes == prompt and g.output_block_hashes == output, r.request_id
        assert len(g.block_hashes) == r.input_len // dst
    if refused and src != dst:
        with pytest.raises(ConfigError, match="cannot cover"):
            Trace.from_requests(reqs + refused[:1], meta).reblocked(dst)


@pytest.mark.slow  # synthesises and re-blocks a whole agentic hour (~5 s)
def test_vectorised_reblocking_on_synth_agentic() -> None:
    from tuner.trace import synthesize

    trace = synthesize("agentic", duration_s=120, rate=3, seed=9, hash_block_size=64)
    for r, g in zip(trace.requests(), trace.reblocked(16).requests()):
        prompt, output = reblock_request_hashes(r.block_hashes, r.output_block_hashes,
                                                r.input_len, r.output_len, 64, 16)
        assert (g.block_hashes, g.output_block_hashes) == (prompt, output)


@pytest.mark.parametrize("seed", range(6))
def test_id_split_gives_first_plus_position_of_each_sub_block(seed: int) -> None:
    """``reblock_ids`` / ``reblock_id_ranges``: KV block ``j`` of a request is sub-block
    ``j % k`` of chain element ``j // k``, id ``first + j % k`` (``first = id * k`` for
    dense ids), written out one by one here; sizes up to 12k sources, so the cached
    offset pattern grows while calls alternate k."""
    import numpy as np

    from tuner.trace.reblock_vec import _kv_chain, reblock_id_ranges, reblock_ids

    rng = np.random.default_rng(seed)
    for _ in range(25):
        f, t = [(64, 16), (16, 16), (32, 16), (512, 16), (64, 32)][int(rng.integers(5))]
        k = f // t
        n_src = int(rng.choice([1, 3, 40, 760, 12_000]))
        input_len = int(rng.integers(max(1, (n_src - 1) * f), n_src * f + 1))
        n_out = int(rng.integers(0, 4))
        output_len = int(rng.integers(1, 4 * f + 2))
        src = rng.integers(0, 1 << 40, size=n_src).astype(np.int64)
        out = rng.integers(0, 1 << 40, size=n_out).astype(np.int64)
        for split, first_of in ((reblock_id_ranges, 1), (reblock_ids, k)):
            prompt, output = split(src, out, input_len, output_len, f, t)
            chain, n_target, with_output = _kv_chain(src, out, input_len, output_len, f, t)
            whole = [int(chain[j // k]) * first_of + j % k for j in range(n_target)]
            n_prompt = input_len // t
            assert prompt.tolist() == whole[:n_prompt]
            assert output.tolist() == (whole[n_prompt:] if with_output else [])


@pytest.mark.parametrize("dtype", ["int64", "uint64", "int32"])
def test_id_split_keeps_the_ids_dtype(dtype: str) -> None:
    """Ids read from a trace's Parquet column are uint64 (the study report's lazy ids):
    the split adds its sub-block offsets in the ids' own dtype, so it neither fails
    (numpy refuses an in-place uint64 + int64) nor turns the ids into floats."""
    import numpy as np

    from tuner.trace.reblock_vec import reblock_ids

    src = np.array([11, 12, 13], dtype=dtype)
    prompt, output = reblock_ids(src, np.zeros(0, dtype=dtype), 192, 0, 64, 16)
    assert prompt.dtype == np.dtype(dtype)
    assert prompt.tolist() == [i * 4 + j for i in (11, 12, 13) for j in range(4)]
    assert len(output) == 0


@pytest.mark.parametrize("seed", range(4))
def test_joined_split_equals_the_two_array_split_generated(seed: int) -> None:
    """``reblock_joined_id_ranges(firsts, n, ...)`` is ``reblock_id_ranges(firsts[:n],
    firsts[n:], ...)``: prompts of whole hash blocks (the joined chain), partial last
    blocks and prompts the output falls short of (the two-array form), no output, block
    sizes that do not split further (k = 1); a failure in one is a failure in the other."""
    import numpy as np

    from tuner.errors import ConfigError
    from tuner.trace.reblock_vec import reblock_id_ranges, reblock_joined_id_ranges

    rng = np.random.default_rng(100 + seed)
    for _ in range(300):
        f, t = [(64, 16), (16, 16), (32, 16), (512, 16), (64, 32)][int(rng.integers(5))]
        n_src = int(rng.choice([1, 2, 5, 40, 760]))
        input_len = int(rng.integers(max(1, (n_src - 1) * f), n_src * f + 2))
        n_out = int(rng.integers(0, 5))
        output_len = int(rng.integers(0, 5 * f + 2))
        firsts = rng.integers(0, 1 << 40, size=n_src + n_out).astype(np.int64)
        try:
            want = reblock_id_ranges(firsts[:n_src], firsts[n_src:], input_len, output_len,
                                     f, t)
        except (ConfigError, AssertionError) as err:
            with pytest.raises(type(err)):
                reblock_joined_id_ranges(firsts, n_src, input_len, output_len, f, t)
            continue
        got = reblock_joined_id_ranges(firsts, n_src, input_len, output_len, f, t)
        assert [a.tolist() for a in got] == [a.tolist() for a in want], (
            f, t, n_src, n_out, input_len, output_len)
