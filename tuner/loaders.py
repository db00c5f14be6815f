"""One way to read a YAML or JSON input file, with one set of error messages.

Every file a user hands tuner (a retune config, a search space, a profile, a hardware or
calibration file, a model ``config.json``) is read here, so a mistake always reads the same:

* ``PATH: <what> not found``
* ``PATH: cannot read <what>: <OS reason>``
* ``PATH:LINE: invalid YAML: <problem>`` / ``PATH:LINE: invalid JSON: <problem>``
* ``PATH: <what> must be a mapping of keys`` (when a mapping is required)

and a caller that validates keys names the file, the line of the key and the key with
:meth:`LoadedFile.where` (``PATH:LINE: key.sub``). The error class is the caller's
(``ConfigError`` by default, ``ProfileError`` for profiles), so the CLI's one-line error
handling applies unchanged. Standard library plus PyYAML, which every tuner environment
(the vLLM ones included) has.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, TunerError


@dataclass(frozen=True, slots=True)
class LoadedFile:
    """A parsed file and where each of its keys is (1-based lines, YAML only)."""

    path: Path
    data: Any
    #: (key, subkey, ...) -> line of that key in the file; empty for JSON.
    lines: dict[tuple[str, ...], int] = field(default_factory=dict)

    def where(self, *key: str) -> str:
        """``PATH:LINE: key.sub`` for an error about ``key`` (``PATH: key.sub`` when the
        line is not known); ``PATH`` alone without a key."""
        line = self.lines.get(tuple(key))
        loc = f"{self.path}:{line}" if line is not None else str(self.path)
        return f"{loc}: {'.'.join(key)}" if key else loc


def load_yaml(path: str | os.PathLike[str], what: str, *, mapping: bool = False,
              error: type[TunerError] = ConfigError) -> LoadedFile:
    """Read and parse the YAML file ``path`` (a ``what``, for messages).

    Raises:
        error: missing or unreadable file, invalid YAML, or (``mapping``) not a mapping.
    """
    import yaml

    p, text = _read(path, what, error)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        raise error(f"{loc}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if mapping and not isinstance(data, dict):
        raise error(f"{p}: {what} must be a mapping of keys")
    return LoadedFile(p, data, _key_lines(text) if isinstance(data, dict) else {})


def load_json(path: str | os.PathLike[str], what: str, *, mapping: bool = False,
              error: type[TunerError] = ConfigError) -> LoadedFile:
    """Read and parse the JSON file ``path`` (see :func:`load_yaml`)."""
    p, text = _read(path, what, error)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{p}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    if mapping and not isinstance(data, dict):
        raise error(f"{p}: {what} must be a mapping of keys")
    return LoadedFile(p, data)


def _read(path: str | os.PathLike[str], what: str, error: type[TunerError]) -> tuple[Path, str]:
    p = Path(path).expanduser()
    try:
        return p, p.read_text()
    except FileNotFoundError:
        raise error(f"{p}: {what} not found") from None
    except IsADirectoryError:
        raise error(f"{p}: cannot read {what}: is a folder") from None
    except OSError as exc:
        raise error(f"{p}: cannot read {what}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        # The common mix-up: a trace given where a profile or config goes.
        why = "a Parquet file" if p.read_bytes()[:4] == b"PAR1" else exc.reason
        raise error(f"{p}: cannot read {what}: not UTF-8 text ({why})") from None


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Line of every mapping key (nested too) in a YAML document; {} if it cannot tell."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    out: dict[tuple[str, ...], int] = {}

    def walk(node: Any, prefix: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    here = prefix + (str(key.value),)
                    out.setdefault(here, key.start_mark.line + 1)
                    walk(value, here)

    walk(root, ())
    return out


__all__ = ["LoadedFile", "load_json", "load_yaml"]
