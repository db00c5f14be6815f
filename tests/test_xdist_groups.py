"""The suite runs on pytest-xdist workers, and tests that share an outside process keep to
one worker (tests/conftest.py): a second worker would start that vLLM process or load that
server again."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.conftest import pytest_collection_modifyitems, xdist_group_of

ROOT = pathlib.Path(__file__).resolve().parents[1]


@dataclass
class _CallSpec:
    params: dict[str, Any]


@dataclass
class _Item:
    """What the grouping reads of a collected test."""

    nodeid: str
    marks: list[str]
    params: dict[str, Any] | None = None
    added: list[Any] = field(default_factory=list)

    @property
    def callspec(self) -> _CallSpec:
        if self.params is None:
            raise AttributeError("callspec")
        return _CallSpec(self.params)

    def get_closest_marker(self, name: str) -> Any:
        if name in self.marks:
            return getattr(pytest.mark, name).mark
        return next((m for m in self.added if m.name == name), None)

    def add_marker(self, mark: Any) -> None:
        self.added.append(mark.mark)


def test_vllm_tests_are_grouped_by_module_and_version() -> None:
    parity = "tests/vllm/test_parity.py::test_parity[a-0.33]"
    assert xdist_group_of(_Item(parity, ["vllm"], {"version": "0.33", "name": "a"})) == \
        "vllm:tests/vllm/test_parity.py:0.33"
    plugin = "tests/vllm/test_vllm_plugin.py::test_x[0.32]"
    assert xdist_group_of(_Item(plugin, ["vllm"], {"any_vllm": "0.32"})) == \
        "vllm:tests/vllm/test_vllm_plugin.py:0.32"
    server = "tests/serve/test_serve_live.py::test_y"
    assert xdist_group_of(_Item(server, ["vllm"])) == "vllm:tests/serve/test_serve_live.py"
    assert xdist_group_of(_Item("tests/tune/test_postgres.py::t", ["postgres"])) == "postgres"
    assert xdist_group_of(_Item("tests/sim/test_loop.py::t", [])) is None


def test_the_hook_marks_them_before_xdist_reads_the_groups() -> None:
    items = [_Item("tests/vllm/test_parity.py::t[0.33]", ["vllm"], {"version": "0.33"}),
             _Item("tests/sim/test_loop.py::t", [])]
    # a module that must stay whole (one test reads both versions) names its group itself
    whole = _Item("tests/vllm/test_async_parity.py::t[0.32]", ["vllm", "slow", "xdist_group"],
                  {"version": "0.32"})
    config = type("Config", (), {"option": type("Option", (), {})()})()  # not a worker
    pytest_collection_modifyitems(config, [*items, whole])  # type: ignore[arg-type]
    assert whole.added == []
    vllm, plain = items
    assert {m.name for m in vllm.added} == {"slow", "xdist_group"}
    assert [m.args for m in vllm.added if m.name == "xdist_group"] == [
        ("vllm:tests/vllm/test_parity.py:0.33",)]
    assert plain.added == []
    # xdist folds the groups into node ids in its own modifyitems hook: ours must run first
    assert pytest_collection_modifyitems.pytest_impl["tryfirst"] is True  # type: ignore[attr-defined]


def test_the_readme_test_command_runs_on_workers_by_group() -> None:
    readme = (ROOT / "README.md").read_text()
    command = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)[1]  # 0 main job, 1 the test command
    assert command.strip().endswith("pytest -q -n auto --dist loadgroup")
    assert "pytest-xdist" in (ROOT / "pyproject.toml").read_text()


def test_a_group_runs_on_one_worker(tmp_path: pathlib.Path) -> None:
    """Real workers, this conftest: each version's tests on one worker (pytest 9 derives node
    ids from ``item._id``, where xdist 3.8's own ``@group`` suffix is lost)."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    vllm: x\n    slow: x\n")
    (tmp_path / "test_cases.py").write_text(textwrap.dedent("""
        import pytest
        pytestmark = pytest.mark.vllm
        @pytest.mark.parametrize("version", ["0.33", "0.32"])
        @pytest.mark.parametrize("case", range(6))
        def test_case(case, version):
            pass
    """))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
                           "-p", "no:cacheprovider", str(tmp_path)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = re.findall(r"\[(gw\d)\] .*PASSED .*test_case\[\d-(0\.3\d)\]@", proc.stdout)
    assert len(ran) == 12, proc.stdout[-3000:]
    workers = {version: {w for w, v in ran if v == version} for _, version in ran}
    assert all(len(w) == 1 for w in workers.values()), workers
