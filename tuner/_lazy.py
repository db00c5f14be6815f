"""Package attributes imported on first use (PEP 562 module ``__getattr__``).

A package re-exports its API without importing it: ``import tuner.trace`` must not load
polars, and ``import tuner.serve`` must not load the server stack, until a name is used.
Each package lists ``name -> module`` and installs :func:`lazy_getattr`'s function as its
``__getattr__``; the first lookup imports the module and caches the value in the package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, table: Mapping[str, str],
                 namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that resolves ``table``'s names.

    Args:
        package: the package's ``__name__`` (for the AttributeError message).
        table: exported name -> the module that defines it.
        namespace: the package's ``globals()``, where a resolved value is cached so the
            next lookup does not reach ``__getattr__``.
    """

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
