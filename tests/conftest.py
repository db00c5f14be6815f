"""Suite-wide test setup.

* The repository root goes on ``sys.path``, so every test can import ``tests.envs`` (the one
  place that decides whether a missing environment skips or fails).
* Every test marked ``vllm`` (it runs code in a vLLM environment: importing vLLM alone takes
  10-30 s, a server 35-120 s) is also ``slow``, so ``pytest -m "not slow"`` is the quick
  local loop even where the vLLM environments are exported. CI runs everything.
* The suite runs on pytest-xdist workers (``-n auto --dist loadgroup``, the README's test
  command; without ``-n`` it runs in one process). A worker runs a whole
  group: each ``vllm`` test is grouped by its module and vLLM version, because a module
  holds one vLLM process per version (a driver whose results it caches, or a
  module-scoped ``vllm serve``) that a second worker would start again; the ``postgres``
  tests share one group so two studies do not load the one server at once.
"""

from __future__ import annotations

import pathlib
import signal
import sys
import threading
from collections.abc import Iterator

import pytest

ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def xdist_group_of(item: pytest.Item) -> str | None:
    """The worker group of a test that shares an outside process with others (see above)."""
    if item.get_closest_marker("postgres") is not None:
        return "postgres"
    if item.get_closest_marker("vllm") is None:
        return None
    params = getattr(item, "callspec", None)
    version = params.params.get("version", params.params.get("any_vllm")) if params else None
    module = item.nodeid.split("::", 1)[0]
    return f"vllm:{module}" + (f":{version}" if version is not None else "")


def group_node_id(item: pytest.Item) -> None:
    """Append ``@group`` to the node id of a grouped test, which is how ``--dist loadgroup``
    sends a group to one worker. pytest-xdist 3.8 does it by assigning ``item._nodeid``;
    from pytest 9 the node id is derived from ``item._id`` instead, that assignment changes
    nothing, and every group would be spread over all workers (each starting the group's
    vLLM process again). Only where ``_id`` is pytest 9's structured id; older pytest
    keeps xdist's own suffix."""
    parse = getattr(type(getattr(item, "_id", None)), "parse", None)
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    if parse is None or not names or "@" in item.nodeid:
        return
    item._id = parse(f"{item.nodeid}@{'_'.join(names)}")  # type: ignore[attr-defined]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    grouping = bool(getattr(config.option, "loadgroup", False))  # set on xdist workers
    for item in items:
        if item.get_closest_marker("vllm") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
        group = xdist_group_of(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
        if grouping:
            group_node_id(item)


@pytest.fixture
def mooncake_head_trace(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """The first 40 records of the bundled Mooncake trace, ingested: a small real trace for
    CLI tests that need a file (function-scoped: tests change its folder)."""
    from click.testing import CliRunner

    from tuner.cli import cli

    monkeypatch.setenv("TUNER_SALT", "test-salt")
    src = tmp_path / "log.jsonl"
    mooncake = pathlib.Path(__file__).resolve().parents[1] / "traces" / "mooncake_synthetic.jsonl"
    with open(mooncake, "rb") as fh:
        src.write_bytes(b"".join(fh.readline() for _ in range(40)))
    out = tmp_path / "t.parquet"
    assert CliRunner().invoke(cli, ["ingest", str(src), "-o", str(out)]).exit_code == 0
    return out


#: The signals whose disposition a child process inherits through exec: an ignored or blocked
#: SIGINT in a test worker reaches every ``tuner`` process a later test starts there, whose
#: Ctrl-C then does nothing (Python installs its KeyboardInterrupt handler only where SIGINT
#: is not ignored at start-up). Three SIGINT tests failed in whole-suite runs only, as if so.
#: A Python-level handler is not inherited (exec resets it to the default), so a fixture's
#: own cleanup handler (a module-scoped ``vllm serve``) is not flagged.
_INHERITED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _inherited_state() -> tuple[frozenset[int], frozenset[int]]:
    """Which of the inherited signals the main thread ignores, and which it blocks: the
    part of its signal state that a child started now would inherit."""
    ignored = frozenset(int(sig) for sig in _INHERITED
                        if signal.getsignal(sig) is signal.SIG_IGN)
    blocked = frozenset(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    return ignored, blocked & {int(s) for s in _INHERITED}


@pytest.fixture(autouse=True)
def _keeps_signal_dispositions(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves a signal ignored or blocked in its worker fails here, and the
    worker gets its previous state back, so the culprit is named instead of a later Ctrl-C
    test failing far away from it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = _inherited_state()
    handlers = {sig: signal.getsignal(sig) for sig in _INHERITED}
    yield
    ignored, blocked = (after - prior for after, prior in zip(_inherited_state(), before))
    if not ignored and not blocked:
        return
    for sig in ignored:
        old = handlers[signal.Signals(sig)]
        signal.signal(sig, signal.SIG_DFL if old is None else old)
    if blocked:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
    names = lambda sigs: sorted(signal.Signals(s).name for s in sigs)  # noqa: E731
    pytest.fail(f"{request.node.nodeid} left its worker's signals changed: ignored "
                f"{names(ignored)}, blocked {names(blocked)}", pytrace=False)
