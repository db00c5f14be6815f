"""Incremental ingest into a rolling window of Parquet parts.

Layout: ``<state_dir>/window/day=<N>/part-<source>-<start>-<end>.parquet`` (hive style;
``N`` = days since the window clock's origin). Every part holds ``arrival_s`` on one
*window clock*, so ``read_trace(window_dir)`` is one timeline:

* formats with epoch timestamps (``origin_utc`` known): the clock's origin is the first
  ingested origin, and later chunks are shifted by the difference of origins;
* formats with relative timestamps (Mooncake, Bailian): each appended chunk is ingested
  together with the source's last already-ingested line (the *anchor*, kept in the state
  file), so its rows keep their gap to the anchor, whose window time is known. A new
  relative-clock file starts at the window's current end.

Part names are a function of (source, byte range), so re-ingesting the same bytes after a
crash overwrites the same part instead of duplicating rows: ingest is idempotent until the
state watermark moves.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from glob import glob
from typing import TYPE_CHECKING

import polars as pl

from tuner.errors import ConfigError
from tuner.jobs.state import JobState, SourceMark

if TYPE_CHECKING:
    from tuner.trace import Trace

_COMPRESSED = (".gz", ".zst", ".zstd")


@dataclass(frozen=True)
class SourceSpec:
    """One ``sources:`` entry of the config."""

    glob: str
    format: str = "auto"


@dataclass
class IngestOutcome:
    """What one incremental ingest did."""

    parts: list[str] = field(default_factory=list)  # part files written this run
    num_new_requests: int = 0
    num_files_seen: int = 0
    notes: list[str] = field(default_factory=list)


def ingest_new(specs: list[SourceSpec], state: JobState, window_dir: pathlib.Path,
               work_dir: pathlib.Path, *, salt: str | os.PathLike[str],
               hash_block_size: int | None = None, on_error: str = "fail") -> IngestOutcome:
    """Ingest what ``state`` has not seen yet; update ``state`` in memory (not on disk).

    The caller saves the state only after everything depending on the new parts is done.
    """
    outcome = IngestOutcome()
    previous = dict(state.sources)  # marks before this run: renamed files are found here
    work_dir.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        files = sorted(glob(os.path.expanduser(spec.glob), recursive=True))
        for path in files:
            if not os.path.isfile(path):
                continue
            outcome.num_files_seen += 1
            _ingest_file(path, spec.format, state, previous, window_dir, work_dir, outcome,
                         salt=salt, hash_block_size=hash_block_size, on_error=on_error)
    shutil.rmtree(work_dir, ignore_errors=True)
    if outcome.num_files_seen == 0:
        # Not "no new traffic" (exit 3, kept): the units would treat that as success forever.
        globs = ", ".join(spec.glob for spec in specs)
        raise ConfigError(f"sources: no file matches {globs}; fix the globs in the config "
                          "(relative ones resolve against the config's folder)")
    return outcome


def _ingest_file(path: str, fmt: str, state: JobState, previous: dict[str, SourceMark],
                 window_dir: pathlib.Path,
                 work_dir: pathlib.Path, outcome: IngestOutcome, **kw: object) -> None:
    st = os.stat(path)
    key = os.path.abspath(path)
    mark = state.sources.get(key)
    if path.endswith(_COMPRESSED):
        if mark is not None and mark.size == st.st_size and mark.mtime_ns == st.st_mtime_ns:
            return
        chunk = work_dir / pathlib.Path(path).name
        shutil.copyfile(path, chunk)
        new = SourceMark(path=key, kind="whole", inode=st.st_ino, size=st.st_size,
                         mtime_ns=st.st_mtime_ns)
        n = _ingest_chunk(chunk, fmt, None, None, state, window_dir, _tag(key, 0, st.st_size),
                          new, outcome, **kw)
        new.num_requests = (mark.num_requests if mark else 0) + n
        state.sources[key] = new
        return
    offset, anchor, anchor_s = 0, None, None
    if mark is None:
        mark = _renamed_from(previous, st)
        if mark is not None:
            outcome.notes.append(f"{path}: continues {mark.path} (renamed by rotation)")
            if state.sources.get(mark.path) is mark:
                del state.sources[mark.path]
    if mark is not None:
        if mark.inode != st.st_ino or st.st_size < mark.offset:
            outcome.notes.append(f"{path}: rotated or truncated (inode/size changed); "
                                 "ingesting from the start")
        else:
            offset, anchor, anchor_s = mark.offset, mark.last_line, mark.last_arrival_s
    if st.st_size == offset:
        return
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read(st.st_size - offset)
    end = data.rfind(b"\n") + 1  # a partial last line waits for the next run
    lines = [ln for ln in data[:end].split(b"\n") if ln.strip()]
    if not lines:
        return
    src = pathlib.Path(path)
    chunk = work_dir / f"{src.stem}.o{offset}{src.suffix}"
    with open(chunk, "wb") as fh:
        if anchor is not None:
            fh.write(anchor.encode() + b"\n")
        fh.write(data[:end])
    new = SourceMark(path=key, kind="append", inode=st.st_ino, size=st.st_size,
                     offset=offset + end, mtime_ns=st.st_mtime_ns,
                     last_line=lines[-1].decode(errors="replace"))
    n = _ingest_chunk(chunk, fmt, anchor, anchor_s, state, window_dir,
                      _tag(key, offset, offset + end), new, outcome, **kw)
    new.num_requests = (mark.num_requests if mark else 0) + n
    state.sources[key] = new


def _renamed_from(previous: dict[str, SourceMark], st: os.stat_result) -> SourceMark | None:
    """The mark of a file renamed to this one (same inode; old name gone or reused).

    logrotate's default moves ``app.log`` to ``app.log.1``: when the glob matches both
    names, the moved file keeps its watermark instead of being ingested again.
    """
    for m in previous.values():
        if m.kind != "append" or m.inode != st.st_ino or m.offset > st.st_size:
            continue
        try:
            moved = os.stat(m.path).st_ino != st.st_ino
        except FileNotFoundError:
            moved = True
        if moved:
            return m
    return None


def _tag(key: str, start: int, end: int) -> str:
    digest = hashlib.blake2b(key.encode(), digest_size=4).hexdigest()
    return f"{digest}-{start:012d}-{end:012d}"


def _ingest_chunk(chunk: pathlib.Path, fmt: str, anchor: str | None, anchor_s: float | None,
                  state: JobState, window_dir: pathlib.Path, tag: str, mark: SourceMark,
                  outcome: IngestOutcome, *, salt: object, hash_block_size: object,
                  on_error: object) -> int:
    from tuner.trace import ingest, read_trace, write_trace

    tmp = chunk.with_suffix(".parquet")
    ingest([str(chunk)], tmp, format=fmt, salt=salt,  # type: ignore[arg-type]
           hash_block_size=hash_block_size, on_error=on_error,  # type: ignore[arg-type]
           progress=False)
    trace = read_trace(tmp)
    df = trace.lazy().collect()
    meta = trace.metadata
    if anchor is not None and anchor_s is not None:
        # Row 0 is the anchor (first in the file and, for an in-order log, earliest).
        shift = anchor_s - float(df.item(0, "arrival_s"))
        df = df.slice(1)
    elif meta.origin_utc is not None:
        origin = _utc(meta.origin_utc)
        if state.clock_origin_utc is None:
            state.clock_origin_utc = meta.origin_utc
        shift = (origin - _utc(state.clock_origin_utc)).total_seconds()
    else:
        shift = state.clock_end_s
    if df.height == 0:
        return 0
    # Ids of line-numbered formats restart in every chunk: qualify them with the chunk tag
    # (source digest + start offset), which also keeps two sources' ids apart.
    df = df.with_columns(pl.col("arrival_s") + shift,
                         pl.col("request_id") + f"@{tag.rsplit('-', 1)[0]}")
    last = float(df.get_column("arrival_s").max())  # type: ignore[arg-type]
    mark.last_arrival_s = last
    state.clock_end_s = max(state.clock_end_s, last)
    day = int(float(df.get_column("arrival_s").min()) // 86400)  # type: ignore[arg-type]
    part = window_dir / f"day={day}" / f"part-{tag}.parquet"
    part.parent.mkdir(parents=True, exist_ok=True)
    write_trace(part, df.to_arrow(), meta.replace(origin_utc=state.clock_origin_utc,
                                                  num_rows=df.height))
    outcome.parts.append(str(part))
    rel = str(part.relative_to(window_dir))
    if rel not in state.parts:
        state.parts.append(rel)
    outcome.num_new_requests += df.height
    return df.height


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def load_window(window_dir: pathlib.Path, end_s: float,
                window_s: float) -> "Trace":
    """The last ``window_s`` seconds up to ``end_s`` as a ``Trace`` re-based to 0.

    Raises:
        ConfigError: the window holds no requests yet.
    """
    from tuner.trace import read_trace, slice_trace

    if not window_dir.exists() or not any(window_dir.rglob("*.parquet")):
        raise ConfigError(f"{window_dir}: no ingested traffic yet; check `sources:` globs")
    return slice_trace(read_trace(window_dir), start_s=max(0.0, end_s - window_s))


def expired_parts(window_dir: pathlib.Path, parts: list[str], end_s: float,
                  window_s: float) -> list[str]:
    """Listed parts whose every request is older than the window (or that are gone)."""
    out = []
    for rel in parts:
        path = window_dir / rel
        if not path.exists():
            out.append(rel)
            continue
        newest = pl.scan_parquet(path).select(pl.col("arrival_s").max()).collect().item()
        if newest is not None and newest < end_s - window_s:
            out.append(rel)
    return out


def remove_unlisted(window_dir: pathlib.Path, parts: list[str]) -> list[str]:
    """Delete part files the state does not list (expired, or left by a crashed run)."""
    listed = set(parts)
    removed = []
    if not window_dir.exists():
        return removed
    for path in sorted(window_dir.rglob("part-*.parquet")):
        if str(path.relative_to(window_dir)) not in listed:
            path.unlink()
            removed.append(str(path))
    for folder in sorted(window_dir.glob("day=*")):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return removed
