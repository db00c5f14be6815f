"""Salted block hashes: the only form in which prompt content reaches a trace.

Two hash families, both keyed by a secret salt that never leaves the machine (the trace
stores only :func:`salt_fingerprint`):

* **Token blocks** (vllm-log token ids, openai-jsonl text, synth): each block of
  ``hash_block_size`` token ids is hashed with keyed BLAKE2b (64-bit digest) together with
  its parent block's hash, like vLLM's own chained block hashes. BLAKE2b is a keyed PRF,
  so without the salt nobody can test a guessed prompt against a trace.
* **Given ids** (mooncake, bailian: already anonymised per-block ids): re-keyed with a
  vectorised splitmix64 mix seeded from the salt, and chained through a position-weighted
  prefix sum: ``e_i = mix((id_i + i * golden) ^ k1)``, ``h_j = mix(sum_{i<=j} e_i ^ k2)``.
  Equal id prefixes give equal hashes, and the sum makes the whole thing a handful of
  numpy passes (no Python loop per id), which is what lets ingest reach its 200k
  records/s target (bench/ingest.py). splitmix is not a PRF; it is used only on ids the
  source already anonymised, to unlink traces ingested under different salts.
  :func:`rekey_ids_reference` is the plain-Python reference the tests compare against.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tuner.errors import ConfigError
from tuner.trace.splitmix import GOLDEN as _GOLDEN
from tuner.trace.splitmix import MASK as _MASK
from tuner.trace.splitmix import mix64 as _mix_py
from tuner.trace.splitmix import mix64_inplace as _mix_inplace

SALT_ENV = "TUNER_SALT"


def default_salt_path() -> Path:
    """``$XDG_CONFIG_HOME/tuner/salt`` (``~/.config/tuner/salt``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "tuner" / "salt"


def load_salt(salt_file: str | os.PathLike[str] | None = None) -> bytes:
    """The secret salt: ``salt_file`` if given, else ``$TUNER_SALT``, else the default file.

    A salt file that does not exist is created with 32 random bytes (hex) and mode 0600,
    so the first ingest on a machine works and later ones reuse the same key (equal
    prompts in two ingests keep equal hashes).
    """
    if salt_file is None and os.environ.get(SALT_ENV):
        return os.environ[SALT_ENV].encode()
    path = Path(salt_file) if salt_file is not None else default_salt_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
    data = path.read_bytes().strip()
    if not data:
        raise ConfigError(f"{path}: salt file is empty; delete it to create a new one")
    return data


#: Shortest salt not warned about: 128 bits. A 3-byte salt has 16 M values, which anyone
#: holding a trace and a guessed prompt can try in seconds.
MIN_SALT_BYTES = 16


def salt_warnings(salt: bytes, salt_file: str | os.PathLike[str] | None = None) -> list[str]:
    """What is weak about a salt file in use: too short, or readable by others.

    ``$TUNER_SALT`` is the caller's own choice (tests and CI set short ones) and is not
    judged; the files are what a machine keeps.
    """
    notes: list[str] = []
    path = (Path(salt_file) if salt_file is not None
            else None if os.environ.get(SALT_ENV) else default_salt_path())
    if path is not None and len(salt) < MIN_SALT_BYTES:
        notes.append(f"{path}: the salt has {len(salt)} bytes; a salt shorter than "
                     f"{MIN_SALT_BYTES} can be guessed by trying every value: use 32 random "
                     "bytes (delete the salt file to have one made)")
    if path is not None:
        try:
            mode = path.stat().st_mode
        except OSError:
            mode = 0
        if mode & 0o077:
            notes.append(f"{path}: the salt file is readable by other users (mode "
                         f"{mode & 0o777:04o}); anyone who reads it can test guessed prompts "
                         f"against the trace: chmod 600 {path}")
    return notes


class Hasher:
    """Keyed hashing for one ingest (one salt)."""

    def __init__(self, salt: bytes) -> None:
        self.key = hashlib.blake2b(salt, digest_size=32, person=b"tuner-key").digest()
        self.fingerprint = hashlib.blake2b(salt, digest_size=8, person=b"tuner-fp").hexdigest()
        self.k1 = int.from_bytes(self.key[:8], "little")
        self.k2 = int.from_bytes(self.key[8:16], "little")
        self.k3 = int.from_bytes(self.key[16:24], "little")

    # -- token blocks -------------------------------------------------------------------
    def token_block_hashes(self, token_ids: Sequence[int], block_size: int, *,
                           parent: int = 0, include_partial: bool = True,
                           start: int = 0) -> list[int]:
        """Chained hashes of ``token_ids`` cut into ``block_size`` blocks.

        ``include_partial`` adds a hash for a partial last block (its hash covers its
        actual tokens, so it never equals the full block that later extends it).
        ``start``/``parent`` continue a chain: hash blocks from token ``start`` on, chained
        onto ``parent`` (the hash of the block before ``start``).
        """
        out: list[int] = []
        n = len(token_ids)
        key = self.key
        h = parent
        stop = n if include_partial else n - n % block_size
        for lo in range(start, stop, block_size):
            block = token_ids[lo:lo + block_size]
            data = h.to_bytes(8, "little") + np.asarray(block, dtype=np.uint32).tobytes()
            h = int.from_bytes(hashlib.blake2b(data, key=key, digest_size=8).digest(), "little")
            out.append(h)
        return out

    def unique_hash(self, *parts: object) -> int:
        """A keyed hash of ``parts`` (request-unique blocks, ids of opaque values)."""
        data = "\x1f".join(map(str, parts)).encode()
        return int.from_bytes(hashlib.blake2b(data, key=self.key, digest_size=8).digest(),
                              "little")

    # -- given ids (vectorised) ------------------------------------------------------------
    def rekey_ids(self, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Chained, salted hashes of per-request id lists (flat ``ids`` + list ``offsets``).

        ``offsets`` has one more entry than there are requests (Arrow list layout).
        """
        ids = ids.astype(np.uint64, copy=False)
        offsets = offsets.astype(np.int64, copy=False)
        n = ids.shape[0]
        if n == 0:
            return np.zeros(0, dtype=np.uint64)
        lengths = np.diff(offsets)
        starts = offsets[:-1]
        pos = np.arange(n, dtype=np.int64) - np.repeat(starts - offsets[0], lengths)
        with np.errstate(over="ignore"):
            # One mix per id, one per prefix sum, all in place: fresh large arrays are the
            # expensive part (page faults), so this reuses two buffers throughout.
            e = pos.astype(np.uint64)
            e *= np.uint64(_GOLDEN)
            e += ids
            e ^= np.uint64(self.k1)
            _mix_inplace(e)
            np.cumsum(e, dtype=np.uint64, out=e)
            rel = starts - offsets[0]
            before = np.zeros(len(starts), dtype=np.uint64)
            nz = rel > 0
            before[nz] = e[rel[nz] - 1]
            e -= np.repeat(before, lengths)
            e ^= np.uint64(self.k2)
            _mix_inplace(e)
            return e

    def rekey_ids_reference(self, ids: Sequence[int]) -> list[int]:
        """Plain-Python version of :meth:`rekey_ids` for one request (tests, docs)."""
        out, s = [], 0
        for i, v in enumerate(ids):
            e = _mix_py((((i * _GOLDEN) + v) & _MASK) ^ self.k1)
            s = (s + e) & _MASK
            out.append(_mix_py(s ^ self.k2))
        return out

