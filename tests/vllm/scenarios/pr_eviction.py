"""PR #54625's eviction scenario on vLLM's real Scheduler with tuner's plugin.

Run with a vLLM python: ``python pr_eviction.py MODEL_DIR`` -> one JSON line per case.
warm0 (48 tokens of one value, max_tokens=1) runs and finishes, leaving 3 cached blocks
in a 5-block cache (4 usable); then ``cold`` (48 other tokens) and ``warm`` (warm0's
prompt) arrive in that order. The PR's test: with the window, warm goes first and
computes only its last block; without it, cold evicts 2 of warm's 3 blocks.
"""

import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
spec = importlib.util.spec_from_file_location(
    "_vllm_core_driver", os.path.join(ROOT, "tuner", "vllm_core", "driver.py"))
drv = importlib.util.module_from_spec(spec)
sys.modules["_vllm_core_driver"] = drv
spec.loader.exec_module(drv)

from tuner import vllm_plugin  # noqa: E402  (after the driver put ROOT on sys.path)

BS = 16


def step(s):
    out = s.schedule()
    s.update_from_output(out, drv.fake_model_output(s, out, lambda r: 5))
    return dict(out.num_scheduled_tokens)


def case(model_dir, cls, window, threshold):
    settings = {"max_num_seqs": 16, "max_num_batched_tokens": 8192,
                "cache_aware_admission_window": window,
                "cache_aware_admission_threshold": threshold}
    s = drv.build_scheduler(model_dir=model_dir, settings=settings, block_size=BS,
                            num_gpu_blocks=5, max_model_len=8192,
                            async_scheduling=cls is vllm_plugin.CacheAwareAsyncScheduler,
                            scheduler_cls=cls)
    hasher = drv.make_block_hasher(BS)
    s.add_request(drv.make_vllm_request("warm0", [7] * 48, 1, hasher))
    first = step(s)
    while s.requests:  # async scheduling needs one more call to see warm0 finish
        step(s)
    s.add_request(drv.make_vllm_request("cold", [9] * 48, 1, hasher))
    s.add_request(drv.make_vllm_request("warm", [7] * 48, 1, hasher))
    probe = vllm_plugin.num_cached_tokens(s, s.requests["warm"])
    a, b = step(s), step(s)
    return {"cls": cls.__name__, "window": window, "threshold": threshold,
            "warm0": first, "probe_warm": probe, "step1": a, "step2": b,
            "reorders": s.num_cache_aware_reorders, "hook": s.cache_aware_last_hook, "window_applied": s.cache_aware_window}


def main():
    model_dir = sys.argv[1]
    for cls in (vllm_plugin.CacheAwareScheduler, vllm_plugin.CacheAwareAsyncScheduler):
        for window, threshold in ((4, 0.0), (0, 0.0), (4, 0.5)):
            print(json.dumps(case(model_dir, cls, window, threshold)), flush=True)


if __name__ == "__main__":
    main()
