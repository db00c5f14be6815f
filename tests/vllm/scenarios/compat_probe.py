"""Runs in a vLLM Python: print SchedulerConfig's fields and whether the Scheduler has the
single-engine prefill cadence (``local_prefill_interval``), as one JSON line."""

import dataclasses
import inspect
import json

from vllm.config import SchedulerConfig
from vllm.v1.core.sched import scheduler

print(json.dumps({
    "fields": sorted(f.name for f in dataclasses.fields(SchedulerConfig)),
    "local_cadence": "local_prefill_interval" in inspect.getsource(scheduler),
}))
