"""Every file the tuner writes goes through here: checked first, then written atomically.

Why one module: an ``-o`` that names one of the command's inputs, a device or a folder used
to be replaced without a word (``tuner ingest log.jsonl -o log.jsonl`` turned the log into
Parquet; ``-o /dev/full`` as root replaced the device node), and seven copies of the
temp-file-and-rename dance each had their own gaps (no fsync, mode 0600, no folder fsync).
Standard library only, so every stage (``tuner.sim`` inside a vLLM environment included)
may import it.

Rules, in order (:func:`check_output`):

1. A **symlink** output is written *through*: its final target is replaced atomically and
   the link itself stays (a ``current.yaml -> v7.yaml`` link keeps pointing where it did).
   A dangling link creates its target.
2. The target must be a **regular file** or not exist: a directory, a character or block
   device, a FIFO or a socket is refused (``Error: /dev/full: is a character device ...``).
3. The target must not be **one of the inputs** (same device and inode, so hard links and
   ``./x`` vs ``x`` are caught).
   Besides the ``inputs`` a caller names, every file the running command was given (its
   arguments and options, registered by the CLI through :func:`note_input`) counts: a
   ``--baseline P.yaml -o P.yaml`` used to replace the baseline with a "Note".
4. A target the user cannot write (mode 0444) is refused, not replaced behind their back;
   ``-`` is refused (it means stdout to most tools, and used to create a file named ``-``).
5. Missing parent folders are created; a parent that is a file, or a folder that refuses
   new files (``/proc``), is a one-line error.

A folder output (``export --format plugin -o DIR``) goes through :func:`check_output_folder`:
a new or empty folder, or one this kind of export wrote before (its marker file is there).

Writing (:class:`AtomicOutput`): a temporary ``.NAME.<random>.tmp`` in the target's own folder
(so the rename never crosses file systems), flushed and fsynced, given its final mode, then
``os.replace``-d over the target and the folder fsynced: a reader, a crash or a Ctrl-C
sees the old file or the new one, never a torn one, and an error leaves nothing behind.
The mode is the caller's (profiles and plugins pass 0644 so a vLLM service running as
another user can read them), else an existing target's mode, else ``0666 & ~umask`` as a
plain ``open`` would give. Replacing an existing file is announced through the notifier
the CLI installs (:func:`set_notifier`); the library itself prints nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from tuner.errors import OutputError

PathLike = str | os.PathLike[str]

_notifier: Callable[[str], None] | None = None


def set_notifier(notify: Callable[[str], None] | None) -> None:
    """Install the function told about replaced files (the CLI prints to stderr)."""
    global _notifier
    _notifier = notify


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


@dataclass(frozen=True)
class OutputPlan:
    """Where an output will land, decided before anything is written."""

    requested: Path  # the path as the caller gave it
    target: Path  # the file that is created or replaced (a symlink's final target)
    existing_mode: int | None  # permission bits of the file being replaced, None if new

    @property
    def replaces(self) -> bool:
        return self.existing_mode is not None

    @property
    def via_symlink(self) -> bool:
        return self.target != self.requested

    def describe(self) -> str:
        via = f" (through the symlink {self.requested})" if self.via_symlink else ""
        return f"replaced existing {self.target}{via}"


#: Files the running command reads (its arguments and options): path by (device, inode).
_noted_inputs: dict[tuple[int, int], str] = {}


def note_input(path: PathLike) -> None:
    """Count ``path`` (an existing regular file) as an input of the running command."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return
    if stat.S_ISREG(st.st_mode):
        _noted_inputs[(st.st_dev, st.st_ino)] = os.fspath(path)


def forget_inputs() -> None:
    """Start a new command: no file counts as an input until noted."""
    _noted_inputs.clear()


def _noted_input_for(st: os.stat_result) -> str | None:
    """The noted input ``st`` is, if that file is still there (inode numbers are reused
    once a file is deleted, so the noted path must still name the same file)."""
    source = _noted_inputs.get((st.st_dev, st.st_ino))
    if source is None:
        return None
    try:
        again = os.stat(source)
    except OSError:
        return None
    return source if (again.st_dev, again.st_ino) == (st.st_dev, st.st_ino) else None


def check_output(path: PathLike, *, inputs: Iterable[PathLike] = ()) -> OutputPlan:
    """Decide where ``path`` writes, or raise :class:`OutputError` with a one-line reason."""
    if os.fspath(path) == "-":
        raise OutputError("'-': this output must be a file (stdout is where the command "
                          "prints without -o); give a file name")
    requested = Path(path).expanduser()
    if str(requested) in ("", "."):
        raise OutputError(f"{str(path)!r}: not a file name")
    target = Path(os.path.realpath(requested)) if requested.is_symlink() else requested
    try:
        st: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise OutputError(f"{requested}: {_file_ancestor(target.parent)} is a file, "
                          "not a folder") from None
    except OSError as exc:
        raise OutputError(f"{requested}: cannot check the output: "
                          f"{exc.strerror or exc}") from None
    if st is not None:
        for test, kind in _KINDS:
            if test(st.st_mode):
                raise OutputError(f"{requested}: is {kind}; give a regular file to write")
        for source in inputs:
            try:
                other = os.stat(source)
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                raise _is_input(requested, os.fspath(source))
        noted = _noted_input_for(st)
        if noted is not None:
            raise _is_input(requested, noted)
        # No write bit for anyone is read-only even to root, whom os.access always lets.
        if not os.access(target, os.W_OK) or not st.st_mode & 0o222:
            raise OutputError(f"{requested}: is read-only (mode {stat.S_IMODE(st.st_mode):04o}); "
                              "make it writable to replace it, or choose another output")
    blocker = _file_ancestor(target.parent)
    if blocker is not None:
        raise OutputError(f"{requested}: {blocker} is a file, not a folder")
    return OutputPlan(requested=requested, target=target,
                      existing_mode=None if st is None else stat.S_IMODE(st.st_mode))


def _is_input(requested: Path, source: str) -> OutputError:
    return OutputError(f"{requested}: is also an input ({source}); writing it would destroy "
                       "the input, choose another output")


def check_output_folder(folder: PathLike, marker: str) -> Path:
    """A folder output may be new, empty, or one holding ``marker`` (written there by the
    same kind of output before); anything else is refused, so an export never replaces
    files it did not write (``-o .`` in a checkout used to rewrite its ``tuner/*.py``)."""
    out = Path(folder).expanduser()
    if os.fspath(folder) == "-":
        raise OutputError("'-': this output is a folder; give its path")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: is a file; this output is a folder")
    if out.is_dir() and not (out / marker).is_file():
        try:
            entries = sorted(p.name for p in out.iterdir())
        except OSError as exc:
            raise OutputError(f"{out}: cannot list the folder: {exc.strerror or exc}") from None
        if entries:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise OutputError(f"{out}: the folder is not empty ({shown}) and was not written "
                              f"by this export (no {marker}); give a new or empty folder")
    return out


def _file_ancestor(folder: Path) -> Path | None:
    """The nearest existing ancestor of ``folder`` when it is not a directory."""
    for p in (folder, *folder.parents):
        if p.exists():
            return None if p.is_dir() else p
        if p.is_symlink():  # dangling link in the middle of the path
            return p
    return None


def _default_mode() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


class AtomicOutput:
    """A temporary file beside the target that becomes the target on :meth:`commit`.

    For writers that need a path (pyarrow) use :attr:`tmp_path`; for text or bytes use
    :func:`write_text` / :func:`write_bytes` / :func:`open_output`. As a context manager it
    commits on a clean exit and removes the temporary file on an exception.
    """

    def __init__(self, path: PathLike, *, inputs: Iterable[PathLike] = (),
                 mode: int | None = None, announce: bool = True) -> None:
        self.plan = check_output(path, inputs=inputs)
        self.mode = mode
        self.announce = announce
        folder = self.plan.target.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.plan.target.name}.", suffix=".tmp",
                                       dir=folder)
        except OSError as exc:
            raise OutputError(f"{self.plan.requested}: cannot create a file in {folder}: "
                              f"{exc.strerror or exc}") from None
        self.tmp_path = Path(tmp)
        self._done = False
        os.close(fd)

    @property
    def path(self) -> Path:
        """The file the output becomes (a symlink's target when written through one)."""
        return self.plan.target

    def commit(self) -> Path:
        """fsync the temporary file, give it its mode, rename it over the target."""
        if self._done:
            raise RuntimeError(f"{self.plan.requested}: output committed or aborted twice")
        self._done = True
        try:
            fd = os.open(self.tmp_path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            mode = self.mode if self.mode is not None else (
                self.plan.existing_mode if self.plan.existing_mode is not None
                else _default_mode())
            os.chmod(self.tmp_path, mode)
            os.replace(self.tmp_path, self.plan.target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.tmp_path.unlink()
            raise OutputError(f"{self.plan.requested}: cannot write: "
                              f"{exc.strerror or exc}") from None
        except BaseException:
            with contextlib.suppress(OSError):
                self.tmp_path.unlink()
            raise
        fsync_dir(self.plan.target.parent)
        if self.announce and self.plan.replaces and _notifier is not None:
            _notifier(self.plan.describe())
        return self.plan.target

    def abort(self) -> None:
        """Remove the temporary file; the target is untouched (idempotent)."""
        self._done = True
        with contextlib.suppress(OSError):
            self.tmp_path.unlink()

    def __enter__(self) -> "AtomicOutput":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            if not self._done:
                self.commit()
        else:
            self.abort()


@contextlib.contextmanager
def open_output(path: PathLike, binary: bool = False, *, inputs: Iterable[PathLike] = (),
                mode: int | None = None, announce: bool = True,
                encoding: str = "utf-8") -> Iterator[IO[Any]]:
    """``with open_output(p) as fh: fh.write(...)``: committed when the block ends cleanly."""
    out = AtomicOutput(path, inputs=inputs, mode=mode, announce=announce)
    try:
        fh = open(out.tmp_path, "wb" if binary else "w",  # noqa: SIM115
                  encoding=None if binary else encoding)
        try:
            yield fh
        finally:
            fh.close()
    except BaseException:
        out.abort()
        raise
    out.commit()


def write_text(path: PathLike, text: str, *, inputs: Iterable[PathLike] = (),
               mode: int | None = None, announce: bool = True) -> Path:
    """Create or replace ``path`` with ``text`` (UTF-8) atomically; returns the target."""
    with open_output(path, inputs=inputs, mode=mode, announce=announce) as fh:
        fh.write(text)
    return check_target(path)


def write_bytes(path: PathLike, data: bytes, *, inputs: Iterable[PathLike] = (),
                mode: int | None = None, announce: bool = True) -> Path:
    """Create or replace ``path`` with ``data`` atomically; returns the target."""
    with open_output(path, True, inputs=inputs, mode=mode, announce=announce) as fh:
        fh.write(data)
    return check_target(path)


def write_json(path: PathLike, data: Any, *, mode: int | None = None,
               announce: bool = False) -> Path:
    """Indented, key-sorted JSON; internal state files, so not announced by default."""
    return write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n",
                      mode=mode, announce=announce)


def check_target(path: PathLike) -> Path:
    """The file ``path`` names once written (follows a symlink)."""
    p = Path(path).expanduser()
    return Path(os.path.realpath(p)) if p.is_symlink() else p


def fsync_dir(folder: PathLike) -> None:
    """Make a rename in ``folder`` durable (no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
