"""How a test asks for an outside environment (a vLLM Python, PostgreSQL, Chromium, the
installed ``tuner`` console script).

Locally a missing environment skips the test with a one-line reason. CI sets
``TUNER_REQUIRE_ENVS=1`` (``.ci/run``), and then the same absence FAILS the test: CI
provides every environment, so a skip there means a broken setup that would otherwise pass
silently.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
from typing import NoReturn

import pytest

REQUIRE_VAR = "TUNER_REQUIRE_ENVS"


def envs_required() -> bool:
    """True where a missing environment is an error (CI)."""
    return os.environ.get(REQUIRE_VAR, "").strip() not in ("", "0")


def missing_env(reason: str) -> NoReturn:
    """Skip with ``reason``, or fail with it under ``TUNER_REQUIRE_ENVS=1``."""
    if envs_required():
        pytest.fail(f"{reason} [{REQUIRE_VAR}=1: this environment is required]", pytrace=False)
    pytest.skip(reason)


def env_python(var: str, hint: str) -> str:
    """The executable named by ``$var`` (a vLLM Python), or :func:`missing_env`."""
    path = os.environ.get(var, "")
    if not path:
        missing_env(f"{var} is unset ({hint})")
    if not os.access(path, os.X_OK):
        pytest.fail(f"{var}={path} is not an executable python", pytrace=False)
    return path


def tuner_executable() -> str:
    """The installed ``tuner`` console script: the one beside the running interpreter (the
    environment under test), else the first on ``PATH``."""
    here = pathlib.Path(sys.executable).with_name("tuner")
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("tuner")
    if found is None:
        pytest.fail(f"no `tuner` console script beside {sys.executable} or on PATH "
                    "(pip install -e . first)", pytrace=False)
    return found
