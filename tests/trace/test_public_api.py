"""The public surface of tuner.trace, and that its plain-Python part stays plain."""

from __future__ import annotations

import subprocess
import sys

import tuner.trace as trace


def test_all_names_resolve_to_the_api_not_modules() -> None:
    import types

    import tuner.trace.formats  # noqa: F401  (imports every implementation module)

    for name in trace.__all__:
        value = getattr(trace, name)
        assert not isinstance(value, types.ModuleType), name


def test_trace_request_import_stays_plain_python() -> None:
    # tuner.sim imports TraceRequest and reblock inside vLLM environments: no heavy deps.
    code = ("import sys; from tuner.trace import TraceRequest, reblock, reblock_request_hashes; "
            "heavy = [m for m in ('pyarrow', 'polars', 'numpy', 'click', 'rich') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
