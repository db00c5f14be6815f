"""Numbered profile versions, an atomically swapped ``current`` pointer, a changelog.

Layout of ``<profiles_dir>/<name>/``::

    v0001.yaml v0002.yaml ...   immutable once the pointer names them
    current -> v0002.yaml       a relative symlink, replaced by rename (atomic)
    changelog.jsonl             one JSON object per retune run, appended and fsynced

Invariant: ``current`` names a complete version file or does not exist. A version file
newer than ``current`` without a changelog entry is an orphan of a crashed run; the job
removes it when it next starts (see :func:`tuner.jobs.retune.recover`).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Any

from tuner.errors import ConfigError
from tuner.outputs import fsync_dir

_VERSION_RE = re.compile(r"^v(\d{4,})\.yaml$")


class ProfileHistory:
    """The versions of one profile name (see the module docstring for the layout)."""

    def __init__(self, profiles_dir: str | os.PathLike[str], name: str) -> None:
        if not name or "/" in name or name.startswith("."):
            raise ConfigError(f"profile name {name!r}: use a plain file name")
        self.root = pathlib.Path(profiles_dir) / name
        self.name = name

    @property
    def changelog_path(self) -> pathlib.Path:
        return self.root / "changelog.jsonl"

    @property
    def pointer(self) -> pathlib.Path:
        return self.root / "current"

    def version_path(self, version: int) -> pathlib.Path:
        return self.root / f"v{version:04d}.yaml"

    def versions(self) -> list[int]:
        """Version numbers on disk, ascending (orphans included)."""
        if not self.root.exists():
            return []
        found = (_VERSION_RE.match(p.name) for p in self.root.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def current_version(self) -> int | None:
        """The version ``current`` names, or None before the first publish."""
        if not self.pointer.is_symlink():
            return None
        m = _VERSION_RE.match(os.readlink(self.pointer))
        return int(m.group(1)) if m else None

    def current_path(self) -> pathlib.Path | None:
        v = self.current_version()
        return None if v is None else self.version_path(v)

    def next_version(self) -> int:
        return max(self.versions(), default=0) + 1

    def swap_current(self, version: int) -> None:
        """Point ``current`` at ``version``: a new symlink renamed over the old one."""
        target = self.version_path(version)
        if not target.is_file():
            raise ConfigError(f"{target}: cannot point current at a missing version")
        tmp = self.root / f".current.{os.getpid()}.tmp"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(target.name, tmp)
        os.replace(tmp, self.pointer)
        fsync_dir(self.root)

    def append_changelog(self, entry: dict[str, Any]) -> None:
        """Append one entry (one line); a torn last line from a crash is terminated first."""
        self.root.mkdir(parents=True, exist_ok=True)
        line = json.dumps(entry, sort_keys=True, default=str)
        with open(self.changelog_path, "a+b") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() > 0:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    fh.write(b"\n")
            fh.write(line.encode() + b"\n")
            fh.flush()
            os.fsync(fh.fileno())

    def changelog(self) -> list[dict[str, Any]]:
        """All complete entries, oldest first (a torn line left by a crash is skipped)."""
        if not self.changelog_path.exists():
            return []
        out = []
        for raw in self.changelog_path.read_text().splitlines():
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if isinstance(entry, dict):
                out.append(entry)
        return out

    def resolve(self, spec: str) -> pathlib.Path:
        """A version given as ``3``, ``v3``, ``v0003``, ``current`` or a file path."""
        text = spec.strip()
        if text == "current":
            path = self.current_path()
            if path is None:
                raise ConfigError(f"{self.root}: no current version yet")
            return path
        m = re.fullmatch(r"v?(\d+)", text)
        if m:
            path = self.version_path(int(m.group(1)))
            if not path.is_file():
                raise ConfigError(f"{path}: no such version of {self.name!r} "
                                  f"(have {', '.join(map(str, self.versions())) or 'none'})")
            return path
        path = pathlib.Path(text)
        if not path.is_file():
            raise ConfigError(f"{text}: not a version number of {self.name!r} nor a file")
        return path
