"""Replay metrics: one ``Summary`` from a backend's ``ReplayResult``.

Every backend (the twin, vLLM's own ``Scheduler``, a live server) hands over the same
records (``tuner.records``), so every backend is measured by the same code. The
definitions follow vLLM's own metrics and the SemiAnalysis InferenceX/AgentX pipelines;
docs/metrics.md states each one with its formula. In short:

* percentiles over requests (TTFT, TPOT, E2E, per-request mean ITL) are numpy's
  ``linear`` percentiles of the per-request values;
* ITL percentiles pool every inter-token gap of every counted request, as
  ``vllm bench serve`` does; the pooled ``(gap_s, count)`` pairs give the *exact* value
  numpy's ``linear`` method would give on the expanded list (:func:`weighted_percentile`);
* ``pXX_interactivity = 1 / pXX over requests of the per-request mean ITL`` (AgentX:
  ``p90_intvty = 1 / p90_itl``), so p90 interactivity is the speed the slowest 10% of
  users get;
* throughput per GPU divides by ``ReplayResult.num_gpus`` (tp * dp * replicas: every GPU
  of the deployment);
* ``engines``: one :class:`~tuner.records.EngineSummary` per engine (a DP rank of a
  replica), the balance behind the deployment's figures.

The package reads records only, never backend or twin objects. Its rooms:
:mod:`~tuner.metrics.summary` (``Summary``, :func:`summarize`),
:mod:`~tuner.metrics.percentiles` (exact percentiles over plain and pooled samples),
:mod:`~tuner.metrics.slo` (``--slo``/``--goodput`` parsing and counting),
:mod:`~tuner.metrics.parquet` (the per-request table) and :mod:`~tuner.metrics.tables`
(the rich tables ``tuner replay`` prints), :mod:`~tuner.metrics.bands` (the error bands a
summary carries: ``TTFT p90 1.9 s, likely 1.4-2.8 s``). Every public name is importable from
``tuner.metrics``.
"""

from __future__ import annotations

from tuner.metrics.bands import band_lines, band_text, likely, trial_band_keys, with_bands
from tuner.metrics.parquet import write_requests_parquet
from tuner.metrics.percentiles import (
    PERCENTS,
    PooledSamples,
    itl_samples_from_steps,
    percentile,
    weighted_percentile,
)
from tuner.metrics.slo import SLO_KEYS, good_requests, parse_slo
from tuner.metrics.summary import (REJECTED_WARN_FRACTION, Summary, kv_capacity_tokens,
                                   rejection_warning, summarize)
from tuner.metrics.tables import engine_table, summary_table

__all__ = [
    "PERCENTS",
    "PooledSamples",
    "REJECTED_WARN_FRACTION",
    "SLO_KEYS",
    "Summary",
    "band_lines",
    "band_text",
    "engine_table",
    "good_requests",
    "itl_samples_from_steps",
    "likely",
    "parse_slo",
    "percentile",
    "rejection_warning",
    "kv_capacity_tokens",
    "summarize",
    "summary_table",
    "trial_band_keys",
    "weighted_percentile",
    "with_bands",
    "write_requests_parquet",
]
