"""The one splitmix64 finaliser (tuner/trace/splitmix.py): pinned values, and every form agrees.

A stored trace's hashes were made with these constants, so a change here is a format break:
the values below must never change.
"""

from __future__ import annotations

import importlib

import numpy as np

from tuner.trace.hashing import Hasher
from tuner.trace.splitmix import (GOLDEN, MASK, mix64, mix64_array, mix64_inplace,
                                  mix64_tail_inplace)

#: Vigna's reference splitmix64 (prng.di.unimi.it/splitmix64.c), seed 0: its n-th output is
#: mix64(n * GOLDEN).
REFERENCE_STREAM = (0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F)
# tuner.trace re-exports functions named like these modules
reblock = importlib.import_module("tuner.trace.reblock")
reblock_vec = importlib.import_module("tuner.trace.reblock_vec")


def test_reference_stream() -> None:
    assert tuple(mix64((n * GOLDEN) & MASK) for n in (1, 2, 3)) == REFERENCE_STREAM
    assert mix64(0) == 0


def test_array_forms_agree_bit_for_bit_with_the_scalar() -> None:
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.integers(0, 2**63, 2000, dtype=np.uint64) * np.uint64(2)
                        + rng.integers(0, 2, 2000, dtype=np.uint64),
                        np.array([0, 1, MASK, 1 << 63, GOLDEN], dtype=np.uint64)])
    want = [mix64(int(v)) for v in x]
    assert mix64_array(x).tolist() == want
    y = x.copy()
    mix64_inplace(y)
    assert y.tolist() == want
    z = x ^ (x >> np.uint64(30))
    assert mix64_tail_inplace(z).tolist() == want


def test_both_hashing_paths_keep_their_pinned_values() -> None:
    # re-blocking (plain and vectorised)
    assert reblock.combine(1, 2) == 0x64684C4F0FD784B4
    assert reblock.combine(0x6772_6F75_7062_6C6B, 12345) == 0x7CF4EFE029DAC557
    got = reblock_vec._combine(np.uint64(1), np.array([2], dtype=np.uint64))
    assert int(got[0]) == 0x64684C4F0FD784B4
    # ingest's salted re-keying of given ids (plain and vectorised)
    h = Hasher(b"pinned-salt")
    ids = [1, 2, 3, 1 << 63]
    want = [0x1F397567613D9053, 0x12B3C16EBE743D5F, 0x801BCD2E709B763B, 0x808CEE56E448D699]
    assert h.rekey_ids_reference(ids) == want
    vec = h.rekey_ids(np.array(ids, dtype=np.uint64), np.array([0, 4], dtype=np.int64))
    assert vec.tolist() == want
