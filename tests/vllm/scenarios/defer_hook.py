"""The plugin's copy of ``defer_prefills`` against vLLM's own local, and the fallback hook.

prefill_schedule_interval=4 with window 4 / threshold 0.0: two requests arrive every step
for 24 steps (0.33.0 defers prefill on 3 of every 4 steps; 0.32.0 never does without DP).
Then a step whose budget the running requests use up entirely (the waiting loop is never
entered), which exercises the after-schedule path. Prints one JSON line.
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


def step(s):
    out = s.schedule()
    s.update_from_output(out, drv.fake_model_output(s, out, lambda r: 5))
    return dict(out.num_scheduled_tokens)


s = drv.build_scheduler(model_dir=sys.argv[1], settings={
    "max_num_seqs": 64, "max_num_batched_tokens": 256, "prefill_schedule_interval": 4,
    "cache_aware_admission_window": 4, "cache_aware_admission_threshold": 0.0},
    block_size=16, num_gpu_blocks=400, max_model_len=8192)
hasher = drv.make_block_hasher(16)
n = 0
for i in range(24):
    for _ in range(2):
        s.add_request(drv.make_vllm_request(f"r{n}", [(n * 31 + j) % 900 + 3 for j in range(40)],
                                            30, hasher))
        n += 1
    step(s)
checks, skips = s.num_defer_checks, s.num_deferred_skips

# A step whose budget the running decodes use up: four decodes, a 4-token budget.
t = drv.build_scheduler(model_dir=sys.argv[1], settings={
    "max_num_seqs": 4, "max_num_batched_tokens": 4, "cache_aware_admission_window": 4,
    "cache_aware_admission_threshold": 0.0}, block_size=16, num_gpu_blocks=400, max_model_len=8192)
for k in range(4):
    t.add_request(drv.make_vllm_request(f"a{k}", [k + 3], 50, hasher))
step(t)  # admits the four 1-token prompts: budget 4 used by the waiting loop
for k in range(3):
    t.add_request(drv.make_vllm_request(f"w{k}", [7] * 20, 5, hasher))
decode = step(t)  # four decodes use the whole budget: the waiting loop is not entered
print(json.dumps({"checks": checks, "deferred_skips": skips, "hook_after_budget": t.cache_aware_last_hook,
                  "decode_step": decode}))
