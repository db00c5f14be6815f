"""The drivers' command line: ``SCRIPT JOB.pickle RESULT.pickle``.

Each vllm-core driver (``driver.py``, ``dp_driver.py``, ``disagg.py``) runs in the vLLM
environment as its own script, started by ``tuner.vllm_core.backend``; they differ only in
how one job is replayed. A list of jobs gives a list of results: one vLLM import for many
replays, as the parity tests use. Standard library only, like the drivers.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable
from typing import Any


def run_job_file(argv: list[str], replay_job: Callable[[dict], Any], script: str) -> int:
    """Replay the pickled job (or list of jobs) in ``argv[1]`` into ``argv[2]``; exit code."""
    if len(argv) != 3:
        print(f"usage: {script} JOB.pickle RESULT.pickle", file=sys.stderr)
        return 2
    with open(argv[1], "rb") as f:
        job = pickle.load(f)
    result = [replay_job(j) for j in job] if isinstance(job, list) else replay_job(job)
    from tuner.outputs import write_bytes  # standard library only

    write_bytes(argv[2], pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL), announce=False)
    return 0
