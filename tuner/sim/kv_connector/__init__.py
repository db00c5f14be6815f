"""KV connectors of the twin: the scheduler-side interface (``base.KVConnector``) and vLLM
0.33.0's CPU offloading (``offloading.OffloadingConnector`` over ``cpu_manager`` and
``policies``); ``admission`` and ``hooks`` are the scheduler's connector branches.
docs/kv-offloading.md describes the tier, its timing and what it does not model."""

from tuner.sim.kv_connector.settings import OffloadSettings

__all__ = ["OffloadSettings"]
