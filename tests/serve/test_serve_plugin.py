"""tuner's PR #54625 plugin loaded into a real ``vllm serve`` through ``--scheduler-cls``,
and Ctrl-C cleanup: one server, launched by a child process (plugin_child.py).

The scenario is the PR's eviction test on a 4-usable-block cache (block size 32) with one
request at a time: ``warm0`` leaves 3 cached blocks, a ``blocker`` runs, ``cold`` then
``warm`` (warm0's prompt) queue behind it. FCFS admits cold first, whose 3 blocks evict
warm's cached prefix; with the window on (threshold 0.0) warm is admitted first and keeps
its 2-block (64-token) hit -- the last block is recomputed under vLLM's last-token rule.
cold and warm are queued while vLLM's ``/pause?mode=keep`` holds the blocker, so the
scenario has no race against the blocker's end (plugin_child.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from serve_env import ROOT, vllm032_python

from tuner.serve.server import group_alive

pytestmark = pytest.mark.vllm

CHILD = pathlib.Path(__file__).with_name("plugin_child.py")


@pytest.fixture(scope="module")
def child():  # type: ignore[no-untyped-def]
    py = vllm032_python()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(CHILD.parent), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, str(CHILD), py], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        err = proc.stderr.read() if proc.stderr else ""
        proc.kill()
        pytest.fail(f"plugin child produced no result:\n{err[-3000:]}")
    result = json.loads(line)
    print(f"\nplugin server ready in {result['startup_s']:.1f} s")
    yield proc, result
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if group_alive(result["pgid"]):
        os.killpg(result["pgid"], signal.SIGKILL)


def test_plugin_is_launched_through_scheduler_cls(child) -> None:  # type: ignore[no-untyped-def]
    _, result = child
    cmd = result["command"]
    i = cmd.index("--scheduler-cls")
    assert cmd[i + 1] == "tuner.vllm_plugin.CacheAwareScheduler"
    assert "--no-async-scheduling" in cmd
    extra = json.loads(cmd[cmd.index("--additional-config") + 1])
    assert extra == {"cache_aware_admission_window": 4, "cache_aware_admission_threshold": 0.0}


def test_window_keeps_warm_prefix_hit(child) -> None:  # type: ignore[no-untyped-def]
    _, r = child
    assert r["warm0"]["cached"] == 0 and r["cold"]["cached"] == 0
    assert r["blocker"]["tokens"] == 63
    # warm was admitted before cold although it arrived later: the plugin reordered
    assert r["warm"]["first_s"] < r["cold"]["first_s"]
    assert r["warm"]["cached"] == 64  # its cached prefix survived (FCFS would evict it)
    assert r["hits"] == 64  # the server's counter agrees: the only hit of the scenario


def test_ctrl_c_stops_the_server_and_leaves_no_process(child) -> None:  # type: ignore[no-untyped-def]
    proc, r = child
    pgid = r["pgid"]
    assert group_alive(pgid)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    end = time.monotonic() + 30
    while group_alive(pgid) and time.monotonic() < end:
        time.sleep(0.2)
    assert not group_alive(pgid), "server processes left behind after Ctrl-C"
    assert proc.returncode != 0  # KeyboardInterrupt after cleanup, as Ctrl-C ends a CLI
