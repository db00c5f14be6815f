"""The code follows the data: upstream packages never import downstream ones.

``tuner.sim`` is plain Python like vLLM's core (no pyarrow, polars, optuna or click), so
the vLLM driver can import it inside a vLLM environment that has none of them.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "tuner"
ORDER = ["trace", "sim", "perf", "replay", "metrics", "tune", "profile", "report", "jobs", "cli"]
HEAVY = ("pyarrow", "polars", "optuna", "click", "rich")


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _stage(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "tuner" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in ORDER else None


def _files(stage: str) -> list[pathlib.Path]:
    p = ROOT / stage
    return sorted(p.rglob("*.py")) if p.is_dir() else [ROOT / f"{stage}.py"]


@pytest.mark.parametrize("stage", ORDER)
def test_no_downstream_imports(stage: str) -> None:
    own = ORDER.index(stage)
    for path in _files(stage):
        if not path.exists():
            continue
        for mod in _imports(path):
            other = _stage(mod)
            if other is None or other == stage or stage == "cli":
                continue
            # vllm-facing modules in profile/replay may import sim (upstream) freely.
            assert ORDER.index(other) < own or (stage, other) == ("tune", "profile"), (
                f"{path.relative_to(ROOT.parent)} imports {mod}: {stage} must not import "
                f"downstream stage {other}")


def test_sim_is_plain_python() -> None:
    for path in _files("sim"):
        for mod in _imports(path):
            assert not mod.split(".")[0] in HEAVY, (
                f"{path.relative_to(ROOT.parent)} imports {mod}; tuner.sim must stay plain "
                "Python (it runs inside vLLM environments too)")
