"""``retune.yaml``: the job's configuration (every key is documented in docs/retune.md).

Relative paths are resolved against the config file's folder, so a config and its state
can move together.
"""

from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass, field
from typing import Any

from tuner.durations import parse_duration
from tuner.errors import ConfigError
from tuner.jobs.decide import check_objectives
from tuner.jobs.kv_tier import check_kv_tier
from tuner.jobs.window import SourceSpec
from tuner.loaders import load_yaml

_TARGET_KEYS = ("hardware", "model", "tp", "dp", "block_size", "num_gpu_blocks",
                "gpu_memory_utilization", "max_model_len", "calibration", "weight_dtype",
                "kv_cache_dtype", "quantization", "step_time_source", "async_scheduling",
                "kv_offloading_size", "kv_offloading_backend", "kv_offloading_eviction_policy",
                "kv_offloading_blocks_per_chunk")


@dataclass
class RetuneConfig:
    """A parsed, validated ``retune.yaml``."""

    path: pathlib.Path
    sources: list[SourceSpec]
    state_dir: pathlib.Path
    profile: str
    profiles_dir: pathlib.Path
    window_s: float = 86400.0
    target: dict[str, Any] = field(default_factory=dict)
    space: str = "admission"
    trials: int = 60
    objectives: list[str] | None = None
    constraints: list[str] = field(default_factory=list)
    prefer: str = "throughput"
    holdout: float = 0.25
    stage1_fraction: float = 0.25
    decide_on: list[str] = field(default_factory=lambda: ["output_throughput_per_gpu"])
    margin: float = 0.02
    confidence: float = 0.9
    bootstrap_samples: int = 1000
    drift_threshold: float = 0.3
    min_requests: int = 50
    storage: str | None = None
    on_publish: str | None = None
    seed: int = 0
    salt: pathlib.Path | None = None
    hash_block_size: int | None = None
    on_error: str = "fail"
    #: the tune's robust check (``tune --robust``, ``--clock-variants``, ``--robust-share``)
    robust: str = "on"
    clock_variants: int = 4
    robust_share: float = 0.75
    #: ``metrics``: before each tune, fit the clock to the server's /metrics over the
    #: window (``tuner calibrate --from-metrics``) and tune and decide on that clock;
    #: ``none``: the target's own clock (its ``calibration`` file, if any)
    calibration: str = "none"
    metrics: list[pathlib.Path] = field(default_factory=list)  # 1 or 2 files (see docs)
    served_model_name: str | None = None  # the model_name label the metrics carry
    #: ``speculative:`` (docs/retune.md): the deployment's ``--speculative-config`` as a
    #: ``tuner.sim.spec_decode.SpecDecoding`` (None: off), and the k values searched
    speculative: Any = None
    spec_tokens: tuple[int, ...] | None = None
    #: the CPU KV tier searched (``tune --kv-offloading-sizes``, ``--kv-offloading-policies``,
    #: ``--host-memory-gb``; :mod:`tuner.jobs.kv_tier`): GiB per engine (0 = no tier), the
    #: eviction policies, host memory per node in GiB; None: the target's own tier only
    kv_offloading_sizes: tuple[float, ...] | None = None
    kv_offloading_policies: tuple[str, ...] | None = None
    host_memory_gb: float | None = None

    @property
    def window_dir(self) -> pathlib.Path:
        return self.state_dir / "window"

    @property
    def salt_path(self) -> pathlib.Path:
        return self.salt or self.state_dir / "salt"

    @property
    def storage_url(self) -> str:
        return self.storage or str(self.state_dir / "studies.optuna-journal")

    def make_target(self):  # type: ignore[no-untyped-def]
        from tuner.perf.target import Target

        return Target(**self.target)


_KNOWN = {"sources", "state_dir", "profile", "profiles_dir", "window", "target", "space",
          "trials", "objectives", "constraints", "prefer", "holdout", "stage1_fraction",
          "decide_on", "margin", "confidence", "bootstrap_samples", "drift_threshold",
          "min_requests", "storage", "on_publish", "seed", "salt", "hash_block_size",
          "on_error", "robust", "clock_variants", "robust_share", "calibration", "metrics",
          "served_model_name", "speculative", "kv_offloading_sizes", "kv_offloading_policies",
          "host_memory_gb"}


def load_config(path: str | pathlib.Path) -> RetuneConfig:
    """Read and validate ``path``.

    Raises:
        ConfigError: unreadable YAML, an unknown or missing key, or a bad value; the
            message names the file and the key.
    """
    p = pathlib.Path(path)
    loaded = load_yaml(p, "retune config", mapping=True)
    raw = loaded.data
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise ConfigError(f"{p}: unknown key(s) {', '.join(unknown)} (see docs/retune.md)")
    base = p.resolve().parent

    def need(key: str) -> Any:
        if raw.get(key) in (None, ""):
            raise ConfigError(f"{p}: missing key {key!r}")
        return raw[key]

    def rel(value: Any) -> pathlib.Path:
        q = pathlib.Path(str(value)).expanduser()
        return q if q.is_absolute() else base / q

    sources = []
    for i, item in enumerate(need("sources")):
        if isinstance(item, str):
            item = {"glob": item}
        if not isinstance(item, dict) or "glob" not in item:
            raise ConfigError(f"{p}: sources[{i}]: expected {{glob: ..., format: ...}}")
        g = str(item["glob"])
        sources.append(SourceSpec(glob=g if g.startswith(("/", "~")) else str(base / g),
                                  format=str(item.get("format", "auto"))))
    target = raw.get("target")
    if not isinstance(target, dict) or not target.get("hardware") or not target.get("model"):
        # Without one the job tuned Target()'s defaults (mi355x, llama-3.1-70b) and
        # published that profile for whatever the deployment really is, with exit 0.
        raise ConfigError(f"{loaded.where('target')}: required: the deployment the profile is "
                          "for, at least {hardware: ..., model: ...} (and tp, dp, "
                          "num_gpu_blocks... as it runs; see docs/retune.md)")
    target = dict(target)
    bad = sorted(set(target) - set(_TARGET_KEYS))
    if bad:
        raise ConfigError(f"{p}: target: unknown key(s) {', '.join(bad)}; use "
                          f"{', '.join(_TARGET_KEYS)}")
    mode = target.get("async_scheduling")
    if mode is not None and not isinstance(mode, bool):
        raise ConfigError(f"{loaded.where('target', 'async_scheduling')}: expected true or "
                          "false (vLLM's --async-scheduling/--no-async-scheduling; omit it "
                          f"for what vLLM resolves on the target), got {mode!r}")
    cfg = RetuneConfig(path=p, sources=sources, state_dir=rel(need("state_dir")),
                       profile=str(need("profile")), profiles_dir=rel(need("profiles_dir")),
                       target=target)
    if "window" in raw:
        cfg.window_s = parse_duration(raw["window"], loaded.where("window"))
    for key, kind in (("space", str), ("trials", int), ("prefer", str), ("holdout", float),
                      ("stage1_fraction", float), ("margin", float), ("confidence", float),
                      ("bootstrap_samples", int), ("drift_threshold", float),
                      ("min_requests", int), ("storage", str), ("on_publish", str),
                      ("seed", int), ("hash_block_size", int), ("on_error", str),
                      ("robust", str), ("clock_variants", int), ("robust_share", float),
                      ("calibration", str), ("served_model_name", str)):
        if raw.get(key) is not None:
            setattr(cfg, key, _typed(loaded.where(key), raw[key], kind))
    _check_ranges(cfg, loaded)
    for key in ("objectives", "constraints", "decide_on"):
        if raw.get(key) is not None:
            value = raw[key]
            setattr(cfg, key, [value] if isinstance(value, str) else [str(v) for v in value])
    if raw.get("salt") is not None:
        cfg.salt = rel(raw["salt"])
    if raw.get("metrics") is not None:
        files = raw["metrics"] if isinstance(raw["metrics"], list) else [raw["metrics"]]
        if not 1 <= len(files) <= 2 or not all(isinstance(f, str) and f for f in files):
            raise ConfigError(f"{loaded.where('metrics')}: one file (a /metrics dump or a "
                              "Prometheus range-query JSON export) or two (scrapes before and "
                              f"after), got {raw['metrics']!r}")
        cfg.metrics = [rel(f) for f in files]
    if cfg.calibration == "metrics" and not cfg.metrics:
        raise ConfigError(f"{loaded.where('calibration')}: calibration: metrics needs the "
                          "`metrics:` key (the files the server's /metrics are exported to)")
    if raw.get("speculative") is not None:
        cfg.speculative, cfg.spec_tokens = _speculative(raw["speculative"], loaded, rel)
    check_kv_tier(cfg, raw, loaded)
    try:
        check_objectives(cfg.decide_on)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None
    return cfg


def _speculative(raw: Any, loaded: Any, rel: Any) -> tuple[Any, tuple[int, ...] | None]:
    """``speculative: {config: {...} | JSON, acceptance: RATES|LENGTH|LOG, seed: N,
    tokens: [0, 1, 2]}``, checked as ``tune --speculative-config --spec-acceptance
    --spec-seed --spec-tokens`` check them (an acceptance naming a file reads a server
    log's ``SpecDecoding metrics`` lines or a /metrics scrape, the path relative to the
    config)."""
    from tuner.perf.spec_decode import default_acceptance
    from tuner.errors import TunerError
    from tuner.sim.spec_decode import from_vllm_config
    from tuner.trace.spec_acceptance import read_spec_acceptance
    from tuner.tune.spec_space import parse_spec_tokens

    where = loaded.where("speculative")
    if not isinstance(raw, dict) or raw.get("config") is None:
        raise ConfigError(f"{where}: expected a mapping with 'config' (vLLM's "
                          "--speculative-config object) and optional acceptance, seed, tokens")
    unknown = sorted(set(raw) - {"config", "acceptance", "seed", "tokens"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; use config, "
                          "acceptance, seed, tokens")
    acceptance = raw.get("acceptance")
    try:
        if acceptance is not None:
            acceptance = str(acceptance)
            if rel(acceptance).is_file():
                acceptance = read_spec_acceptance([rel(acceptance)]).acceptance_text()
        seed = _typed(loaded.where("speculative", "seed"), raw.get("seed", 0), int)
        spec = from_vllm_config(raw["config"], acceptance, seed=seed,
                                default_rates=default_acceptance, where=f"{where}.config")
        tokens = raw.get("tokens")
        if tokens is not None:
            if not isinstance(tokens, list):
                raise ConfigError("tokens: a list of num_speculative_tokens values, e.g. "
                                  "[0, 1, 2, 3]")
            tokens = parse_spec_tokens(",".join(str(t) for t in tokens))
    except TunerError as exc:
        text = str(exc)
        raise ConfigError(text if text.startswith(where) else f"{where}: {text}") from None
    return spec, tokens


def check_runnable(cfg: RetuneConfig) -> None:
    """Build the config's target (an unknown model, a bad tp...) the way every run will;
    ``tuner schedule`` calls this so a job is never scheduled to fail on every run. A run
    itself reports the same problem as a failed run (logged in the changelog)."""
    try:
        cfg.make_target()
    except (ConfigError, TypeError, ValueError) as exc:
        raise ConfigError(f"{cfg.path}: target: {exc}") from None


#: Bounds of every numeric key: (low, high, low inclusive, high inclusive). A value
#: outside (or NaN, which compares false to everything) is a config error, exit 2.
_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "trials": (1, 100_000, True, True),
    "holdout": (0, 1, False, False),
    "stage1_fraction": (0, 1, False, True),
    "margin": (-1, 10, True, True),  # negative: publish even a worse candidate (tests)
    "confidence": (0, 1, False, False),
    "bootstrap_samples": (10, 1_000_000, True, True),
    "drift_threshold": (0, 1e6, True, True),
    "min_requests": (1, 1e9, True, True),
    "seed": (0, 2**32 - 1, True, True),
    "hash_block_size": (1, 16 * 1024 * 1024, True, True),
    "window_s": (1, 10 * 366 * 86400, True, True),
    "clock_variants": (1, 64, True, True),
    "robust_share": (0, 1, False, True),
}

#: Keys that take one of a few words.
_CHOICES = {"on_error": ("fail", "skip"), "prefer": ("throughput", "interactivity", "balanced"),
            "robust": ("on", "off"), "calibration": ("none", "metrics")}


def _typed(where: str, value: Any, kind: type) -> Any:
    """``value`` as ``kind``; a bool, a fraction for an int, or text for a number refused."""
    if kind is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{where}: expected text, got {value!r}")
        return str(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected {'an integer' if kind is int else 'a number'}, "
                          f"got {value!r}")
    if kind is int:
        if isinstance(value, float) and not (math.isfinite(value) and value == int(value)):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return int(value)
    return float(value)


def _check_ranges(cfg: RetuneConfig, loaded: Any) -> None:
    for key, (lo, hi, lo_in, hi_in) in _RANGES.items():
        value = getattr(cfg, key)
        if value is None:
            continue
        ok = (lo <= value if lo_in else lo < value) and (value <= hi if hi_in else value < hi)
        if not ok:
            name = "window" if key == "window_s" else key
            lo_b, hi_b = "[" if lo_in else "(", "]" if hi_in else ")"
            raise ConfigError(f"{loaded.where(name)}: must be in {lo_b}{lo:g}, {hi:g}{hi_b}, "
                              f"got {value!r}")
    for key, words in _CHOICES.items():
        if getattr(cfg, key) not in words:
            raise ConfigError(f"{loaded.where(key)}: must be {' or '.join(words)}, got "
                              f"{getattr(cfg, key)!r}")
