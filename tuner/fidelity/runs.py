"""Fidelity runs from a notebook: the decisions ``tuner calibrate`` and ``tuner fidelity``
make before they call the measuring code, as functions.

* :func:`calibrate_server` -- start (or attach to) a server the way a calibration needs it
  and fit the step-time model to its probes;
* :func:`twin_options_for` -- the twin's :class:`~tuner.sim.settings.SimOptions` that
  match the scheduler of an installed vLLM, for a step-by-step parity run.

The CLI commands are thin shells over these, so a notebook gets the same numbers as the
command line for the same arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from tuner.fidelity.calibrate import CalibrationResult, ProbePlan, calibrate
from tuner.serve.server import ServerOptions, VllmServer
from tuner.sim.settings import SchedulerSettings, SimOptions

PrefillIntervalMode = Literal["local", "dp", "off"]

#: ``vllm serve``'s ``max_num_seqs`` default for its 2048-token budget (a GPU under 70 GiB,
#: or a CPU: :meth:`SchedulerSettings.vllm_defaults`); more than any probe runs at once.
_PROBE_MAX_NUM_SEQS = 256


def probe_settings(max_num_batched_tokens: int) -> SchedulerSettings:
    """The scheduler settings a launched calibration server runs with.

    The token budget bounds every probe (:meth:`ProbePlan.validate` keeps a probe's step
    inside it, so no prefill is chunked); ``max_num_seqs`` is capped at the budget because
    vLLM refuses a budget smaller than ``max_num_seqs``.
    """
    return SchedulerSettings(max_num_batched_tokens=max_num_batched_tokens,
                             max_num_seqs=min(_PROBE_MAX_NUM_SEQS, max_num_batched_tokens))


def calibrate_server(options: ServerOptions, *, hardware: str, model: str, tp: int = 1,
                     plan: ProbePlan = ProbePlan(), max_num_batched_tokens: int = 2048,
                     max_model_len: int | None = None,
                     progress: Callable[[str], None] | None = None,
                     quantization: str | None = None,
                     kv_cache_dtype: str | None = None) -> CalibrationResult:
    """Calibrate the step-time model against a server: the library behind ``tuner calibrate``.

    A launched server gets :func:`probe_settings` and synchronous scheduling: under async
    scheduling vLLM schedules step k+1 while step k runs, so a request's SCHEDULED time
    (where its prefill time starts) would include the step in flight. It is stopped
    afterwards, also on an error. An attached server (``options.endpoint``) keeps its own
    settings, so its budget is unknown and the probes are not checked against one.

    Args:
        options: launch or attach options (:class:`~tuner.serve.server.ServerOptions`).
        hardware: hardware preset or YAML path the twin will run with (recorded in the file).
        model: model preset or config path (recorded in the file).
        tp: tensor-parallel size of the server.
        plan: the probes to run.
        max_num_batched_tokens: token budget of a launched server.
        max_model_len: the server's context limit (probes are checked against it).
        progress: called with one line per step (server ready, each probe).
        quantization, kv_cache_dtype: vLLM's ``--quantization``/``--kv-cache-dtype`` of the
            server, so the fit prices the kernel formats it runs.

    Returns:
        The probes, the fit and the :class:`~tuner.perf.fit.calibration_file.Calibration` to save
        (``tuner.perf.fit.calibration_file.save_calibration``).
    """
    if options.launches:
        options = options.replace(async_scheduling=False)
    with VllmServer(options) as server:
        server.start(probe_settings(max_num_batched_tokens))
        if progress is not None:
            progress(f"server ready ({server.startup_s:.1f} s, vLLM {server.vllm_version})")
        return calibrate(server, hardware=hardware, model=model, tp=tp, plan=plan,
                         max_num_batched_tokens=max_num_batched_tokens if options.launches
                         else None,
                         max_model_len=max_model_len, progress=progress,
                         quantization=quantization, kv_cache_dtype=kv_cache_dtype)


def twin_options_for(vllm_python: str,
                     prefill_interval_mode: PrefillIntervalMode | None = None) -> SimOptions:
    """The twin's options for a parity run against the vLLM installed for ``vllm_python``.

    ``prefill_interval_mode`` overrides the version rule
    (:func:`tuner.vllm_compat.prefill_interval_mode`); the priority self-preemption rule
    follows the version (:func:`tuner.vllm_compat.self_preemption_continues`); the
    version is read from the
    distribution metadata, without importing vLLM.
    """
    from tuner import vllm_compat

    version = vllm_compat.installed_version(vllm_python)
    if prefill_interval_mode is None:
        prefill_interval_mode = vllm_compat.prefill_interval_mode(version)
    return SimOptions(prefill_interval_mode=prefill_interval_mode,
                      self_preemption_continues=vllm_compat.self_preemption_continues(version))
