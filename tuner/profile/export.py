"""Exporters: a profile -> ready-to-use vLLM configuration text.

Formats (``export_profile(profile, fmt, vllm_version=...)``):

* ``flags``  -- ``vllm serve`` arguments, one per line with ``\\`` continuations. Names are
  the field names with ``_`` -> ``-`` except ``policy`` -> ``--scheduling-policy``;
  booleans use vLLM's ``BooleanOptionalAction`` spelling (``--x`` / ``--no-x``).
* ``yaml``   -- a config file for ``vllm serve --config FILE`` (keys are the long flag
  names without the leading dashes, e.g. ``max-num-seqs: 256``).
* ``json``   -- one JSON object with the flag list, the config-file mapping, the
  ``SchedulerConfig`` keyword arguments and the notes (for scripts).
* ``python`` -- ``SchedulerConfig(...)`` keyword arguments as Python source.
* ``env``    -- a shell snippet defining a bash array ``VLLM_SCHEDULER_ARGS`` (and, for the
  plugin, the plugin's ``TUNER_CACHE_AWARE_ADMISSION_*`` variables).
* ``plugin`` -- the scheduler-plugin form as ``vllm serve`` arguments, whatever the version.

Version rules (``--vllm-version``; ``docs/profiles.md``):

* ``cache_aware_admission_*`` (PR #54625) exist in *no* release up to 0.33.0. For those
  versions, a profile with a non-zero window exports the plugin form:
  ``--scheduler-cls tuner.vllm_plugin.CacheAwareAsyncScheduler`` (or
  ``CacheAwareScheduler`` with ``--no-async-scheduling`` when the target runs synchronous
  scheduling) and the two values in ``--additional-config``. A version after 0.33.0 is
  treated as having the native flags only when the caller says so (``native_admission``,
  CLI ``--native-admission``), because no release is known to have merged the PR.
* ``prefill_schedule_interval`` exists from 0.29 on but throttles a single engine only
  from 0.33.0; for older versions the value is exported with a warning comment.
* Versions below 0.30.0 are refused (``UnsupportedVllmVersion``): tuner has not checked
  their flags.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from tuner.errors import ConfigError, UnsupportedVllmVersion
from tuner.profile.model import Profile
from tuner.sim.settings import SchedulerSettings

ExportFormat = Literal["flags", "yaml", "json", "python", "env", "plugin"]
FORMATS: tuple[str, ...] = ("flags", "yaml", "json", "python", "env", "plugin")

#: The newest release tuner's twin mirrors and whose flags have been checked.
CHECKED_VLLM_VERSION = "0.33.0"
_OLDEST_SUPPORTED = (0, 30, 0)
_SINGLE_ENGINE_INTERVAL = (0, 33, 0)  # prefill_schedule_interval throttles non-DP from here
_LAST_WITHOUT_ADMISSION = (0, 33, 0)  # PR #54625 is in no release up to and including this

PLUGIN_MODULE = "tuner.vllm_plugin"
PLUGIN_SYNC_CLS = f"{PLUGIN_MODULE}.CacheAwareScheduler"
PLUGIN_ASYNC_CLS = f"{PLUGIN_MODULE}.CacheAwareAsyncScheduler"
_ADMISSION_FIELDS = ("cache_aware_admission_window", "cache_aware_admission_threshold")


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.33.0"`` -> ``(0, 33, 0)``; a local/dev suffix (``0.33.0+cpu``, ``0.34.0rc1``) is
    cut off. Raises ``UnsupportedVllmVersion`` for anything else."""
    core = str(text).strip().lstrip("v").split("+", 1)[0]
    digits = []
    for part in core.split(".")[:3]:
        match = re.match(r"\d+", part)
        if match is None:
            raise UnsupportedVllmVersion(f"vLLM version {text!r} is not of the form X.Y.Z")
        digits.append(int(match.group()))
    if len(digits) < 2:
        raise UnsupportedVllmVersion(f"vLLM version {text!r} is not of the form X.Y.Z")
    while len(digits) < 3:
        digits.append(0)
    return digits[0], digits[1], digits[2]


def flag_name(fieldname: str) -> str:
    """The ``vllm serve`` flag of a ``SchedulerConfig`` field."""
    if fieldname == "policy":
        return "--scheduling-policy"
    return "--" + fieldname.replace("_", "-")


@dataclass(slots=True)
class ExportPlan:
    """What to emit for one profile and vLLM version, independent of the output format."""

    vllm_version: str
    #: (field, value) pairs emitted as native SchedulerConfig fields / flags, in field order.
    native: list[tuple[str, Any]] = field(default_factory=list)
    scheduler_cls: str | None = None  # set when the plugin carries cache-aware admission
    async_scheduling: bool | None = None  # False -> emit --no-async-scheduling
    additional_config: dict[str, Any] | None = None  # the plugin's window/threshold
    notes: list[str] = field(default_factory=list)  # comment lines (what and why)
    #: engine (not scheduler) flags the twin's clock assumed: --quantization, --kv-cache-dtype
    engine: list[tuple[str, str]] = field(default_factory=list)

    def serve_args(self) -> list[str]:
        """``vllm serve`` arguments as a list (no shell quoting)."""
        args: list[str] = []
        for name, value in self.native:
            flag = flag_name(name)
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + flag[2:])
            else:
                args += [flag, _scalar(value)]
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


def _scalar(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def plan_export(profile: Profile, *, vllm_version: str = CHECKED_VLLM_VERSION,
                native_admission: bool = False, force_plugin: bool = False,
                async_scheduling: bool | None = None) -> ExportPlan:
    """Decide which fields become native flags and whether the plugin carries admission.

    Raises:
        UnsupportedVllmVersion: the version is older than 0.30.0, or ``native_admission``
            is asked for a release that has no cache-aware admission fields.
    """
    version = parse_version(vllm_version)
    if version < _OLDEST_SUPPORTED:
        raise UnsupportedVllmVersion(
            f"vLLM {vllm_version}: tuner exports for vLLM >= 0.30.0 only (older releases' "
            "scheduler flags were not checked)")
    if native_admission and version <= _LAST_WITHOUT_ADMISSION:
        raise UnsupportedVllmVersion(
            f"vLLM {vllm_version} has no cache-aware admission fields (PR #54625 is in no "
            "release up to 0.33.0); drop --native-admission to export the scheduler-plugin form")
    settings = profile.scheduler
    use_async = profile.target.async_scheduling if async_scheduling is None else async_scheduling
    plan = ExportPlan(vllm_version=vllm_version)
    t = profile.target
    if t.quantization not in (None, "none"):
        plan.engine.append(("quantization", str(t.quantization)))
    if t.kv_cache_dtype not in (None, "auto"):
        plan.engine.append(("kv_cache_dtype", str(t.kv_cache_dtype)))
    window = settings.cache_aware_admission_window
    plugin = force_plugin or (not native_admission and window > 0)
    for f in fields(SchedulerSettings):
        value = getattr(settings, f.name)
        if f.name in _ADMISSION_FIELDS:
            if native_admission and not force_plugin:
                plan.native.append((f.name, value))
            continue
        plan.native.append((f.name, value))
    if plugin:
        plan.scheduler_cls = PLUGIN_ASYNC_CLS if use_async else PLUGIN_SYNC_CLS
        plan.async_scheduling = None if use_async else False
        plan.additional_config = {n: getattr(settings, n) for n in _ADMISSION_FIELDS}
        why = ("requested with --format plugin" if force_plugin and (
            native_admission or version > _LAST_WITHOUT_ADMISSION)
               else f"vLLM {vllm_version} has no --cache-aware-admission-* flags "
                    "(PR #54625 is unmerged)")
        plan.notes.append(f"cache-aware admission runs in tuner's scheduler plugin "
                          f"{plan.scheduler_cls} ({why}); install vllm-sched-tuner in vLLM's "
                          "environment")
    elif not native_admission:
        plan.notes.append("cache-aware admission is off (window 0): stock vLLM scheduler, "
                          "no plugin needed")
    if version < _SINGLE_ENGINE_INTERVAL and settings.prefill_schedule_interval > 1:
        plan.notes.append(
            f"WARNING: vLLM {vllm_version} applies --prefill-schedule-interval only to "
            "data-parallel deployments; a single engine ignores it (fixed in 0.33.0)")
    if version != parse_version(CHECKED_VLLM_VERSION):
        plan.notes.append(f"flags checked against vLLM {CHECKED_VLLM_VERSION}; "
                          f"{vllm_version} was not checked flag by flag")
    return plan


def _header(profile: Profile, plan: ExportPlan) -> list[str]:
    t = profile.target
    lines = [f"tuner profile {profile.name!r} for vLLM {plan.vllm_version} "
             f"({t.hardware}, {t.model}, tp={t.tp}, dp={t.dp})"]
    return lines + plan.notes


def export_profile(profile: Profile, fmt: str, *, vllm_version: str = CHECKED_VLLM_VERSION,
                   native_admission: bool = False, async_scheduling: bool | None = None) -> str:
    """Render ``profile`` for ``vllm_version`` in format ``fmt`` (see the module docstring).

    Raises:
        ConfigError: unknown format.
        UnsupportedVllmVersion: see :func:`plan_export`.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    plan = plan_export(profile, vllm_version=vllm_version, native_admission=native_admission,
                       force_plugin=fmt == "plugin", async_scheduling=async_scheduling)
    header = _header(profile, plan)
    render = {"flags": _flags, "plugin": _flags, "yaml": _yaml, "json": _json,
              "python": _python, "env": _env}[fmt]
    return render(profile, plan, header)


def _flags(profile: Profile, plan: ExportPlan, header: list[str]) -> str:
    args = plan.serve_args()
    lines: list[str] = []
    i = 0
    while i < len(args):  # pair each flag with its value (booleans stand alone)
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            lines.append(f"{args[i]} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            lines.append(args[i])
            i += 1
    body = " \\\n".join(lines)
    return "".join(f"# {h}\n" for h in header) + body + "\n"


def _yaml(profile: Profile, plan: ExportPlan, header: list[str]) -> str:
    import yaml

    text = yaml.safe_dump(plan.config_mapping(), sort_keys=False, default_flow_style=False,
                          width=1000)
    return ("".join(f"# {h}\n" for h in header)
            + "# use: vllm serve MODEL --config THIS_FILE\n" + text)


def _json(profile: Profile, plan: ExportPlan, header: list[str]) -> str:
    data = {
        "profile": profile.name,
        "vllm_version": plan.vllm_version,
        "notes": header[1:],
        "serve_args": plan.serve_args(),
        "config": plan.config_mapping(),
        "scheduler_config": plan.scheduler_kwargs(),
        "additional_config": plan.additional_config,
    }
    return json.dumps(data, indent=2) + "\n"


def _python(profile: Profile, plan: ExportPlan, header: list[str]) -> str:
    lines = [f"# {h}" for h in header]
    lines.append("from vllm.config import SchedulerConfig")
    lines.append("")
    lines.append("scheduler_kwargs = dict(")
    for key, value in plan.scheduler_kwargs().items():
        lines.append(f"    {key}={value!r},")
    lines.append(")")
    if plan.additional_config is not None:
        lines.append("# The plugin reads these from VllmConfig.additional_config "
                     "(EngineArgs(additional_config=...)):")
        lines.append(f"additional_config = {plan.additional_config!r}")
    lines.append("# max_model_len and is_encoder_decoder come from your model config:")
    lines.append("# scheduler_config = SchedulerConfig(max_model_len=..., is_encoder_decoder=False,"
                 " **scheduler_kwargs)")
    return "\n".join(lines) + "\n"


def _env(profile: Profile, plan: ExportPlan, header: list[str]) -> str:
    lines = [f"# {h}" for h in header]
    lines.append('# use: source THIS_FILE && vllm serve MODEL "${VLLM_SCHEDULER_ARGS[@]}"')
    args = " ".join(shlex.quote(a) for a in plan.serve_args())
    lines.append(f"VLLM_SCHEDULER_ARGS=({args})")
    if plan.additional_config is not None:
        lines.append("# the plugin also reads its values from these variables when "
                     "--additional-config lacks them:")
        for key, value in plan.additional_config.items():
            lines.append(f"export TUNER_{key.upper()}={shlex.quote(_scalar(value))}")
    return "\n".join(lines) + "\n"
