"""Load the exported plugin bundle as a bare vLLM server would; then run it.

Run with a vLLM python, ``PYTHONPATH=BUNDLE`` only and a working directory outside the
repository: ``python bundle_load.py REPO MODEL_DIR`` -> JSON lines. Step 1 imports the
plugin exactly as ``--scheduler-cls tuner.vllm_plugin.CacheAwareScheduler`` does (vLLM's
own resolver) and lists what got imported; step 2 lets the repository's vLLM-core driver
(test-only: its modules are added behind the bundle's) run PR #54625's eviction case with
the bundle's classes, so the bundle is shown to be the working plugin, not just importable.
"""

import importlib
import importlib.util
import json
import os
import sys


def resolve(qualname):
    for where in ("vllm.utils.import_utils", "vllm.utils"):
        try:
            return importlib.import_module(where).resolve_obj_by_qualname(qualname)
        except (ImportError, AttributeError):
            continue
    raise RuntimeError("vLLM has no resolve_obj_by_qualname")


def main():
    repo, model_dir = sys.argv[1], sys.argv[2]
    heavy = ("click", "polars", "pyarrow", "optuna", "rich", "zstandard")
    repo_on_path = importlib.util.find_spec("tuner.sim") is not None
    sync_cls = resolve("tuner.vllm_plugin.CacheAwareScheduler")
    async_cls = resolve("tuner.vllm_plugin.CacheAwareAsyncScheduler")
    import tuner
    import tuner.vllm_plugin as plugin

    print(json.dumps({"step": "import", "repo_on_path": repo_on_path,
                      "plugin_file": plugin.__file__, "tuner_file": tuner.__file__,
                      "heavy": sorted(m for m in sys.modules if m.split(".")[0] in heavy),
                      "classes": [sync_cls.__name__, async_cls.__name__]}), flush=True)

    tuner.__path__.append(os.path.join(repo, "tuner"))  # the driver's tuner.sim, behind
    spec = importlib.util.spec_from_file_location(
        "_vllm_core_driver", os.path.join(repo, "tuner", "vllm_core", "driver.py"))
    drv = importlib.util.module_from_spec(spec)
    sys.modules["_vllm_core_driver"] = drv
    spec.loader.exec_module(drv)
    bs = 16
    s = drv.build_scheduler(model_dir=model_dir, settings={
        "max_num_seqs": 16, "max_num_batched_tokens": 8192,
        "cache_aware_admission_window": 4, "cache_aware_admission_threshold": 0.0},
        block_size=bs, num_gpu_blocks=5, max_model_len=8192, async_scheduling=False,
        scheduler_cls=sync_cls)
    hasher = drv.make_block_hasher(bs)

    def step():
        out = s.schedule()
        s.update_from_output(out, drv.fake_model_output(s, out, lambda r: 5))
        return dict(out.num_scheduled_tokens)

    s.add_request(drv.make_vllm_request("warm0", [7] * 48, 1, hasher))
    while True:
        step()
        if not s.requests:
            break
    s.add_request(drv.make_vllm_request("cold", [9] * 48, 1, hasher))
    s.add_request(drv.make_vllm_request("warm", [7] * 48, 1, hasher))
    a, b = step(), step()
    print(json.dumps({"step": "run", "step1": a, "step2": b,
                      "reorders": s.num_cache_aware_reorders,
                      "plugin_module": type(s).__module__,
                      "plugin_file": sys.modules[type(s).__module__].__file__}), flush=True)


if __name__ == "__main__":
    main()
