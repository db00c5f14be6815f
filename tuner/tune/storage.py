"""Where studies live: a local journal file by default, or a database URL.

* No URL: ``JournalStorage(JournalFileBackend(path))`` in a file next to the output
  (``profiles/NAME.yaml`` -> ``profiles/NAME.optuna-journal``). It is append-only, so a
  killed run loses at most the trial in flight, and several processes on one machine can
  share it (Optuna's symlink lock). Rerunning with the same study name continues it.
* ``journal:PATH`` or a path ending in ``.optuna-journal``/``.journal``: the same, elsewhere.
* ``postgresql://``, ``mysql://``, ``sqlite:///``: ``RDBStorage`` with a heartbeat, so
  workers on other machines can join and a dead worker's trial is failed, not left running.

Credentials never come from files tuner writes: give PostgreSQL its password through
``PGPASSWORD`` or a ``~/.pgpass`` file (libpq reads both when the URL has no password).
Every URL tuner prints or writes goes through :func:`redact_url`.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import re
import warnings
from typing import TYPE_CHECKING, Iterator
from urllib.parse import urlsplit, urlunsplit

from tuner.errors import ConfigError

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

JOURNAL_SUFFIX = ".optuna-journal"
_RDB_SCHEMES = ("postgresql", "postgres", "mysql", "sqlite")
#: Seconds between RDB heartbeats; a trial silent for ``_GRACE_S`` is failed by the next
#: worker that starts, so a killed remote worker does not hold a trial forever.
_HEARTBEAT_S = 30
_GRACE_S = 120


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Silence Optuna's INFO logging (a line per trial or study load) for the duration.

    tuner prints its own progress and tables; Optuna's per-trial lines would drown them.
    """
    import optuna

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Ctrl-C in a trial: Optuna logs the trial's failure with a traceback, then re-raises;
    # the CLI says "Interrupted" (exit 130), so the traceback would be noise. Filters on a
    # logger miss its children's records: the filter goes on the handlers.
    handlers = list(logging.getLogger("optuna").handlers)
    surplus = _NotSurplus()
    for handler in handlers:
        handler.addFilter(_not_interrupt)
        handler.addFilter(surplus)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(_not_interrupt)
            handler.removeFilter(surplus)
        optuna.logging.set_verbosity(level)


def _not_interrupt(record: "logging.LogRecord") -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, KeyboardInterrupt)


class SurplusTrial(Exception):
    """A trial begun once the budget was already taken by the trials numbered before it.

    Workers check the budget when a trial ends, but another worker can begin one between
    that check and its next ``ask``: with ``--trials 2`` the worker busy with the baseline
    track began a third trial while the other ran the second. The trial numbers, handed out
    by the storage one at a time, settle it (``tuner.tune.stage1._is_surplus``). Such a
    trial is FAILED at once, before anything is sampled or replayed, and marked so the
    tallies and reports leave it out; :func:`quiet_optuna` drops Optuna's failure log for
    it (defined here, beside that filter, which must recognise it).
    """


class _NotSurplus(logging.Filter):
    """Drop Optuna's two failure lines for a surplus trial (:class:`SurplusTrial`: begun
    past the budget by a racing worker, never run; not a failure the user should see): the first carries the exception, the second ("Trial N failed with
    value None.") follows it for the same trial number."""

    def __init__(self) -> None:
        super().__init__()
        self._number: str | None = None

    def filter(self, record: "logging.LogRecord") -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, SurplusTrial):
            self._number = record.getMessage().split(" ", 2)[1]
            return False
        if self._number is not None and record.getMessage().startswith(
                f"Trial {self._number} failed with value"):
            self._number = None
            return False
        return True


def redact_url(url: str | None) -> str | None:
    """``url`` with any password replaced by ``***`` (userinfo and ``password=`` query)."""
    if url is None:
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return re.sub(r"//([^:/@]*):[^@]*@", r"//\1:***@", url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        if ":" in userinfo:
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{hostport}"
    query = re.sub(r"(?i)(password=)[^&]*", r"\1***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def default_journal_path(output: str | pathlib.Path) -> pathlib.Path:
    """The study file that belongs to profile ``output``."""
    out = pathlib.Path(output)
    return out.with_name(out.stem + JOURNAL_SUFFIX)


def is_rdb_url(url: str) -> bool:
    return url.split(":", 1)[0].split("+", 1)[0] in _RDB_SCHEMES


def journal_path(url: str) -> pathlib.Path | None:
    """The file path if ``url`` names a journal file, else ``None``."""
    if url.startswith("journal:"):
        return pathlib.Path(url[len("journal:"):])
    if url.endswith((JOURNAL_SUFFIX, ".journal")) and "://" not in url:
        return pathlib.Path(url)
    return None


def open_storage(url: str) -> "BaseStorage":
    """An Optuna storage for ``url`` (journal file path or database URL).

    Raises:
        ConfigError: the URL is neither a journal path nor a supported database URL, or
            the database cannot be reached (the message shows the redacted URL).
    """
    import optuna
    from optuna.storages import JournalStorage, RDBStorage
    from optuna.storages.journal import JournalFileBackend

    path = journal_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    if not is_rdb_url(url):
        raise ConfigError(f"storage {redact_url(url)!r}: use a postgresql://, mysql:// or "
                          f"sqlite:/// URL, or a journal file path (journal:PATH or *{JOURNAL_SUFFIX})")
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    url = _with_available_driver(url)
    try:
        with warnings.catch_warnings():  # heartbeat_interval is "experimental" since 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return RDBStorage(url, engine_kwargs={"pool_pre_ping": True},
                              heartbeat_interval=_HEARTBEAT_S, grace_period=_GRACE_S)
    except (optuna.exceptions.StorageInternalError, ImportError) as exc:
        raise ConfigError(f"cannot open storage {redact_url(url)}: {exc}") from None
    except Exception as exc:  # SQLAlchemy OperationalError etc.: show a one-line reason
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"cannot open storage {redact_url(url)}: {redact_url(first)}") from None


def _with_available_driver(url: str) -> str:
    """``postgresql://`` with the driver that is installed.

    SQLAlchemy 2.1 maps a bare ``postgresql://`` to psycopg 3; tuner's ``postgres`` extra
    installs psycopg2 (binary wheels everywhere), so name it when psycopg 3 is absent.
    """
    import importlib.util

    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None \
            and importlib.util.find_spec("psycopg2") is not None:
        return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url
