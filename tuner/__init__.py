"""tuner: trace-replay tuner for vLLM's V1 scheduler.

The package follows the data: ``trace`` (ingest, canonical Parquet traces) ->
``sim`` (CPU twin of vLLM's scheduler, prefix cache and step time) -> ``replay``
(backends behind one interface) -> ``serve`` (a live ``vllm serve``) -> ``metrics`` ->
``fidelity`` (the twin against vLLM) -> ``tune`` (Optuna search) -> ``profile``
(profiles and exporters) -> ``jobs`` (periodic re-tuning).
``cli`` is a thin Click shell over those library APIs.
"""

__version__ = "0.1.0"

#: The vLLM release whose scheduler semantics the twin mirrors (plus PR #54625).
VLLM_TWIN_VERSION = "0.33.0"


def _mark_forked_child() -> None:
    global IN_FORKED_CHILD
    IN_FORKED_CHILD = True


#: True in a process forked from one that had imported tuner (tuning workers). polars
#: must not run there: its thread pool does not survive ``fork`` and the child hangs, so
#: code with a polars fast path checks this and takes its numpy path instead.
IN_FORKED_CHILD = False
__import__("os").register_at_fork(after_in_child=_mark_forked_child)
