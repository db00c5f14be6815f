"""The retune job's crash hook; its crash-safe writes are :mod:`tuner.outputs`'s.

The writes (temp file in the same folder, fsync, ``os.replace``, folder fsync) live in
:mod:`tuner.outputs`, the one writer every stage uses.
"""

from __future__ import annotations

import os


def crash_point(phase: str) -> None:
    """Test hook: ``TUNER_RETUNE_CRASH_AT=<phase>`` makes the job die here (``os._exit(70)``).

    Used by tests/jobs to kill the job between the steps of its commit order; documented
    in docs/retune.md. Costs one environment lookup when unset.
    """
    if os.environ.get("TUNER_RETUNE_CRASH_AT") == phase:
        os._exit(70)
