"""The fake model runner of the ``vllm-core`` driver: what vLLM's scheduler gets back
from a step it scheduled (``ModelRunnerOutput``), and the stats gauge it emits.

Plain functions over vLLM objects, imported lazily: this module runs inside the vLLM
Python, like ``tuner.vllm_core.driver``, and is kept apart from it so the driver stays a
loop adapter (the KV connector's fake worker adds its part of the output here too:
``kv_connector_output``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["fake_model_output", "model_runner_output", "sampled_tokens", "stats_gauge"]


def sampled_tokens(scheduler: Any, output: Any, next_token: Any) -> list[list[int]]:
    """What the model runner samples for ``output``, decided right after ``schedule()``.

    One token for each scheduled request whose sequence the step completes, none for a
    prefill chunk (vLLM's runner samples it and discards the sample). ``schedule()`` has
    already advanced ``num_computed_tokens`` by the step's tokens and set
    ``is_prefill_chunk`` (``_update_after_schedule``, computed before ``AsyncScheduler``
    adds this step's output placeholder). ``next_token(request)`` gives the id, read
    from the position the step samples (``num_computed_tokens`` after scheduling).
    Must run before the next ``schedule()``: under async scheduling that call advances
    the request again before this step's ``update_from_output``.
    """
    return [[] if scheduler.requests[rid].is_prefill_chunk
            else [next_token(scheduler.requests[rid])]
            for rid in output.num_scheduled_tokens]


def model_runner_output(output: Any, sampled: list[list[int]],
                        kv_connector_output: Any = None) -> Any:
    """The ``ModelRunnerOutput`` of ``output`` with ``sampled`` (one list per request) and
    the KV connector worker's report (``KVConnectorOutput``, or None)."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(output.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled,
                             kv_connector_output=kv_connector_output)


def fake_model_output(scheduler: Any, output: Any, next_token: Any) -> Any:
    """``ModelRunnerOutput`` for ``output``, sampling decided now: call it right after
    ``schedule()`` and before the next one (:func:`sampled_tokens`)."""
    return model_runner_output(output, sampled_tokens(scheduler, output, next_token))


def stats_gauge(scheduler: Any, engine_core_outputs: dict[int, Any]) -> float:
    """The KV-usage gauge vLLM emits for this update: ``SchedulerStats.kv_cache_usage``,
    sampled by ``make_stats`` at the end of ``update_from_output`` (under async
    scheduling it already includes the next step's allocations)."""
    for eco in engine_core_outputs.values():
        stats = getattr(eco, "scheduler_stats", None)
        if stats is not None:
            return float(stats.kv_cache_usage)
    return float(scheduler.kv_cache_manager.usage)
