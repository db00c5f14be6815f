"""Exporters: a profile -> ready-to-use vLLM configuration text.

Formats (``export_profile(profile, fmt, vllm_version=...)``):

* ``flags``  -- a complete, paste-ready ``vllm serve MODEL ...`` command, one argument per
  line with ``\\`` continuations: the deployment the prediction depended on
  (``--tensor-parallel-size``, ``--data-parallel-size``, ``--gpu-memory-utilization``,
  ``--max-model-len``, ``--block-size``, ``--num-gpu-blocks-override``,
  ``--quantization`` / ``--kv-cache-dtype`` when the profile has them, and
  ``--async-scheduling`` / ``--no-async-scheduling``), then the scheduler flags. Names are
  the field names with ``_`` -> ``-`` except ``policy`` -> ``--scheduling-policy``;
  booleans use vLLM's ``BooleanOptionalAction`` spelling (``--x`` / ``--no-x``). Notes are
  ``#`` lines above the command, where the shell ignores them.
* ``yaml``   -- a config file for ``vllm serve --config FILE`` (keys are the long flag
  names without the leading dashes, e.g. ``max-num-seqs: 256``).
* ``json``   -- one JSON object with the flag list, the config-file mapping, the
  ``SchedulerConfig`` keyword arguments and the notes (for scripts).
* ``python`` -- ``SchedulerConfig(...)`` keyword arguments as Python source.
* ``env``    -- a shell snippet defining a bash array ``VLLM_SCHEDULER_ARGS`` (and, for the
  plugin, the plugin's ``TUNER_CACHE_AWARE_ADMISSION_*`` variables).
* ``plugin`` -- the scheduler-plugin form as ``vllm serve`` arguments, whatever the version.
* ``router`` -- a fleet profile's router configuration alone (:mod:`tuner.profile.
  fleet_export`: the production-stack ``vllm-router`` command, an llm-d
  ``EndpointPickerConfig`` or Dynamo's ``dynamo.frontend`` command).

Multi-engine profiles (``--data-parallel-size`` > 1, replicas behind a router, or
``--enable-expert-parallel``; :mod:`tuner.profile.fleet_export`): ``flags`` starts one
``vllm serve`` per replica (on one node: its own ``CUDA_VISIBLE_DEVICES`` and port) and
then the router; ``yaml``, ``python``, ``env`` and ``json`` carry the per-engine parallel
layout (``tensor-parallel-size``, ``data-parallel-size``, ``enable-expert-parallel``)
beside the scheduler fields, and ``json`` the router's configuration. A profile of one
engine exports exactly as before.

Version rules (``--vllm-version``; ``docs/vllm-versions.md``, decided in
:mod:`tuner.vllm_compat`):

* ``cache_aware_admission_*`` (PR #54625) exist in *no* release up to 0.33.0. For those
  versions, a profile with a non-zero window exports the plugin form:
  ``--scheduler-cls tuner.vllm_plugin.CacheAwareAsyncScheduler`` (or
  ``CacheAwareScheduler`` with ``--no-async-scheduling`` when the target runs synchronous
  scheduling) and the two values in ``--additional-config``. The synchronous class is a
  plain ``Scheduler`` subclass: asked for with async scheduling on (``scheduler_cls``,
  CLI ``--scheduler-cls``), the export is refused (``vllm_compat.check_plugin_class``). A version after 0.33.0 is
  treated as having the native flags only when the caller says so (``native_admission``,
  CLI ``--native-admission``), because no release is known to have merged the PR.
* ``prefill_schedule_interval`` exists from 0.29 on but throttles a single engine only
  from 0.33.0; for older versions the value is exported with a warning comment.
* Versions below 0.30.0 are refused (``UnsupportedVllmVersion``): tuner has not checked
  their flags.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Literal

from tuner import vllm_compat
from tuner.errors import ConfigError
from tuner.perf.models import PRESET_HUB_IDS
from tuner.profile.pd_profile import is_pd_profile, pd_flags_text, pd_proxy_text
from tuner.profile.fleet_export import (BASE_PORT, RouterExport, backend_urls, engine_args,
                                        one_node, replica_prefixes, router_export)
from tuner.profile.model import Profile

ExportFormat = Literal["flags", "yaml", "json", "python", "env", "plugin"]
FORMATS: tuple[str, ...] = ("flags", "yaml", "json", "python", "env", "plugin")
#: Every format ``export_profile`` renders: the vLLM ones and a fleet's router config.
EXPORT_FORMATS: tuple[str, ...] = FORMATS + ("router",)

#: The newest release tuner's twin mirrors and whose flags have been checked.
CHECKED_VLLM_VERSION = vllm_compat.CHECKED_VERSION
PLUGIN_MODULE = vllm_compat.PLUGIN_MODULE
PLUGIN_SYNC_CLS = vllm_compat.PLUGIN_SYNC_CLS
PLUGIN_ASYNC_CLS = vllm_compat.PLUGIN_ASYNC_CLS
#: What to emit for one profile and version; the rules live in :mod:`tuner.vllm_compat`.
ExportPlan = vllm_compat.SchedulerArgsPlan
parse_version = vllm_compat.parse_version
flag_name = vllm_compat.flag_name

#: Hub repositories of the bundled model presets (tuner/perf/presets/models/SOURCES.md;
#: tests/profile/test_export.py checks the two agree).
HUB_REPOS = {preset: ids[0] for preset, ids in PRESET_HUB_IDS.items()}


def serve_model(model: str) -> str:
    """What ``vllm serve`` takes for a profile's model: the Hub repository of a preset, the
    folder of a ``config.json`` path, else the name as given."""
    if model in HUB_REPOS:
        return HUB_REPOS[model]
    if model.endswith("config.json"):
        return model[: -len("config.json")].rstrip("/") or "."
    return model


def plan_export(profile: Profile, *, vllm_version: str = CHECKED_VLLM_VERSION,
                native_admission: bool = False, force_plugin: bool = False,
                async_scheduling: bool | None = None,
                scheduler_cls: str | None = None) -> ExportPlan:
    """Decide which fields become native flags and whether the plugin carries admission
    (:func:`tuner.vllm_compat.plan_scheduler_args` for the profile's settings and target).
    ``scheduler_cls`` picks tuner's plugin class (default: the class of the mode).

    Raises:
        UnsupportedVllmVersion: the version is older than 0.30.0, or ``native_admission``
            is asked for a release that has no cache-aware admission fields.
        ConfigError: ``scheduler_cls`` is the synchronous plugin class (a plain
            ``Scheduler`` subclass) with async scheduling on.
    """
    use_async = profile.target.async_scheduling if async_scheduling is None else async_scheduling
    plan = vllm_compat.plan_scheduler_args(
        profile.scheduler, vllm_version, native_admission=native_admission,
        force_plugin=force_plugin, async_scheduling=use_async,
        # a sync profile was predicted synchronous: every format pins it, window 0 too
        pin_sync=True, scheduler_cls=scheduler_cls)
    if use_async != profile.target.async_scheduling:
        plan.notes.append(
            f"WARNING: the profile's predictions come from "
            f"{vllm_compat.async_scheduling_flag(profile.target.async_scheduling)}; this "
            f"export deploys {vllm_compat.async_scheduling_flag(use_async)} (re-tune in that "
            "mode to predict it)")
    t = profile.target  # the dtypes the twin priced are part of the deployment
    if t.quantization not in (None, "none"):
        plan.engine.append(("quantization", str(t.quantization)))
    if t.kv_cache_dtype not in (None, "auto"):
        plan.engine.append(("kv_cache_dtype", str(t.kv_cache_dtype)))
    plan.engine.extend(vllm_compat.kv_offloading_args(
        t.kv_offloading_size, t.kv_offloading_backend, t.kv_offloading_eviction_policy,
        t.kv_offloading_blocks_per_chunk))
    return plan


def _scalar(value: Any) -> str:
    return vllm_compat.flag_value(value)


def _header(profile: Profile, plan: ExportPlan) -> list[str]:
    t = profile.target
    layout = f"tp={t.tp}, dp={t.dp}"
    if t.is_multi_engine:
        layout += (f", replicas={t.replicas}" + (", expert parallel" if t.enable_expert_parallel
                                                 else "")
                   + (f", router={profile.router['policy']}" if profile.router else "")
                   + f"; {t.num_gpus} GPU")
    lines = [f"tuner profile {profile.name!r} for vLLM {plan.vllm_version} "
             f"({t.hardware}, {t.model}, {layout})"]
    if is_pd_profile(profile):  # every format but flags/router shows one pool instance
        lines.append("disaggregated prefill/decode: the settings of every pool instance; "
                     "the servers with their --kv-transfer-config: tuner export PROFILE "
                     "--format flags")
    return lines + plan.notes


def export_profile(profile: Profile, fmt: str, *, vllm_version: str = CHECKED_VLLM_VERSION,
                   native_admission: bool = False, async_scheduling: bool | None = None,
                   scheduler_cls: str | None = None) -> str:
    """Render ``profile`` for ``vllm_version`` in format ``fmt`` (see the module docstring).

    Raises:
        ConfigError: unknown format.
        UnsupportedVllmVersion: see :func:`plan_export`.
    """
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; use one of "
                          f"{', '.join(EXPORT_FORMATS)}")
    if fmt == "router" and not is_pd_profile(profile):
        return _router(profile)
    plan = plan_export(profile, vllm_version=vllm_version, native_admission=native_admission,
                       force_plugin=fmt == "plugin", async_scheduling=async_scheduling,
                       scheduler_cls=scheduler_cls)
    header = _header(profile, plan)
    use_async = (profile.target.async_scheduling if async_scheduling is None
                 else async_scheduling)
    if is_pd_profile(profile) and fmt in ("flags", "router"):  # tuner.profile.pd_profile
        args = serve_command(profile, plan, use_async=use_async)
        return (pd_flags_text(profile, args, header) if fmt == "flags"
                else pd_proxy_text(profile, args))
    if fmt == "flags":
        return _command(profile, plan, header, use_async=use_async)
    render = {"plugin": _flags, "yaml": _yaml, "json": _json,
              "python": _python, "env": _env}[fmt]
    return render(profile, plan, header)


def flag_lines(args: list[str]) -> list[str]:
    """``vllm serve`` arguments one flag per line: each flag with its shell-quoted value,
    a boolean flag (next item is another ``--flag``) alone.

    Why shared: the flags export, the ``vllm serve`` command and the plugin bundle's
    README print the same arguments and must pair them the same way.
    """
    lines: list[str] = []
    i = 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            lines.append(f"{args[i]} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            lines.append(args[i])
            i += 1
    return lines


def _flags(profile: Profile, plan: ExportPlan, header: list[str]) -> str:
    args = plan.serve_args() + speculative_args(profile)  # the drafts the replay assumed
    if profile.target.api_server_count:  # the API server processes the prediction priced
        args = args + ["--api-server-count", str(profile.target.api_server_count)]
    if profile.target.is_multi_engine:  # each engine also needs its parallel layout
        args = engine_args(profile) + args
        if profile.target.replicas > 1:
            header = header + [f"the arguments of each of the {profile.target.replicas} "
                               "replicas; the router: tuner export PROFILE --format router"]
    body = " \\\n".join(flag_lines(args))
    return "".join(f"# {h}\n" for h in header) + body + "\n"


def target_args(profile: Profile) -> list[str]:
    """The deployment flags the prediction depended on (module docstring, ``flags``)."""
    t = profile.target
    args = engine_args(profile)
    if t.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", _scalar(t.gpu_memory_utilization)]
    if t.max_model_len is not None:
        args += ["--max-model-len", str(t.max_model_len)]
    if t.block_size is not None:
        args += ["--block-size", str(t.block_size)]
    if t.num_gpu_blocks is not None:
        args += ["--num-gpu-blocks-override", str(t.num_gpu_blocks)]
    if t.api_server_count:  # the API server processes the prediction priced
        args += ["--api-server-count", str(t.api_server_count)]
    args += speculative_args(profile)
    return args  # --quantization / --kv-cache-dtype ride in the plan (plan_export)


def speculative_args(profile: Profile) -> list[str]:
    """``--speculative-config JSON`` as the profile replayed it (none when off)."""
    spec = profile.target.speculative
    if not spec:
        return []
    return ["--speculative-config", json.dumps(spec["speculative_config"], sort_keys=True,
                                               separators=(",", ":"))]


def serve_command(profile: Profile, plan: ExportPlan, *, use_async: bool) -> list[str]:
    """``vllm serve MODEL`` + deployment flags + scheduler flags, as an argument list."""
    sched = [a for a in plan.serve_args() if a != "--no-async-scheduling"]
    return (["vllm", "serve", serve_model(profile.target.model)] + target_args(profile)
            + ["--async-scheduling" if use_async else "--no-async-scheduling"] + sched)


def _command(profile: Profile, plan: ExportPlan, header: list[str], *, use_async: bool) -> str:
    args = serve_command(profile, plan, use_async=use_async)
    lines = [" ".join(shlex.quote(a) for a in args[:3])]
    lines += [f"    {line}" for line in flag_lines(args[3:])]
    missing = [name for name, value in (("--max-model-len", profile.target.max_model_len),
                                        ("--gpu-memory-utilization",
                                         profile.target.gpu_memory_utilization))
               if value is None]
    if missing:
        header = header + [f"the profile does not record {' or '.join(missing)}: vLLM's "
                           "defaults apply; check they match what was tuned"]
    if profile.target.replicas > 1:
        return _fleet_command(profile, args, header)
    text = "".join(f"# {h}\n" for h in header) + " \\\n".join(lines) + "\n"
    export = router_export(profile, args[2])  # prefix-aware over one deployment's DP ranks
    return text if export is None else text + "\n".join(router_lines(export)) + "\n"


def _fleet_command(profile: Profile, args: list[str], header: list[str]) -> str:
    """One ``vllm serve`` per replica (background jobs on one node), then the router."""
    t = profile.target
    out = [f"# {h}" for h in header]
    urls = backend_urls(profile)
    if one_node(profile):
        out.append(f"# {t.replicas} replicas on one node, {t.tp * t.dp} GPU each; each "
                   "engine in the background on its own GPUs and port")
    else:
        out.append(f"# {t.replicas} replicas of {t.tp * t.dp} GPU: run this on each "
                   f"replica's host (the router below expects {urls[0]} ... {urls[-1]})")
    prefixes = replica_prefixes(profile) if one_node(profile) else [""]
    for i, prefix in enumerate(prefixes):
        head = " ".join(shlex.quote(a) for a in args[:3])
        body = [(prefix + " " if prefix else "") + head]
        port = BASE_PORT + i if one_node(profile) else BASE_PORT
        body += [f"    {line}" for line in flag_lines(args[3:] + ["--port", str(port)])]
        out.append(" \\\n".join(body) + (" &" if one_node(profile) else ""))
    export = router_export(profile, args[2])
    if export is not None:
        out += router_lines(export)
    return "\n".join(out) + "\n"


def router_lines(export: RouterExport) -> list[str]:
    """Shell lines that start the router, or write its config file (a here-document)."""
    lines = [f"# router: {export.implementation} ({export.source})"]
    lines += [f"# {n}" for n in export.notes]
    if export.kind == "command":
        head, rest = export.args[:3], export.args[3:]
        body = [" ".join(shlex.quote(a) for a in head)]
        body += [f"    {line}" for line in flag_lines(list(rest))]
        lines.append(" \\\n".join(body))
    else:
        lines.append(f"cat > {export.filename} <<'EOF'")
        lines += export.text.rstrip("\n").split("\n")
        lines.append("EOF")
    return lines


def _router(profile: Profile) -> str:
    """``--format router``: the fleet's router configuration alone."""
    export = router_export(profile, serve_model(profile.target.model))
    if export is None:
        raise ConfigError(f"--format router: profile {profile.name!r} has no router section "
                          "(one replica): there is no router to configure")
    if export.kind == "yaml":
        return ("".join(f"# {line}\n" for line in (
            [f"router: {export.implementation} ({export.source})"] + list(export.notes)))
            + export.text)
    return "\n".join(router_lines(export)) + "\n"


def _yaml(profile: Profile, plan: ExportPlan, header: list[str]) -> str:
    import yaml

    mapping = plan.config_mapping()
    if profile.target.speculative:
        mapping = {**mapping,
                   "speculative-config": dict(profile.target.speculative["speculative_config"])}
    if profile.target.api_server_count:  # the API server processes the prediction priced
        mapping = {**mapping, "api-server-count": profile.target.api_server_count}
    if profile.target.is_multi_engine:
        mapping = {**parallel_mapping(profile), **mapping}
        if profile.target.replicas > 1:
            header = header + [f"one engine of {profile.target.replicas} replicas; the router: "
                               "tuner export PROFILE --format router"]
    text = yaml.safe_dump(mapping, sort_keys=False, default_flow_style=False, width=1000)
    return ("".join(f"# {h}\n" for h in header)
            + "# use: vllm serve MODEL --config THIS_FILE\n" + text)


def parallel_mapping(profile: Profile) -> dict[str, Any]:
    """The per-engine layout as ``--config`` keys (long flag names)."""
    t = profile.target
    out: dict[str, Any] = {"tensor-parallel-size": t.tp}
    if t.dp > 1:
        out["data-parallel-size"] = t.dp
    if t.enable_expert_parallel:
        out["enable-expert-parallel"] = True
    return out


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
    t = profile.target
    if t.is_multi_engine:
        data["engine_args"] = engine_args(profile)
        data["replicas"] = t.replicas
        export = router_export(profile, serve_model(t.model))
        if export is not None:
            data["router"] = {"policy": dict(profile.router or {}), **export.to_dict(),
                              "backends": backend_urls(profile)}
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
    t = profile.target
    if t.is_multi_engine:
        lines.append("# the engine's parallel layout (ParallelConfig / EngineArgs fields):")
        lines.append("parallel_kwargs = dict(")
        lines.append(f"    tensor_parallel_size={t.tp},")
        lines.append(f"    data_parallel_size={t.dp},")
        lines.append(f"    enable_expert_parallel={t.enable_expert_parallel!r},")
        lines.append(")")
        if t.replicas > 1:
            lines.append(f"# {t.replicas} replicas behind the router: tuner export PROFILE "
                         "--format router")
    lines.append("# max_model_len and is_encoder_decoder come from your model config:")
    lines.append("# scheduler_config = SchedulerConfig(max_model_len=..., is_encoder_decoder=False,"
                 " **scheduler_kwargs)")
    return "\n".join(lines) + "\n"


def _env(profile: Profile, plan: ExportPlan, header: list[str]) -> str:
    lines = [f"# {h}" for h in header]
    lines.append('# use: source THIS_FILE && vllm serve MODEL "${VLLM_SCHEDULER_ARGS[@]}"')
    args = " ".join(shlex.quote(a) for a in plan.serve_args())
    lines.append(f"VLLM_SCHEDULER_ARGS=({args})")
    if profile.target.is_multi_engine:
        lines.append("# the engine's parallel layout: vllm serve MODEL \"${VLLM_ENGINE_ARGS[@]}\" "
                     '"${VLLM_SCHEDULER_ARGS[@]}"')
        lines.append(f"VLLM_ENGINE_ARGS=({' '.join(engine_args(profile))})")
    if plan.additional_config is not None:
        lines.append("# the plugin also reads its values from these variables when "
                     "--additional-config lacks them:")
        for key, value in plan.additional_config.items():
            lines.append(f"export TUNER_{key.upper()}={shlex.quote(_scalar(value))}")
    return "\n".join(lines) + "\n"
