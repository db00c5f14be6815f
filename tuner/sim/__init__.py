"""tuner.sim: the CPU twin of vLLM's V1 scheduler and prefix cache.

Public names other packages use; implementation modules mirror vLLM's files
(``block_pool``, ``kv_cache_manager``, ``request_queue``, ``scheduler``,
``scheduler_output``); ``clock`` is the replay clock (arrivals, batch queues, the async
batch-queue depth ``batch_queue_depth``), ``loop`` the single-engine loop every engine
runs on (``StepEngine``) and ``engine`` the twin's side of it. The fast path is
``decode_group``; its contract (and how each settings field is treated) is
``fast_path``. ``tuner.sim`` imports no pyarrow, polars, optuna or click.
"""

from tuner.sim.batch import StepBatch
from tuner.sim.block_pool import BlockPool
from tuner.sim.clock import batch_queue_depth
from tuner.sim.engine import Simulator
from tuner.sim.kv_cache_manager import KVCacheManager
from tuner.sim.load import ClosedLoop, OpenLoop
from tuner.sim.loop import AdmissionRules, ReplayLoop, StepEngine
from tuner.sim.request import RequestStatus, SimRequest
from tuner.sim.request_queue import FCFSRequestQueue, PriorityRequestQueue, create_request_queue
from tuner.sim.scheduler import Scheduler
from tuner.sim.scheduler_output import SchedulerOutput
from tuner.sim.settings import CacheSettings, SchedulerSettings, SimOptions

__all__ = [
    "AdmissionRules",
    "BlockPool",
    "CacheSettings",
    "ClosedLoop",
    "FCFSRequestQueue",
    "KVCacheManager",
    "OpenLoop",
    "PriorityRequestQueue",
    "ReplayLoop",
    "RequestStatus",
    "Scheduler",
    "SchedulerOutput",
    "SchedulerSettings",
    "SimOptions",
    "SimRequest",
    "Simulator",
    "StepBatch",
    "StepEngine",
    "batch_queue_depth",
    "create_request_queue",
]
