"""A replay names the limit that rejects requests, and rejecting all is an error (issue:
``--num-gpu-blocks 2`` blamed ``--max-model-len`` and exited 0 with 100 % rejected)."""

from __future__ import annotations

import pathlib

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.metrics import rejection_warning



def _invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res.exit_code, res.output


@pytest.mark.parametrize("command", [["replay"], ["tune", "--trials", "2", "-o", "p.yaml"]])
def test_a_tiny_kv_cache_is_named_and_is_an_error(mooncake_head_trace: pathlib.Path,
                                                  tmp_path: pathlib.Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  command: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out = _invoke(command[0], str(mooncake_head_trace), "--model", "llama-3.1-8b",
                        "--num-gpu-blocks", "2", *command[1:])
    assert code == 2, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("Error: every request is rejected (longer than the KV cache "
                           "holds: 16 tokens)"), last
    assert "--num-gpu-blocks" in last and "--max-model-len" not in last
    assert not (tmp_path / "p.yaml").exists()


def test_max_model_len_is_named_when_it_binds(mooncake_head_trace: pathlib.Path) -> None:
    code, out = _invoke("replay", str(mooncake_head_trace), "--model", "llama-3.1-8b",
                        "--max-model-len", "64")
    assert code == 2, out
    assert "longer than max_model_len=64" in out and "Raise --max-model-len" in out


def test_warning_names_the_binding_limit() -> None:
    some = {"num_requests": 100, "num_rejected": 10}
    assert "max_model_len=4,096" in rejection_warning(some, 4096, kv_capacity_tokens=1 << 20)
    kv = rejection_warning(some, 131072, kv_capacity_tokens=16)
    assert "KV cache holds: 16 tokens" in kv and "10 of 100" in kv
    assert rejection_warning({"num_requests": 100, "num_rejected": 1}, 4096) is None
