"""The code follows the data: upstream packages never import downstream ones, and no
module-level import circle exists anywhere in ``tuner/``.

Stage order (a stage may import any stage to its left)::

    trace -> sim -> perf -> replay -> vllm_core -> serve -> metrics -> fidelity -> tune
          -> profile -> report -> jobs -> cli

A stage that does not exist (yet) is skipped. The top-level modules in ``SHARED``
(``tuner/vllm_compat.py``, ``errors.py``, ``records.py``, ...) are for everyone; they import
only each other and the standard library (plus PyYAML for the loader), never a stage.

``tuner.sim`` (and ``tuner.perf``, which it may feed) is plain Python like vLLM's core (no
pyarrow, polars, optuna, click or rich), so the vLLM driver can import it inside a vLLM
environment that has none of them.

Private means private: a ``_``-prefixed module or name (``tuner.replay._run``,
``tuner.sim.loop._EMPTY``) is imported only inside the package that holds it (its
subpackages included); every other package goes through the package's public names
(``tuner.replay.prepare``, ``tuner.trace.formats.IngestContext``).

Import circles: only imports that run when a module is first imported count -- statements
at module level, including inside ``if``/``try`` at module level, but not under
``if TYPE_CHECKING:`` and not inside a function or method. A function-level import is the
documented way to reach a module that imports this one back (it runs after both modules
exist), so it is allowed; a module-level circle works or crashes depending on which module
happens to be imported first, and is refused.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "tuner"
ORDER = ["trace", "sim", "perf", "replay", "vllm_core", "serve", "metrics", "fidelity", "tune",
         "profile", "report", "jobs", "cli"]
#: Top-level modules any stage may import (they import no stage).
SHARED = ("__init__", "_lazy", "errors", "records", "vllm_compat", "loaders", "durations",
          "progress", "vllm_plugin", "outputs", "units", "processes")
#: Allowed downstream imports, each with its reason.
EXCEPTIONS: dict[tuple[str, str], str] = {}
#: Circles that exist only through function-level (lazy) imports, each with why it is
#: tolerated. Every other circle -- lazy or not -- fails test_no_lazy_import_circles, and an
#: entry that no longer forms a circle fails too, so the list cannot go stale.
LAZY_CIRCLES: dict[frozenset[str], str] = {}
HEAVY = ("pyarrow", "polars", "optuna", "click", "rich")
PLAIN_STAGES = ("sim", "perf")


def _existing(stages: list[str]) -> list[str]:
    return [s for s in stages if (ROOT / s).is_dir() or (ROOT / f"{s}.py").is_file()]


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(path: pathlib.Path) -> bool:
    return path.name == "__init__.py"


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _imports(path: pathlib.Path, *, module_level_only: bool) -> set[str]:
    return _source_imports(path.read_text(), _module_name(path), _is_package(path),
                           module_level_only=module_level_only, filename=str(path))


def _source_imports(code: str, module: str, is_package: bool, *, module_level_only: bool,
                    filename: str = "<probe>") -> set[str]:
    """Modules ``code`` imports (``from X import y`` yields ``X`` and ``X.y``; callers keep
    the names that are modules)."""
    tree = ast.parse(code, filename=filename)
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = (node.module or "") if node.level == 0 else _resolve_relative(
                module, is_package, node.level, node.module)
            if base:
                names.add(base)
                names.update(f"{base}.{a.name}" for a in node.names)
        if module_level_only:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                for child in node.orelse:
                    visit(child)
                return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _all_modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


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
    if stage not in _existing(ORDER):
        pytest.skip(f"tuner/{stage} does not exist (yet)")
    own = ORDER.index(stage)
    for path in _files(stage):
        for mod in _imports(path, module_level_only=False):
            other = _stage(mod)
            if other is None or other == stage or stage == "cli":
                continue
            assert ORDER.index(other) < own or (stage, other) in EXCEPTIONS, (
                f"{path.relative_to(ROOT.parent)} imports {mod}: {stage} must not import "
                f"downstream stage {other}")


@pytest.mark.parametrize("name", SHARED)
def test_shared_modules_import_no_stage(name: str) -> None:
    path = ROOT / f"{name}.py"
    if not path.is_file():
        pytest.skip(f"tuner/{name}.py does not exist")
    for mod in _imports(path, module_level_only=False):
        assert _stage(mod) is None, (
            f"tuner/{name}.py imports {mod}: a shared top-level module imports no stage")


def test_every_top_level_module_is_a_stage_or_shared() -> None:
    for path in ROOT.glob("*.py"):
        assert path.stem in ORDER or path.stem in SHARED, (
            f"tuner/{path.name}: add it to ORDER or SHARED in tests/test_layering.py")
    for path in ROOT.iterdir():
        if path.is_dir() and (path / "__init__.py").exists():
            assert path.name in ORDER, f"tuner/{path.name}/: add it to ORDER"


@pytest.mark.parametrize("stage", PLAIN_STAGES)
def test_plain_python_stages(stage: str) -> None:
    if stage not in _existing(ORDER):
        pytest.skip(f"tuner/{stage} does not exist (yet)")
    for path in _files(stage):
        for mod in _imports(path, module_level_only=False):
            assert mod.split(".")[0] not in HEAVY, (
                f"{path.relative_to(ROOT.parent)} imports {mod}; tuner.{stage} must stay plain "
                "Python (it runs inside vLLM environments too)")


def _module_graph(*, module_level_only: bool = True) -> dict[str, set[str]]:
    modules = _all_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        # ``from pkg import sub`` names ``pkg`` too, but a submodule reaching its own parent
        # package is no design circle: Python initialises the parent before any submodule,
        # and a package ``__init__`` that re-exports its submodules lazily (``tuner._lazy``)
        # only names them under TYPE_CHECKING.
        graph[name] = {m for m in _imports(path, module_level_only=module_level_only)
                       if m in modules and m != name and not name.startswith(m + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_module_level_import_circles() -> None:
    graph = _module_graph()
    found = _cycles(graph)
    assert not found, "module-level import circles (import lazily inside the function " \
        "that needs it, or move the shared name to a module both import):\n" + "\n".join(
            " <-> ".join(c) for c in found)


def test_no_lazy_import_circles() -> None:
    """Counting function-level and TYPE_CHECKING imports too, only the documented circles
    in LAZY_CIRCLES remain (e.g. trace/_ingest <-> trace/formats and tune/study <->
    tune/survivors were removed: a shared module now holds what both need)."""
    found = {frozenset(c) for c in _cycles(_module_graph(module_level_only=False))}
    undocumented = [sorted(c) for c in found if c not in LAZY_CIRCLES]
    assert not undocumented, "import circles through lazy imports (break them, or document " \
        "them in LAZY_CIRCLES):\n" + "\n".join(" <-> ".join(c) for c in undocumented)
    stale = [sorted(c) for c in LAZY_CIRCLES if c not in found]
    assert not stale, f"LAZY_CIRCLES lists circles that no longer exist; remove them: {stale}"


def _is_package_name(dotted: str) -> bool:
    return (ROOT.parent.joinpath(*dotted.split(".")) / "__init__.py").is_file()


def _private_owner(name: str) -> str | None:
    """The package that owns ``name``'s first private (``_``-prefixed) part, or None when
    ``name`` is public: ``tuner.replay._run.prepare`` -> ``tuner.replay``,
    ``tuner.sim.loop._EMPTY`` -> ``tuner.sim`` (a module's private name belongs to the
    module's package)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            owner = ".".join(parts[:i])
            while owner and not _is_package_name(owner):
                owner = owner.rpartition(".")[0]
            return owner
    return None


def _private_imports(code: str, module: str, is_package: bool) -> list[str]:
    """What ``code`` (module ``module``) imports from another package's private parts."""
    own = module if is_package else module.rpartition(".")[0]
    found = []
    for name in sorted(_source_imports(code, module, is_package, module_level_only=False)):
        if not name.startswith("tuner."):
            continue
        owner = _private_owner(name)
        if owner is not None and own != owner and not own.startswith(owner + "."):
            found.append(name)
    return found


def test_no_imports_of_another_packages_private_modules_or_names() -> None:
    bad = []
    for name, path in _all_modules().items():
        for target in _private_imports(path.read_text(), name, _is_package(path)):
            bad.append(f"{path.relative_to(ROOT.parent)} imports {target}")
    assert not bad, ("private modules and names are for their own package; import the "
                     "package's public name instead (add it to its __init__):\n"
                     + "\n".join(bad))


def test_private_import_rule_on_probes() -> None:
    """The checker itself, on what the rule replaced: tune reaching into replay's private
    module, a report importing a private function, ingest reaching into a subpackage's
    private module; and what stays allowed (a package's own privates, a subpackage using
    its parent's, the top-level ``tuner._lazy``)."""
    assert _private_imports("from tuner.replay._kv_requests import intern_requests\n",
                            "tuner.tune.evaluate", False) == [
        "tuner.replay._kv_requests", "tuner.replay._kv_requests.intern_requests"]
    assert _private_imports("from tuner.replay._kv_requests import _x\n",
                            "tuner.report.study_trace", False)
    assert _private_imports("from tuner.sim.loop import _EMPTY\n", "tuner.replay._sim",
                            False) == ["tuner.sim.loop._EMPTY"]
    assert _private_imports("from tuner.trace.formats._batch import LINE\n",
                            "tuner.trace._ingest", False)
    assert _private_imports("from tuner.replay import _run\n", "tuner.fidelity.parity",
                            False) == ["tuner.replay._run"]
    assert not _private_imports("from tuner.replay._backend import Backend\n"
                                "from . import _stream\n", "tuner.replay._run", False)
    assert not _private_imports("from tuner.sim._step_rules import cdiv\n"
                                "from tuner.sim.loop import _EMPTY\n",
                                "tuner.sim.fleet.loop", False)
    assert not _private_imports("from tuner import _lazy\n", "tuner.cli", True)
    assert not _private_imports("from tuner.replay import intern_requests\n",
                                "tuner.tune.evaluate", False)


def test_cycle_finder_finds_a_circle() -> None:
    """The checker itself: a two-module and a three-module circle, and a clean chain."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_lazy_and_type_checking_imports_do_not_count() -> None:
    code = ("from typing import TYPE_CHECKING\nimport tuner.errors\n"
            "from . import loaders\n"
            "if TYPE_CHECKING:\n    import tuner.records\nelse:\n    import json\n"
            "def f():\n    import tuner.vllm_compat\n"
            "class C:\n    def m(self):\n        from tuner import durations\n")
    eager = _source_imports(code, "tuner.probe", False, module_level_only=True)
    assert eager == {"typing", "typing.TYPE_CHECKING", "tuner.errors", "tuner",
                     "tuner.loaders", "json"}
    every = _source_imports(code, "tuner.probe", False, module_level_only=False)
    assert {"tuner.records", "tuner.vllm_compat", "tuner.durations"} <= every


def test_vllm_core_driver_is_plain_python() -> None:
    """The vLLM-core driver and its token ids run inside a vLLM interpreter: tuner.sim's
    rule, and nothing of tuner's own but the plain stages and the shared modules."""
    for name in ("driver.py", "tokens.py", "model_output.py", "offloading.py"):
        path = ROOT / "vllm_core" / name
        for mod in _imports(path, module_level_only=False):
            assert mod.split(".")[0] not in HEAVY, f"tuner/vllm_core/{name} imports {mod}"
            assert _stage(mod) in (None, "vllm_core") + PLAIN_STAGES, (
                f"tuner/vllm_core/{name} imports {mod}: the driver may use tuner.sim only")
