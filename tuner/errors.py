"""The tuner's exception tree.

``ValueError`` subclasses mean bad input (a user can fix it); ``AssertionError`` or
``RuntimeError`` mean a bug in tuner. The CLI turns every ``TunerError`` into a one-line
``Error: ...`` and a non-zero exit, never a traceback.
"""

from __future__ import annotations


class TunerError(Exception):
    """Root of every error tuner raises on purpose."""


class TraceFormatError(TunerError, ValueError):
    """An input log record is malformed; the message starts with ``file:line:``."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.path = path
        self.line = line
        self.field = field
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(f"{where}{message}")


class TraceSchemaError(TunerError, ValueError):
    """A Parquet trace does not follow docs/trace-format.md."""


class ConfigError(TunerError, ValueError):
    """Settings, presets or a search space are invalid (e.g. a combination vLLM rejects)."""


class ProfileError(TunerError, ValueError):
    """A profile file is missing fields or holds invalid values."""


class UnsupportedVllmVersion(TunerError, ValueError):
    """The requested or installed vLLM version is not one tuner supports for this feature."""


class StudyNotFound(TunerError, KeyError):
    """An Optuna study name does not exist in the given storage."""

    def __str__(self) -> str:
        # KeyError's str() quotes its argument; the CLI prints this message as is.
        return str(self.args[0]) if self.args else ""


class BackendError(TunerError, RuntimeError):
    """A replay backend failed (vLLM driver died, server unreachable, ...)."""


class OutputError(TunerError, ValueError):
    """An output path cannot be written safely (an input, a device, a folder, no access)."""
