"""What the operator runs today: ``--set`` fixed settings and ``--baseline`` serve flags.

Why: a recommendation is only worth deploying if it beats the deployment it replaces.
vLLM's defaults are a fine baseline for a new service, but an operator who already runs
``--max-num-seqs 256 --no-enable-chunked-prefill`` must be compared against that, and
fields they will not change (``--set``) must stay fixed in the search.

Flags are read with the naming rule export writes them with
(:func:`tuner.vllm_compat.flag_name`: the field name with ``_`` -> ``-``, ``policy`` ->
``--scheduling-policy``, booleans as ``--x``/``--no-x``), so ``tuner export --format
flags`` output reads back as the same settings. Every ``SchedulerConfig`` field of the supported vLLM releases (0.32.0 and
0.33.0 have the same fields) is known: the ones the twin models are accepted, the others
are refused with a message naming the field and why, never "No such option".
"""

from __future__ import annotations

import json
import shlex
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Sequence

from tuner.errors import ConfigError
from tuner.sim.settings import SchedulerSettings
from tuner.vllm_compat import PLUGIN_ASYNC_CLS, PLUGIN_SYNC_CLS, flag_name

#: ``SchedulerConfig`` fields of vLLM 0.32.0 / 0.33.0 that the twin does not model, and why.
UNMODELLED_FIELDS: dict[str, str] = {
    "runner_type": "only the generate runner is replayed",
    "max_num_scheduled_tokens": "the twin schedules up to max_num_batched_tokens per step "
                                "(no separate scheduled-token cap; speculative decoding is "
                                "not modelled)",
    "max_num_active_seqs": "the twin admits up to max_num_seqs running requests (no separate "
                           "active-sequence cap)",
    "long_prefill_token_threshold_adaptive": "the adaptive prefill cap is not modelled",
    "max_num_queued_reqs": "the API server's 503 admission valve is outside the scheduler "
                           "the twin replays",
    "max_num_queued_tokens": "the API server's 503 admission valve is outside the scheduler "
                             "the twin replays",
    "is_multimodal_model": "multimodal inputs are not modelled",
    "disable_chunked_mm_input": "multimodal inputs are not modelled",
    "max_num_encoder_input_tokens": "set by vLLM itself (not a flag); encoders are not "
                                    "modelled",
    "encoder_cache_size": "set by vLLM itself (not a flag); encoders are not modelled",
    "scheduler_cls": "the twin replays vLLM's own scheduler (and tuner's plugin via the "
                     "cache_aware_admission_* fields)",
    "disable_hybrid_kv_cache_manager": "the hybrid KV-cache manager is not modelled",
    "stream_interval": "output streaming is not modelled (it does not change what the "
                       "scheduler decides, but the twin cannot check that for you)",
}

#: Deployment flags a prediction depends on, by ``vllm serve`` flag -> Target field.
TARGET_FLAGS: dict[str, str] = {
    "--tensor-parallel-size": "tp", "-tp": "tp",
    "--data-parallel-size": "dp", "-dp": "dp",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--max-model-len": "max_model_len",
    "--block-size": "block_size",
    "--num-gpu-blocks-override": "num_gpu_blocks",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--quantization": "quantization", "-q": "quantization",
}
#: Boolean deployment flags: ``--x`` / ``--no-x`` -> Target/profile field.
TARGET_BOOL_FLAGS: dict[str, str] = {"async-scheduling": "async_scheduling",
                                     "enable-prefix-caching": "enable_prefix_caching"}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def field_of(name: str) -> str:
    """A field name from ``field``, ``field-name``, ``--flag-name`` or ``scheduling_policy``."""
    key = name.strip().lstrip("-").replace("-", "_")
    return "policy" if key == "scheduling_policy" else key


def _modelled() -> dict[str, Any]:
    return typing.get_type_hints(SchedulerSettings)


def check_field(name: str, where: str) -> str:
    """``name`` as a modelled field; ConfigError naming it when it is not one."""
    key = field_of(name)
    if key in _modelled():
        return key
    if key in UNMODELLED_FIELDS:
        raise ConfigError(f"{where}: {key} ({flag_name(key)}) is a SchedulerConfig field of "
                          f"vLLM 0.32.0/0.33.0 that the twin does not model: "
                          f"{UNMODELLED_FIELDS[key]}; leave it out")
    known = ", ".join(f.name for f in fields(SchedulerSettings))
    raise ConfigError(f"{where}: {key!r} is not a SchedulerConfig field; settable: {known}")


def convert(key: str, raw: Any, where: str) -> Any:
    """``raw`` (a string or a YAML scalar) as field ``key``'s type, as vLLM parses it
    (integers may be written ``8k`` = 8000 or ``8K`` = 8192, like ``vllm serve``)."""
    typ = _modelled()[key]
    text = str(raw).strip()
    if typing.get_origin(typ) is typing.Literal:
        if text not in typing.get_args(typ):
            raise ConfigError(f"{where}: {key}={text!r}: must be one of "
                              f"{', '.join(map(str, typing.get_args(typ)))}")
        return text
    if typ is bool:
        if isinstance(raw, bool):
            return raw
        if text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise ConfigError(f"{where}: {key}={text!r}: expected true or false")
    if typ is int:
        return _human_int(key, text, where)
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{where}: {key}={text!r}: expected a number") from None


def _human_int(key: str, text: str, where: str) -> int:
    scale = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}
    mult = 1
    if text and text[-1] in scale:
        mult, text = scale[text[-1]], text[:-1]
    try:
        value = float(text.replace("_", "")) * mult
    except ValueError:
        value = float("nan")
    if not value.is_integer():
        raise ConfigError(f"{where}: {key}={text!r}: expected an integer")
    return int(value)


def parse_assignments(items: Sequence[str], where: str = "--set") -> dict[str, Any]:
    """``["max_num_seqs=256", ...]`` -> ``{"max_num_seqs": 256}`` (typed, modelled only)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = str(item).partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{where} {item!r}: expected FIELD=VALUE, e.g. max_num_seqs=256")
        name = check_field(key, f"{where} {item}")
        out[name] = convert(name, raw, f"{where} {item}")
    return out


@dataclass(slots=True)
class ServeFlags:
    """A ``vllm serve`` command line read back: what the tuner models and what it skipped."""

    model: str | None = None
    scheduler: dict[str, Any] = field(default_factory=dict)  # SchedulerSettings fields
    target: dict[str, Any] = field(default_factory=dict)  # TARGET_FLAGS fields
    ignored: list[str] = field(default_factory=list)  # flags with no bearing on the replay


def parse_serve_flags(text: str | Sequence[str]) -> ServeFlags:
    """Read ``[vllm serve] [MODEL] --flag value ...`` (a string is split like a shell).

    Raises:
        ConfigError: an unmodelled SchedulerConfig field, a bad value, a flag without value.
    """
    args = shlex.split(text, comments=True) if isinstance(text, str) else list(text)
    if args[:2] == ["vllm", "serve"]:
        args = args[2:]
    out = ServeFlags()
    if args and not args[0].startswith("-"):
        out.model = args.pop(0)
    scheduler_fields = set(_modelled()) | set(UNMODELLED_FIELDS)
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            raise ConfigError(f"--baseline: {arg!r} is not a flag (only MODEL may come "
                              "before the flags)")
        flag, eq, inline = arg.partition("=")
        value: str | None = inline if eq else None
        takes = i + 1 < len(args) and not args[i + 1].startswith("--")
        negated = flag.startswith("--no-")
        bare = flag[5:] if negated else flag.lstrip("-")
        key = field_of(bare)
        if bare in TARGET_BOOL_FLAGS:
            out.target[TARGET_BOOL_FLAGS[bare]] = not negated
            i += 1
            continue
        if flag in ("--scheduler-cls", "--additional-config"):
            if value is None:
                if not takes:
                    raise ConfigError(f"--baseline {flag}: needs a value")
                value, i = args[i + 1], i + 1
            _plugin_flag(flag, value, out)
            i += 1
            continue
        if key in scheduler_fields:
            name = check_field(key, f"--baseline {flag}")
            if _modelled()[name] is bool:
                out.scheduler[name] = not negated if value is None else convert(
                    name, value, f"--baseline {flag}")
                i += 1
                continue
            if value is None:
                if not takes:
                    raise ConfigError(f"--baseline {flag}: needs a value")
                value, i = args[i + 1], i + 1
            out.scheduler[name] = convert(name, value, f"--baseline {flag}")
        elif flag in TARGET_FLAGS:
            if value is None:
                if not takes:
                    raise ConfigError(f"--baseline {flag}: needs a value")
                value, i = args[i + 1], i + 1
            out.target[TARGET_FLAGS[flag]] = value
        else:
            if value is None and takes:
                value, i = args[i + 1], i + 1
            out.ignored.append(flag if value is None else f"{flag} {value}")
        i += 1
    return out


#: tuner's scheduler plugin classes (what export writes for cache-aware admission).
PLUGIN_CLASSES = (PLUGIN_SYNC_CLS, PLUGIN_ASYNC_CLS)


def _plugin_flag(flag: str, value: str, out: ServeFlags) -> None:
    """tuner's own plugin reads back (its admission values ride in --additional-config);
    any other scheduler class is refused: the twin replays vLLM's scheduler only."""
    if flag == "--scheduler-cls":
        if value not in PLUGIN_CLASSES:
            raise ConfigError(f"--baseline --scheduler-cls {value}: scheduler_cls "
                              f"(--scheduler-cls) is a SchedulerConfig field the twin models "
                              f"only as tuner's plugin ({', '.join(PLUGIN_CLASSES)}); "
                              f"{UNMODELLED_FIELDS['scheduler_cls']}")
        return
    try:
        extra = json.loads(value)
    except ValueError:
        raise ConfigError(f"--baseline --additional-config {value!r}: not JSON") from None
    if not isinstance(extra, dict):
        raise ConfigError(f"--baseline --additional-config {value!r}: not a JSON object")
    for key in ("cache_aware_admission_window", "cache_aware_admission_threshold"):
        if key in extra:
            out.scheduler[key] = convert(key, extra[key], f"--baseline --additional-config {key}")


def check_target_agrees(flags: ServeFlags, target: Any) -> list[str]:
    """Refuse a baseline command for another deployment than the tuned target; notes for
    what agrees or cannot be compared.

    Raises:
        ConfigError: a deployment flag whose value differs from the target's.
    """
    notes: list[str] = []
    for name, raw in flags.target.items():
        have = getattr(target, name, None)
        if name in ("async_scheduling", "enable_prefix_caching"):
            if name == "enable_prefix_caching" and raw is False:
                raise ConfigError("--baseline --no-enable-prefix-caching: the twin replays "
                                  "with prefix caching on (vLLM's default); tuning a "
                                  "deployment without it is not modelled")
            continue
        if have is None and name in ("max_model_len", "num_gpu_blocks", "block_size",
                                     "kv_cache_dtype", "quantization"):
            notes.append(f"--baseline sets {name}={raw}; pass the same as a target option "
                         "so the twin models it")
            continue
        want = type(have)(raw) if have is not None and not isinstance(have, str) else raw
        if have is not None and want != have:
            raise ConfigError(f"--baseline has {name}={raw} but the tuned target has "
                              f"{name}={have}; give the target the same value (the baseline "
                              "must run on the deployment being tuned)")
    return notes


def baseline_settings(defaults: SchedulerSettings, *, flags: ServeFlags | None = None,
                      profile: SchedulerSettings | None = None,
                      fixed: dict[str, Any] | None = None) -> SchedulerSettings:
    """vLLM's defaults, then the baseline's (a profile's or the serve flags'), then --set."""
    base = profile if profile is not None else defaults
    if flags is not None:
        base = base.replace(**flags.scheduler)
    if fixed:
        base = base.replace(**fixed)
    return base
