"""Plugin configuration, version guard and the cases where it steps aside (JSON lines)."""

import importlib.util
import json
import logging
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
spec = importlib.util.spec_from_file_location(
    "_vllm_core_driver", os.path.join(ROOT, "tuner", "vllm_core", "driver.py"))
drv = importlib.util.module_from_spec(spec)
sys.modules["_vllm_core_driver"] = drv
spec.loader.exec_module(drv)

from tuner import vllm_plugin  # noqa: E402
from tuner import vllm_plugin as impl  # noqa: E402


def emit(case, **kw):
    print(json.dumps({"case": case, **kw}), flush=True)


def build(**settings):
    return drv.build_scheduler(model_dir=sys.argv[1], settings=settings, block_size=16,
                               num_gpu_blocks=64, max_model_len=8192)


emit("minor", value=vllm_plugin.vllm_minor_version())
c = vllm_plugin.resolve_config({"cache_aware_admission_window": 16,
                                "cache_aware_admission_threshold": 0.25}, {})
emit("additional_config", value=[c.window, c.threshold, c.source])
env = {"TUNER_CACHE_AWARE_ADMISSION_WINDOW": "8", "TUNER_CACHE_AWARE_ADMISSION_THRESHOLD": "0.75"}
c = vllm_plugin.resolve_config(None, env)
emit("env", value=[c.window, c.threshold, c.source])
c = vllm_plugin.resolve_config('{"cache_aware_admission_window": 16}', env)
emit("additional_config_wins", value=[c.window, c.threshold, c.source])
c = vllm_plugin.resolve_config({}, {})
emit("defaults", value=[c.window, c.threshold, c.source])
try:
    vllm_plugin.resolve_config({"cache_aware_admission_window": -1}, {})
except ValueError as e:
    emit("bad_window", error=str(e))

real = impl.vllm.__version__
impl.vllm.__version__ = "0.34.0"
try:
    build(cache_aware_admission_window=4)
except vllm_plugin.UnsupportedVllmVersionError as e:
    emit("unsupported", error=str(e))
finally:
    impl.vllm.__version__ = real

s = build(cache_aware_admission_window=4, policy="priority")
emit("priority", value=s.cache_aware_window)


class Log(logging.Handler):
    lines = []

    def emit(self, record):
        Log.lines.append(record.getMessage())


impl.logger.addHandler(Log())
s = drv.build_scheduler(model_dir=sys.argv[1], settings={"cache_aware_admission_window": 4},
                        block_size=16, num_gpu_blocks=64, enable_prefix_caching=False)
emit("no_prefix_caching", value=s.cache_aware_window)

# A vLLM with PR #54625 has the field on SchedulerConfig: the plugin steps aside.
from vllm.config import SchedulerConfig  # noqa: E402

SchedulerConfig.cache_aware_admission_window = 0
try:
    s = build(cache_aware_admission_window=4)
finally:
    del SchedulerConfig.cache_aware_admission_window
emit("native", value=s.cache_aware_window, log=" | ".join(Log.lines))
