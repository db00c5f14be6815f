"""tuner: trace-replay tuner for vLLM's V1 scheduler.

The package follows the data: ``trace`` (ingest, canonical Parquet traces) ->
``sim`` (CPU twin of vLLM's scheduler, prefix cache and step time) -> ``replay``
(backends behind one interface) -> ``metrics`` -> ``tune`` (Optuna search) ->
``profile`` (profiles and exporters) -> ``jobs`` (periodic re-tuning).
``cli`` is a thin Click shell over those library APIs.
"""

__version__ = "0.1.0"

#: The vLLM release whose scheduler semantics the twin mirrors (plus PR #54625).
VLLM_TWIN_VERSION = "0.33.0"
