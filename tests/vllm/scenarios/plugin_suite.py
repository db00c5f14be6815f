"""Run several plugin scenarios in one vLLM process (one ~10-60 s vLLM import, not three).

``python plugin_suite.py MODEL_DIR NAME...``: runs ``scenarios/NAME.py`` in turn (as
``__main__``, with ``sys.argv = [path, MODEL_DIR]``) and prints each of its JSON lines
wrapped as ``{"scenario": NAME, "row": {...}}``.
"""

import contextlib
import io
import json
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
model_dir, names = sys.argv[1], sys.argv[2:]
for name in names:
    path = os.path.join(HERE, f"{name}.py")
    buf = io.StringIO()
    sys.argv = [path, model_dir]
    with contextlib.redirect_stdout(buf):
        runpy.run_path(path, run_name="__main__")
    for line in buf.getvalue().splitlines():
        if line.startswith("{"):
            print(json.dumps({"scenario": name, "row": json.loads(line)}), flush=True)
