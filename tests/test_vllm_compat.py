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
