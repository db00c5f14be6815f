"""The vLLM version table (tuner/vllm_compat.py) against docs/vllm-versions.md and its rules.

The environments themselves are checked in tests/vllm/test_vllm_compat_envs.py (the
fields and the single-engine cadence each installed release really has).
"""

from __future__ import annotations

import pathlib
import re

import pytest

from tuner import vllm_compat as vc
from tuner.errors import ConfigError, UnsupportedVllmVersion
from tuner.sim.settings import SchedulerSettings

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: (version, native_admission) -> (fields, single-engine interval, mode, plugin, checked)
TABLE = {
    ("0.32.0", False): (vc.BASE_FIELDS, False, "off", True, False),
    ("0.32.0+cpu", False): (vc.BASE_FIELDS, False, "off", True, False),
    ("0.33.0", False): (vc.BASE_FIELDS, True, "local", True, True),
    ("0.34.0.dev0", True): (vc.BASE_FIELDS + vc.ADMISSION_FIELDS, True, "local", False, False),
    ("0.31.0", False): (vc.BASE_FIELDS, False, "off", False, False),
}


@pytest.mark.parametrize(("version", "native"), sorted(TABLE))
def test_version_table(version: str, native: bool) -> None:
    fields, interval, mode, plugin, checked = TABLE[(version, native)]
    f = vc.features(version, native_admission=native)
    assert f.scheduler_fields == fields
    assert f.single_engine_interval is interval
    assert f.prefill_interval_mode == mode == vc.prefill_interval_mode(version)
    assert f.plugin_supported is plugin
    assert f.checked is checked
    assert f.native_admission is native


def test_base_fields_are_the_settings_fields_in_order() -> None:
    """A new SchedulerSettings field must be placed in the table (and the docs) first."""
    from dataclasses import fields

    assert tuple(f.name for f in fields(SchedulerSettings)) == vc.BASE_FIELDS + vc.ADMISSION_FIELDS


@pytest.mark.parametrize(("text", "parsed"), [
    ("0.33.0", (0, 33, 0)), ("0.32.0+cpu", (0, 32, 0)), ("0.34.0rc1", (0, 34, 0)),
    ("v0.33.1", (0, 33, 1)), ("0.34", (0, 34, 0)), ("0.34.0.dev12+g1234abc", (0, 34, 0)),
    ("1.0.0rc2.post1", (1, 0, 0)),
])
def test_parse_version(text: str, parsed: tuple[int, int, int]) -> None:
    assert vc.parse_version(text) == parsed
    assert vc.minor(text) == f"{parsed[0]}.{parsed[1]}"


@pytest.mark.parametrize("text", ["latest", "", "0", "x.33.0"])
def test_parse_version_refuses(text: str) -> None:
    with pytest.raises(UnsupportedVllmVersion, match="not of the form"):
        vc.parse_version(text)


def test_refusals() -> None:
    with pytest.raises(UnsupportedVllmVersion, match=">= 0.30.0 only"):
        vc.features("0.29.1")
    with pytest.raises(UnsupportedVllmVersion, match="no cache-aware admission fields"):
        vc.features("0.33.0", native_admission=True)
    # a patched 0.33.0 whose source has the fields is a fact, not a declaration
    assert vc.features("0.33.0", native_admission=True, detected=True).native_admission


def test_plan_plugin_form_and_notes() -> None:
    s = SchedulerSettings(cache_aware_admission_window=16, prefill_schedule_interval=4)
    old = vc.plan_scheduler_args(s, "0.32.0", async_scheduling=False)
    args = old.serve_args()
    assert args[args.index("--scheduler-cls") + 1] == vc.PLUGIN_SYNC_CLS
    assert "--no-async-scheduling" in args and "--cache-aware-admission-window" not in args
    assert any("only to data-parallel" in n for n in old.notes)
    new = vc.plan_scheduler_args(s, "0.33.0")
    assert new.scheduler_cls == vc.PLUGIN_ASYNC_CLS
    assert not any("data-parallel" in n for n in new.notes)
    native = vc.plan_scheduler_args(s, "0.34.0", native_admission=True).serve_args()
    assert native[native.index("--cache-aware-admission-window") + 1] == "16"
    assert "--scheduler-cls" not in native
    off = vc.plan_scheduler_args(SchedulerSettings(), "0.33.0", async_scheduling=False)
    assert "--no-async-scheduling" not in off.serve_args()
    pinned = vc.plan_scheduler_args(SchedulerSettings(), "0.33.0", async_scheduling=False,
                                    pin_sync=True)
    assert pinned.serve_args()[-1] == "--no-async-scheduling"


def test_flag_names_and_values() -> None:
    assert vc.flag_name("policy") == "--scheduling-policy"
    assert vc.flag_name("max_num_seqs") == "--max-num-seqs"
    assert vc.flag_value(0.1) == "0.1" and vc.flag_value(16) == "16"


def test_python_lookup_order(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    for var in {v for vs in vc.PYTHON_ENV_VARS.values() for v in vs}:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="--vllm-python PATH"):
        vc.find_vllm_python(None, "core")
    py = tmp_path / "python"
    py.write_text("#!/bin/sh\n")
    py.chmod(0o755)
    monkeypatch.setenv("TUNER_VLLM033_PYTHON", str(py))
    assert vc.find_vllm_python(None, "core") == str(py)
    # serving needs a build with CPU kernels: the 0.33.0 scheduler-only env does not qualify
    assert vc.vllm_python_from_env("serve") is None
    monkeypatch.setenv("TUNER_VLLM032_PYTHON", "/elsewhere/python")
    assert vc.vllm_python_from_env("serve") == "/elsewhere/python"
    with pytest.raises(ConfigError, match="not an executable"):
        vc.find_vllm_python(tmp_path / "missing")


def test_detect_reads_metadata_without_vllm(tmp_path: pathlib.Path) -> None:
    """A Python without vLLM is a one-line ConfigError, not a traceback."""
    import sys

    with pytest.raises(ConfigError, match="no vLLM installed"):
        vc.detect(sys.executable)


def test_docs_table_lists_every_supported_row() -> None:
    doc = (ROOT / "docs" / "vllm-versions.md").read_text()
    assert "docs/vllm-versions.md" in (ROOT / "README.md").read_text()
    for name in vc.BASE_FIELDS + vc.ADMISSION_FIELDS:
        assert f"`{name}`" in doc, name
    for cls in (vc.PLUGIN_SYNC_CLS, vc.PLUGIN_ASYNC_CLS):
        assert cls in doc
    for var in {v for vs in vc.PYTHON_ENV_VARS.values() for v in vs}:
        assert var in doc
    rows = re.findall(r"^\| (0\.\d+\.\d+[^|]*?) \|", doc, flags=re.M)
    assert {r.split()[0] for r in rows} >= {"0.32.0", "0.33.0"}


def test_only_vllm_compat_knows_version_numbers() -> None:
    """No module outside vllm_compat compares against a version tuple or prefix."""
    pattern = re.compile(r"\(0, 3\d, \d\)|startswith\(\"0\.3\d|_LAST_WITHOUT_ADMISSION")
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "tuner").rglob("*.py")
                 if p.name != "vllm_compat.py" and pattern.search(p.read_text())]
    assert offenders == []


# --------------------------------------------------------------------- async scheduling
@pytest.mark.parametrize("requested,platform,pp,pooling,expected", [
    (None, "cuda", 1, False, True),   # vLLM 0.33.0 turns it on by default
    (None, "rocm", 1, False, True),   # MI355X included
    (None, "cpu", 1, False, False),   # platforms/cpu.py forces it off
    (True, "cpu", 1, False, False),   # ... even when asked for
    (False, "cuda", 1, False, False),  # an explicit False is kept
    (True, "rocm", 1, False, True),
    (None, "cuda", 2, False, False),  # PP > 1 on the V1 model runner
    (None, "cuda", 1, True, False),   # pooling models
    (False, "cuda", 2, False, False),
])
def test_async_scheduling_resolves_as_vllm_033(requested, platform, pp, pooling, expected):
    assert vc.resolve_async_scheduling(
        requested, platform=platform, pipeline_parallel_size=pp, pooling=pooling) is expected


def test_async_scheduling_with_pipeline_parallelism_is_refused_like_vllm():
    with pytest.raises(ConfigError, match="pipeline parallelism"):
        vc.resolve_async_scheduling(True, pipeline_parallel_size=2)
    with pytest.raises(ConfigError, match="platform"):
        vc.resolve_async_scheduling(None, platform="tpu")  # type: ignore[arg-type]


def _vllm_source_root() -> pathlib.Path:
    """The installed vLLM 0.33.0 package directory (found without importing vLLM)."""
    import subprocess

    from tests.envs import env_python

    python = env_python("TUNER_VLLM033_PYTHON", "run .ci/setup-vllm.sh and export it")
    out = subprocess.run([python, "-c", "import importlib.util as u; "
                          "print(u.find_spec('vllm').submodule_search_locations[0])"],
                         capture_output=True, text=True, check=True, timeout=60)
    return pathlib.Path(out.stdout.strip())


def test_async_scheduling_resolution_matches_the_installed_vllm_source():
    """The rules cite vLLM 0.33.0's source (file:line); in its environment they hold."""
    root = _vllm_source_root()
    cpu = (root / "platforms" / "cpu.py").read_text().splitlines()
    assert any("scheduler_config.async_scheduling = False" in line for line in cpu[340:352])
    resolution = "\n".join((root / "config" / "vllm.py").read_text().splitlines()[1639:1720])
    assert "self.scheduler_config.async_scheduling = True" in resolution
    assert "pipeline parallelism" in resolution and '"pooling"' in resolution


def test_async_scheduling_flag_spelling():
    assert vc.async_scheduling_flag(True) == "--async-scheduling"
    assert vc.async_scheduling_flag(False) == "--no-async-scheduling"
