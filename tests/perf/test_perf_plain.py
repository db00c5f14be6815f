"""``tuner.perf`` runs inside vLLM environments (the step-time model is pickled into the
vLLM-core driver), so, like ``tuner.sim``, it must not import the heavy CLI/analysis stack."""

from __future__ import annotations

import ast
import pathlib

HEAVY = ("pyarrow", "polars", "optuna", "click", "rich", "pandas", "scipy")
ROOT = pathlib.Path(__file__).resolve().parents[2] / "tuner" / "perf"


def test_perf_is_plain_python() -> None:
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                assert name.split(".")[0] not in HEAVY, f"{path} imports {name}"
