"""The ``vllm-core`` backend: replay through vLLM's own ``Scheduler``, in a vLLM Python.

tuner's environment stays free of vLLM: :meth:`VllmCoreBackend.run` starts
``tuner/vllm_core/driver.py`` with the Python that has vLLM installed
(``--vllm-python``, or ``$TUNER_VLLM_PYTHON``), hands it the job as a pickle in a temporary
folder (plain request data, settings, the KV-cache shape, the twin's step-time model and
load), reads progress from its stdout (JSON lines) and loads the ``ReplayResult`` it
writes. The driver builds vLLM's real ``Scheduler`` (with ``tuner.vllm_plugin`` for PR
#54625's window) over a fake KV cache of the twin's size and fakes only the model; see
docs/fidelity.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import pickle
import subprocess
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuner import vllm_compat
from tuner.errors import BackendError, ConfigError
from tuner.replay import Backend, ProgressCallback

if TYPE_CHECKING:
    from tuner.records import ReplayResult
    from tuner.sim.settings import SchedulerSettings, SimOptions
    from tuner.trace import TraceRequest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRIVER = pathlib.Path(__file__).with_name("driver.py")
#: the driver for jobs with DP ranks (one vLLM Scheduler per rank; it runs the others too)
DP_DRIVER = pathlib.Path(__file__).with_name("dp_driver.py")
#: the P/D pool engines' driver (vLLM's NIXL connector, scheduler side)
PD_DRIVER = pathlib.Path(__file__).with_name("disagg.py")
#: A ``config.json``-only Llama: vLLM's ``ModelConfig`` needs a model folder; the scheduler
#: never looks at the weights (there are none).
DEFAULT_MODEL_DIR = ROOT / "tests" / "data" / "tiny-llama"
PYTHON_ENV_VARS = vllm_compat.PYTHON_ENV_VARS["core"]
_REQUEST_FIELDS = ("request_id", "arrival_s", "input_len", "output_len", "block_hashes",
                   "output_block_hashes", "session_id", "priority")


def find_vllm_python(explicit: str | os.PathLike[str] | None = None) -> str:
    """The vLLM Python to drive (:func:`tuner.vllm_compat.find_vllm_python`, purpose
    ``core``: any vLLM build can run its ``Scheduler`` in process)."""
    return vllm_compat.find_vllm_python(explicit, "core")


def vllm_version(python: str) -> str:
    """The vLLM version installed for ``python`` (distribution metadata; vLLM not imported)."""
    return vllm_compat.installed_version(python)


class VllmCoreBackend(Backend):
    """Replays on vLLM's ``Scheduler`` through a driver process.

    Args:
        vllm_python: the Python of a vLLM environment (0.32.x or 0.33.x).
        model_dir: folder with the ``config.json`` vLLM's ``ModelConfig`` reads.
        timeout_s: kill the driver after this many seconds (None: no limit).
        scheduler_cls: vLLM's ``--scheduler-cls``, a dotted class name (e.g.
            ``vllm.v1.core.sched.scheduler.Scheduler``); None: the class vLLM resolves
            for the mode, or tuner's plugin class when the cache-aware window is on. A
            plain ``Scheduler`` under async scheduling still gets the batch queue of
            depth 2, as in vLLM.
    """

    name = "vllm-core"

    def __init__(self, vllm_python: str | os.PathLike[str] | None = None, *,
                 model_dir: str | os.PathLike[str] | None = None,
                 timeout_s: float | None = None, scheduler_cls: str | None = None) -> None:
        self.vllm_python = find_vllm_python(vllm_python)
        self.scheduler_cls = scheduler_cls
        self.model_dir = str(model_dir or DEFAULT_MODEL_DIR)
        if not os.path.isfile(os.path.join(self.model_dir, "config.json")):
            raise ConfigError(f"model_dir {self.model_dir}: no config.json there")
        self.timeout_s = timeout_s
        self._job: dict[str, Any] | None = None

    def prepare(self, requests: Sequence["TraceRequest"], settings: "SchedulerSettings",
                target: Any, load: Any, options: "SimOptions") -> None:
        if getattr(options, "prefill_interval_mode", "local") == "dp":
            raise ConfigError("vllm-core drives one engine; prefill_interval_mode='dp' "
                              "(data-parallel cadence) cannot be replayed through it")
        deployment = getattr(target, "target", None)
        if deployment is not None and deployment.replicas > 1:
            raise ConfigError("vllm-core replays one deployment (its DP ranks included); "
                              "--replicas > 1 behind a router runs on the sim backend")
        cache = target.cache
        step_time = target.step_time
        self._job = {
            "requests": [{f: _plain(getattr(r, f, None), f) for f in _REQUEST_FIELDS}
                         for r in requests],
            "settings": settings.to_dict(),
            "cache": dataclasses.asdict(cache),
            "step_time": step_time,
            "load": load,
            "record_steps": bool(getattr(options, "record_steps", True)),
            # the resolved mode: AsyncScheduler under a batch queue of depth 2, or not
            "async_scheduling": bool(getattr(options, "async_scheduling", False)),
            "num_gpus": int(getattr(target, "num_gpus", 1)),
            "model_dir": self.model_dir,
            "scheduler_cls": self.scheduler_cls,
            # data parallelism: one Scheduler per rank (tuner.vllm_core.dp_driver)
            "dp": int(getattr(deployment, "dp", 1)),
            "moe": bool(getattr(getattr(target, "model", None), "is_moe", False)),
            # speculative decoding: tuner.sim.spec_decode.SpecDecoding (plain Python) or None
            "speculative": getattr(options, "speculative", None),
            # the CPU tier: tuner.sim.kv_connector.OffloadSettings (plain Python) or None;
            # the driver runs vLLM's OffloadingConnector (tuner.vllm_core.offloading)
            "kv_offload": getattr(options, "kv_offload", None),
        }

    def run(self, progress: ProgressCallback | None = None) -> "ReplayResult":
        assert self._job is not None, "VllmCoreBackend.run() called before prepare()"
        return run_driver(self._job, self.vllm_python, progress=progress,
                          timeout_s=self.timeout_s)

    def close(self) -> None:
        """Nothing held between calls: ``run`` cleans up its driver and temporary folder."""

    @property
    def job(self) -> dict[str, Any]:
        """The prepared job (for :func:`run_driver` with several jobs at once)."""
        assert self._job is not None, "prepare() first"
        return self._job


def run_driver(job: Any, vllm_python: str, *, progress: ProgressCallback | None = None,
               timeout_s: float | None = None) -> Any:
    """Run the driver on one job (-> ``ReplayResult``) or a list (-> list), in a vLLM Python.

    Raises:
        BackendError: the driver failed or timed out; the message ends with its stderr tail.
    """
    with tempfile.TemporaryDirectory(prefix="tuner-vllm-core-") as tmp:
        job_path = os.path.join(tmp, "job.pickle")
        out_path = os.path.join(tmp, "result.pickle")
        err_path = os.path.join(tmp, "driver.log")
        with open(job_path, "wb") as f:
            pickle.dump(job, f, protocol=pickle.HIGHEST_PROTOCOL)
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_TARGET_DEVICE="cpu",
                   PYTHONPATH=str(ROOT), VLLM_LOGGING_LEVEL="WARNING")
        with open(err_path, "w") as err:
            jobs = job if isinstance(job, list) else [job]
            script = DP_DRIVER if any(int(j.get("dp", 1)) > 1 for j in jobs) else DRIVER
            script = PD_DRIVER if any("pd_role" in j for j in jobs) else script
            proc = subprocess.Popen([vllm_python, str(script), job_path, out_path],
                                    stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                                    cwd=str(ROOT))
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    if progress is not None and line.startswith("{"):
                        try:
                            progress(float(json.loads(line)["progress"]))
                        except (ValueError, KeyError):
                            pass
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise BackendError(f"vllm-core driver exceeded {timeout_s}s") from None
            except BaseException:
                proc.kill()
                proc.wait()
                raise
        with open(err_path) as f:
            tail = f.read()[-4000:]
        if rc != 0 or not os.path.exists(out_path):
            last = [ln for ln in tail.splitlines() if ln.strip()][-1:] or ["?"]
            raise BackendError(f"vllm-core driver ({vllm_python}) failed with exit code "
                               f"{rc}: {last[0]}\n--- driver stderr (tail) ---\n{tail}")
        with open(out_path, "rb") as f:
            result = pickle.load(f)
    if progress is not None:
        progress(1.0)
    return result


def _plain(value: Any, name: str) -> Any:
    """Trace fields as plain Python (tuples of ints, str ids), so the driver needs no tuner.trace."""
    if name in ("block_hashes", "output_block_hashes"):
        return tuple(int(h) for h in (value or ()))
    if name == "request_id":
        return str(value)
    if name == "priority":
        return int(value or 0)
    return value


__all__ = ["DEFAULT_MODEL_DIR", "VllmCoreBackend", "find_vllm_python", "run_driver",
           "vllm_version"]
