"""Salted hashing: vectorised re-keying against its plain-Python reference, salt files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from tuner.trace.hashing import Hasher, load_salt


def _flat(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    values = np.asarray([v for x in lists for v in x], dtype=np.uint64)
    return values, offsets


def test_rekey_matches_reference_and_keeps_prefix_equality() -> None:
    h = Hasher(b"k")
    lists = [[0, 1, 2, 3], [0, 1, 9], [], [2**64 - 1, 5], [0, 1, 2, 3, 4]]
    values, offsets = _flat(lists)
    out = h.rekey_ids(values, offsets)
    got = [out[offsets[i]:offsets[i + 1]].tolist() for i in range(len(lists))]
    assert got == [h.rekey_ids_reference(x) for x in lists]
    assert got[0][:2] == got[1][:2] and got[0][2] != got[1][2]
    assert got[4][:4] == got[0]
    # Position matters: the same id at another position hashes differently.
    assert h.rekey_ids_reference([7, 7])[1] != h.rekey_ids_reference([7])[0]


def test_rekey_offsets_not_starting_at_zero() -> None:
    h = Hasher(b"k")
    values = np.asarray([5, 6, 7, 8], dtype=np.uint64)
    out = h.rekey_ids(values, np.asarray([10, 12, 14]))  # a sliced Arrow list array
    assert out.tolist() == h.rekey_ids_reference([5, 6]) + h.rekey_ids_reference([7, 8])


def test_different_salts_give_unrelated_hashes() -> None:
    a, b = Hasher(b"one"), Hasher(b"two")
    assert a.rekey_ids_reference([1, 2, 3]) != b.rekey_ids_reference([1, 2, 3])
    assert a.token_block_hashes(list(range(40)), 16) != b.token_block_hashes(list(range(40)), 16)
    assert a.fingerprint != b.fingerprint and len(a.fingerprint) == 16


def test_token_block_hashes_chain_and_partial() -> None:
    h = Hasher(b"k")
    toks = list(range(40))
    full = h.token_block_hashes(toks, 16, include_partial=False)
    withp = h.token_block_hashes(toks, 16)
    assert len(full) == 2 and len(withp) == 3 and withp[:2] == full
    # The partial block [32, 40) differs from the full block [32, 48) that extends it.
    longer = h.token_block_hashes(toks + [40] * 8, 16)
    assert longer[:2] == full and longer[2] != withp[2]
    # Continuing a chain from a parent equals hashing the whole stream.
    cont = h.token_block_hashes(toks + list(range(100, 124)), 16, parent=full[1],
                                include_partial=False, start=32)
    assert cont == h.token_block_hashes(toks + list(range(100, 124)), 16,
                                        include_partial=False)[2:]


def test_salt_file_created_with_mode_0600(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNER_SALT")
    path = tmp_path / "sub" / "salt"
    salt = load_salt(path)
    assert path.exists() and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(salt) == 64 and load_salt(path) == salt


def test_env_salt_and_default_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_salt() == b"test-salt"
    monkeypatch.delenv("TUNER_SALT")
    salt = load_salt()
    assert (tmp_path / "xdg" / "tuner" / "salt").read_bytes().strip() == salt
