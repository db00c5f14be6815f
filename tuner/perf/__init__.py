"""tuner.perf: the clock of the twin (how long a step takes on the target deployment).

Everything the scheduler twin (``tuner.sim``) does not need to make vLLM's decisions but
the replay needs to put times on them: hardware and model presets, the per-kernel
step-time model, the KV-cache capacity vLLM would allocate, calibration files and fits.

Like ``tuner.sim`` it stays plain Python plus PyYAML (and NumPy for the fits only): the
step-time model is pickled into the vLLM-core driver, which runs inside a vLLM
environment without polars, optuna or click.
"""
