"""The job's state file: one watermark per source file, plus the window clock.

``<state_dir>/state.json`` is replaced atomically as one document, so it is always either
the state before a run or the state after it. Two kinds of watermark:

* append-only logs (plain text): ``offset`` (bytes ingested, always at a line end),
  ``inode`` and ``size`` (a smaller size or another inode means the file was rotated or
  truncated: start again from 0) and ``last_line`` (the last ingested record, the clock
  anchor for formats whose timestamps are relative, e.g. Mooncake);
* compressed files (``.gz``/``.zst``), which cannot be resumed by byte offset, are treated
  as rotated files: ingested whole once, remembered by name, size and mtime.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import asdict, dataclass, field
from typing import Any

from tuner.errors import ConfigError
from tuner.loaders import load_json
from tuner.outputs import write_json

STATE_VERSION = 1


@dataclass
class SourceMark:
    """How far one source file has been ingested."""

    path: str
    kind: str  # "append" (byte offset) or "whole" (ingested once, e.g. compressed)
    inode: int = 0
    size: int = 0  # file size when last seen (bytes)
    offset: int = 0  # bytes ingested, at a line boundary ("append" only)
    mtime_ns: int = 0
    last_line: str | None = None  # last ingested record (clock anchor)
    last_arrival_s: float | None = None  # its arrival on the window clock (s)
    num_requests: int = 0  # requests ingested from this file, all runs


@dataclass
class JobState:
    """Everything a run needs from the runs before it."""

    sources: dict[str, SourceMark] = field(default_factory=dict)
    clock_origin_utc: str | None = None  # instant of window arrival_s = 0, when known
    clock_end_s: float = 0.0  # latest arrival on the window clock (s)
    last_run_id: str | None = None
    runs: int = 0
    reference_stats: dict[str, Any] | None = None  # window stats of the last run (drift fallback)
    #: Window parts this state accounts for (paths relative to the window dir). A part on
    #: disk but not listed was written by a run that died before its commit; recovery
    #: deletes it, so the window always matches the watermarks.
    parts: list[str] = field(default_factory=list)
    #: The config's ``target`` the window and history were tuned for (None before the
    #: first committed run); a run under another target is refused (tuner.jobs.retune).
    target: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["state_version"] = STATE_VERSION
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> "JobState":
        if data.get("state_version") != STATE_VERSION:
            raise ConfigError(f"{where}: state_version {data.get('state_version')!r} is not "
                              f"{STATE_VERSION}; move the state dir aside to start afresh")
        try:
            sources = {k: SourceMark(**v) for k, v in data.get("sources", {}).items()}
            return cls(sources=sources, clock_origin_utc=data.get("clock_origin_utc"),
                       clock_end_s=float(data.get("clock_end_s", 0.0)),
                       last_run_id=data.get("last_run_id"), runs=int(data.get("runs", 0)),
                       reference_stats=data.get("reference_stats"),
                       parts=[str(x) for x in data.get("parts", [])],
                       target=data.get("target"))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: corrupt state ({exc})") from None


def state_path(state_dir: str | os.PathLike[str]) -> pathlib.Path:
    return pathlib.Path(state_dir) / "state.json"


def load_state(state_dir: str | os.PathLike[str]) -> JobState:
    """The saved state, or a fresh one when the job never ran."""
    path = state_path(state_dir)
    if not path.exists():
        return JobState()
    data = load_json(path, "job state").data
    return JobState.from_dict(data, str(path))


def save_state(state_dir: str | os.PathLike[str], state: JobState) -> pathlib.Path:
    return write_json(state_path(state_dir), state.to_dict())
