"""Import ``tuner.vllm_plugin`` the way ``--scheduler-cls`` does; list what got imported."""

import json
import sys

import tuner.vllm_plugin  # noqa: F401

HEAVY = ("click", "polars", "pyarrow", "optuna", "rich", "zstandard")
print(json.dumps({
    "heavy": sorted(m for m in sys.modules if m.split(".")[0] in HEAVY),
    "tuner_modules": sorted(m for m in sys.modules if m == "tuner" or m.startswith("tuner.")),
}))
