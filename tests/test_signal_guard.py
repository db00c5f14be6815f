"""The suite's signal guard (tests/conftest.py): a test that leaves SIGINT ignored or blocked
in its worker is named and fails, and the worker's state is put back for the tests after it
(an inherited SIG_IGN makes every later Ctrl-C test's child ignore the signal). A Python
handler, which exec does not pass on, is left alone."""

from __future__ import annotations

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

CASES = '''
import signal

def test_ignores_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)

def test_blocks_sigint():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])

def test_after_them():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])

def test_restores_what_it_changes():
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGINT, old)

def test_installs_a_python_handler():
    # not inherited through exec (a module-scoped server's cleanup handler does this)
    signal.signal(signal.SIGINT, lambda *_: None)
'''


def test_a_test_that_leaves_sigint_ignored_or_blocked_is_named(tmp_path: pathlib.Path) -> None:
    (tmp_path / "test_cases.py").write_text(CASES)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest",
                          "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                          str(tmp_path / "test_cases.py")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "test_ignores_sigint left its worker's signals changed: ignored ['SIGINT'], blocked []" in out
    assert "test_blocks_sigint left its worker's signals changed: ignored [], " \
           "blocked ['SIGINT']" in out
    assert "5 passed, 2 errors" in out, out  # a teardown error follows a passed call
