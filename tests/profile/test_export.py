"""Exporters: golden files for every format and version rule, and the vLLM check's skip.

Regenerate the golden files after an intended change with
``TUNER_UPDATE_GOLDEN=1 .venv/bin/pytest tests/profile`` and review the diff.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex

import pytest
import yaml

from tuner.errors import ConfigError, UnsupportedVllmVersion
from tuner.profile import (FORMATS, Profile, ProfileTarget, check_with_vllm, export_profile,
                           flag_name, parse_version)
from tuner.sim.settings import SchedulerSettings

GOLDEN = pathlib.Path(__file__).parent / "golden"


def make_profile(*, window: int = 16, interval: int = 4, async_scheduling: bool = True,
                 chunked: bool = True) -> Profile:
    settings = SchedulerSettings.vllm_defaults(288).replace(
        cache_aware_admission_window=window, cache_aware_admission_threshold=0.35,
        prefill_schedule_interval=interval, watermark=0.02, enable_chunked_prefill=chunked)
    return Profile(name="golden", scheduler=settings,
                   target=ProfileTarget(hardware="mi355x", model="llama-3.1-70b", tp=8, dp=1,
                                        num_gpus=8, block_size=16,
                                        async_scheduling=async_scheduling,
                                        max_model_len=131072, gpu_memory_utilization=0.92))


CASES = [(fmt, version, native) for fmt in FORMATS
         for version, native in (("0.33.0", False), ("0.34.0", True), ("0.32.0", False))]


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("TUNER_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with TUNER_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from its golden file"


@pytest.mark.parametrize("fmt, version, native", CASES)
def test_golden(fmt: str, version: str, native: bool) -> None:
    text = export_profile(make_profile(), fmt, vllm_version=version, native_admission=native)
    ext = {"flags": "sh", "plugin": "sh", "env": "sh", "yaml": "yaml", "json": "json",
           "python": "py"}[fmt]
    _check_golden(f"{fmt}-{version}{'-native' if native else ''}.{ext}", text)


def test_golden_window_zero_and_sync_scheduling() -> None:
    _check_golden("flags-0.33.0-window0.sh",
                  export_profile(make_profile(window=0, interval=1, chunked=False), "flags"))
    _check_golden("flags-0.33.0-sync.sh",
                  export_profile(make_profile(async_scheduling=False), "flags"))


def _serve_args(text: str) -> list[str]:
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    return shlex.split(body.replace("\\\n", " "))


def test_flags_use_vllm_names_and_the_plugin_before_pr_54625() -> None:
    text = export_profile(make_profile(), "flags", vllm_version="0.33.0")
    args = _serve_args(text)
    assert args[args.index("--scheduling-policy") + 1] == "fcfs"
    assert "--policy" not in args and "--enable-chunked-prefill" in args
    assert "--cache-aware-admission-window" not in args
    assert args[args.index("--scheduler-cls") + 1] == "tuner.vllm_plugin.CacheAwareAsyncScheduler"
    extra = json.loads(args[args.index("--additional-config") + 1])
    assert extra == {"cache_aware_admission_window": 16, "cache_aware_admission_threshold": 0.35}
    assert "PR #54625 is unmerged" in text
    # where the plugin comes from: the command that writes it for vLLM's environment
    assert "`tuner export PROFILE --format plugin -o DIR` writes it" in text
    sync = _serve_args(export_profile(make_profile(async_scheduling=False), "flags"))
    assert "tuner.vllm_plugin.CacheAwareScheduler" in sync and "--no-async-scheduling" in sync
    native = _serve_args(export_profile(make_profile(), "flags", vllm_version="0.34.0",
                                        native_admission=True))
    assert native[native.index("--cache-aware-admission-window") + 1] == "16"
    assert "--scheduler-cls" not in native
    off = _serve_args(export_profile(make_profile(chunked=False), "flags"))
    assert "--no-enable-chunked-prefill" in off


def test_yaml_config_keys_are_long_flag_names() -> None:
    text = export_profile(make_profile(), "yaml")
    data = yaml.safe_load(text)
    assert data["max-num-seqs"] == 1024 and data["scheduling-policy"] == "fcfs"
    assert data["scheduler-cls"] == "tuner.vllm_plugin.CacheAwareAsyncScheduler"
    assert json.loads(data["additional-config"])["cache_aware_admission_window"] == 16
    assert all(not k.startswith("-") for k in data)


def test_python_and_json_are_valid() -> None:
    code = export_profile(make_profile(), "python").replace(
        "from vllm.config import SchedulerConfig", "")
    scope: dict = {}
    exec(compile(code, "export.py", "exec"), scope)  # noqa: S102 - our own output
    assert scope["scheduler_kwargs"]["policy"] == "fcfs"
    assert scope["scheduler_kwargs"]["scheduler_cls"] == "tuner.vllm_plugin.CacheAwareAsyncScheduler"
    assert scope["additional_config"]["cache_aware_admission_threshold"] == 0.35
    data = json.loads(export_profile(make_profile(), "json"))
    assert data["scheduler_config"]["max_num_batched_tokens"] == 16384


def test_version_rules() -> None:
    old = export_profile(make_profile(), "flags", vllm_version="0.32.0")
    assert "applies --prefill-schedule-interval only to data-parallel" in old
    assert "applies --prefill-schedule-interval" not in export_profile(make_profile(), "flags")
    with pytest.raises(UnsupportedVllmVersion, match="no cache-aware admission fields"):
        export_profile(make_profile(), "flags", vllm_version="0.33.0", native_admission=True)
    with pytest.raises(UnsupportedVllmVersion, match=">= 0.30.0 only"):
        export_profile(make_profile(), "flags", vllm_version="0.28.1")
    with pytest.raises(UnsupportedVllmVersion, match="not of the form"):
        parse_version("latest")
    assert parse_version("0.33.0+cpu") == (0, 33, 0) and parse_version("0.34.0rc1") == (0, 34, 0)
    with pytest.raises(ConfigError, match="unknown export format"):
        export_profile(make_profile(), "toml")
    assert flag_name("policy") == "--scheduling-policy"


def test_check_with_vllm_skips_with_a_note_without_vllm() -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is importable here; tests/vllm runs the real check")
    result = check_with_vllm(make_profile())
    assert result.status == "skipped" and "not importable" in result.note


def test_flags_are_a_complete_paste_ready_serve_command() -> None:
    """Issue 17 item 6: `vllm serve MODEL` with every target setting, comments only above."""
    import dataclasses

    from tuner.tune.baseline import parse_serve_flags

    prof = make_profile()
    prof = dataclasses.replace(prof, target=dataclasses.replace(
        prof.target, quantization="fp8", kv_cache_dtype="fp8", dp=2, num_gpus=16))
    text = export_profile(prof, "flags")
    body = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert all("#" not in ln for ln in body)  # no comment where the shell would read it
    args = _serve_args(text)
    assert args[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct"]
    for flag, value in (("--tensor-parallel-size", "8"), ("--data-parallel-size", "2"),
                        ("--gpu-memory-utilization", "0.92"), ("--max-model-len", "131072"),
                        ("--block-size", "16"), ("--quantization", "fp8"),
                        ("--kv-cache-dtype", "fp8")):
        assert args[args.index(flag) + 1] == value, flag
    assert "--async-scheduling" in args and args.count("--max-num-seqs") == 1
    sync = _serve_args(export_profile(make_profile(async_scheduling=False), "flags"))
    assert sync.count("--no-async-scheduling") == 1 and "--async-scheduling" not in sync
    # read back with the rules --baseline uses: the same scheduler settings
    back = parse_serve_flags(args)
    assert back.model == "meta-llama/Llama-3.1-70B-Instruct"
    settings = prof.scheduler.to_dict()
    assert {k: settings[k] for k in back.scheduler} == back.scheduler
    assert back.target["tp"] == "8" and back.target["async_scheduling"] is True


def test_hub_repos_match_the_presets_sources() -> None:
    from tuner.profile.export import HUB_REPOS

    sources = (pathlib.Path(__file__).parents[2] / "tuner/perf/presets/models/SOURCES.md")
    rows = {}
    for line in sources.read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.split("|")[1:-1]]
        if len(cells) == 3 and cells[0] and not cells[0].startswith(("preset", "-")):
            rows[cells[0]] = cells[1].split(" ")[0].strip("`")
    assert rows == HUB_REPOS


#: How each format spells the synchronous pin (every format must have one: a missing
#: entry fails the test below).
SYNC_PIN = {"yaml": "async-scheduling: false", "python": "async_scheduling=False",
            "json": '"--no-async-scheduling"', "env": "--no-async-scheduling",
            "flags": "--no-async-scheduling", "plugin": "--no-async-scheduling"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_sync_profile_with_window_zero_pins_sync_in_every_format(fmt: str) -> None:
    """Issue 14 item 6: with window 0 the plan never set async_scheduling, so a profile
    predicted with --no-async-scheduling exported a config vLLM would run asynchronously."""
    pinned = SYNC_PIN[fmt]
    out = export_profile(make_profile(window=0, async_scheduling=False), fmt)
    assert pinned in out
    assert "async-scheduling: false" not in export_profile(make_profile(window=0), "yaml")


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_sync_plugin_class_is_refused_with_async_on(fmt: str) -> None:
    """A plain Scheduler subclass under the batch queue of depth 2 schedules each running
    decode only every other batch: export refuses it in one line."""
    sync_cls = "tuner.vllm_plugin.CacheAwareScheduler"
    with pytest.raises(ConfigError, match=r"plain Scheduler subclass: under async scheduling"):
        export_profile(make_profile(), fmt, scheduler_cls=sync_cls)
    with pytest.raises(ConfigError, match="plain Scheduler subclass"):
        export_profile(make_profile(async_scheduling=False), fmt, scheduler_cls=sync_cls,
                       async_scheduling=True)
    out = export_profile(make_profile(async_scheduling=False), fmt, scheduler_cls=sync_cls)
    assert sync_cls in out and SYNC_PIN[fmt] in out


def test_export_cli_refuses_the_sync_class_under_async(tmp_path: pathlib.Path) -> None:
    from click.testing import CliRunner

    from tuner.cli import cli
    from tuner.profile import save_profile

    path = save_profile(make_profile(), tmp_path / "p.yaml")
    res = CliRunner().invoke(cli, ["export", str(path), "--scheduler-cls",
                                   "tuner.vllm_plugin.CacheAwareScheduler"])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert res.output.startswith("Error: --scheduler-cls tuner.vllm_plugin.CacheAwareScheduler "
                                 "is a plain Scheduler subclass")
    res = CliRunner().invoke(cli, ["export", str(path), "--scheduler-cls",
                                   "tuner.vllm_plugin.CacheAwareScheduler",
                                   "--no-async-scheduling", "--format", "plugin"])
    assert res.exit_code == 0, res.output
    assert "WARNING: the profile's predictions come from --async-scheduling" in res.output


def test_readme_plugin_lines_match_what_export_emits() -> None:
    """The README's two plugin-form lines are what export writes for an async and a sync
    profile (issue 14 item 6)."""
    import re

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    para = readme[readme.index("On vLLM ≤ 0.33.0 the export uses the plugin form"):]
    para = para[:para.index("\n\n")].replace("\n", " ")
    shown = re.findall(r"`(--scheduler-cls [^`]+)`", para)
    assert len(shown) == 2, shown
    for snippet, mode in zip(shown, (True, False)):
        args = _serve_args(export_profile(make_profile(async_scheduling=mode), "plugin"))
        words = snippet.replace("'", "").split()
        cls = words[1]
        assert args[args.index("--scheduler-cls") + 1] == cls
        assert ("--no-async-scheduling" in words) == ("--no-async-scheduling" in args)
        if "--additional-config" in words:
            assert json.loads(args[args.index("--additional-config") + 1])[
                "cache_aware_admission_window"] == 16
