"""``num_speculative_tokens`` (and on/off) as a search dimension (tuner.tune.spec_space),
the spec flags on tune / tune-log and the retune config's ``speculative:`` key."""

from __future__ import annotations

import pathlib

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.perf.deployment import Deployment, Split
from tuner.perf.spec_decode import default_acceptance
from tuner.perf.target import Target
from tuner.profile import profile_of
from tuner.sim.spec_decode import from_vllm_config
from tuner.tune import ReplayEvaluator, SearchOptions, TuneInputs, admission_space, tune
from tuner.tune.robust import RobustOptions
from tuner.tune.space import SPEC_TOKENS, space_from_dict
from tuner.tune.spec_space import parse_spec_tokens, spec_at, with_spec_tokens

TARGET = Target(hardware="mi355x", model="llama-3.1-70b", tp=8, num_gpu_blocks=1500)
MTP1 = from_vllm_config({"method": "mtp", "num_speculative_tokens": 1},
                        default_rates=default_acceptance)


def test_with_k_keeps_the_drafter_and_continues_the_rates() -> None:
    three = MTP1.with_k(3)
    assert three.num_speculative_tokens == 3 and three.method == "mtp"
    assert three.acceptance == pytest.approx((0.85, 0.85 ** 2, 0.85 ** 3))
    assert three.vllm_config == {"method": "mtp", "num_speculative_tokens": 3}
    synth = from_vllm_config({"method": "eagle3", "num_speculative_tokens": 2,
                              "synthetic_acceptance_rates": [0.8, 0.6]})
    one = synth.with_k(1)
    assert one.vllm_config["synthetic_acceptance_rates"] == [0.8]
    assert from_vllm_config(one.vllm_config).acceptance == (0.8,)  # what vLLM would read
    assert spec_at(MTP1, None) is MTP1 and spec_at(MTP1, 0) is None
    with pytest.raises(ConfigError, match="needs --speculative-config"):
        spec_at(None, 2)


def test_deployment_records_k_only_when_searched() -> None:
    plain = Deployment(Split(8, 1, 1))
    assert "num_speculative_tokens" not in plain.to_dict()  # older study records unchanged
    two = Deployment(Split(8, 1, 1), None, 2)
    assert Deployment.from_dict(two.to_dict()) == two
    assert two.describe() == "TP8, num_speculative_tokens 2"
    assert Deployment(Split(8, 1, 1), None, 0).describe() == "TP8, no speculative decoding"
    with pytest.raises(ConfigError, match=r"^deployment.num_speculative_tokens: must be an "
                                          r"integer >= 0 \(got -1\)$"):
        Deployment.from_dict({"tp": 8, "num_speculative_tokens": -1})


def test_the_dimension_needs_a_drafter_and_refuses_bad_values() -> None:
    space = with_spec_tokens(admission_space(), MTP1, (0, 1, 3))
    assert space.names[-1] == SPEC_TOKENS and space.has_deployment
    with pytest.raises(ConfigError, match="needs --speculative-config"):
        with_spec_tokens(admission_space(), None, (0, 1))
    per_batch = from_vllm_config({"method": "mtp", "num_speculative_tokens": 2,
                                  "num_speculative_tokens_per_batch_size": [[1, 64, 2],
                                                                            [65, 4096, 1]]},
                                 default_rates=default_acceptance)
    with pytest.raises(ConfigError, match="search one or the other"):
        with_spec_tokens(admission_space(), per_batch, (0, 1))
    for bad in ("1,x", "-1,2", "1,1", "0"):
        with pytest.raises(ConfigError, match="--spec-tokens"):
            parse_spec_tokens(bad)
    yaml_space = space_from_dict({"params": {SPEC_TOKENS: {"type": "categorical",
                                                           "choices": [0, 2]}}})
    assert with_spec_tokens(yaml_space, MTP1, None) is yaml_space
    with pytest.raises(ConfigError, match=r"choices: -1: drafts per step must be >= 0"):
        space_from_dict({"params": {SPEC_TOKENS: {"type": "categorical", "choices": [-1]}}})


def test_k_zero_replays_the_engine_without_drafts(small_trace: pathlib.Path) -> None:
    plain = ReplayEvaluator(small_trace, target=TARGET)
    spec = ReplayEvaluator(small_trace, target=TARGET, speculative=MTP1)
    base = plain.default_deployment
    off = spec.evaluate(plain.default_settings, "stage1",
                        deployment=Deployment(base.split, base.router, 0))
    wall = ("speed_ratio", "wall_s")  # measured, not replayed
    same = plain.evaluate(plain.default_settings, "stage1")
    assert {k: v for k, v in off.items() if k not in wall} == {
        k: v for k, v in same.items() if k not in wall}
    on = spec.evaluate(plain.default_settings, "stage1")
    assert on["p90_interactivity"] > 1.2 * off["p90_interactivity"]  # drafts do something
    again = ReplayEvaluator.from_spec(spec.spec(), trace=small_trace)
    assert again.speculative == MTP1  # a joiner replays the same drafter
    assert "speculative" not in plain.spec()  # a study without drafts keeps its spec


def test_a_tune_searches_k_and_reports_the_gain(small_trace: pathlib.Path) -> None:
    result = tune(TuneInputs(small_trace, target=TARGET, speculative=MTP1),
                  SearchOptions(n_trials=8, seed=1, spec_tokens=(0, 1, 2),
                                robust=RobustOptions(enabled=False)))
    ks = {p.params.get(SPEC_TOKENS) for p in result.stage2}
    assert ks <= {0, 1, 2} and len(ks) > 1
    gain = result.spec_gain
    assert gain is not None and gain.window == "holdout" and gain.method == "mtp"
    pick_k = result.deployment_of(result.recommended)["num_speculative_tokens"]
    assert gain.k == pick_k
    assert gain.with_spec != gain.without
    assert "against k = 0" in gain.line()
    assert result.to_dict()["speculative_gain"]["num_speculative_tokens"] == pick_k
    spec = profile_of(result, "s").target.speculative
    if pick_k:
        assert spec["speculative_config"] == {"method": "mtp", "num_speculative_tokens": pick_k}
        assert len(spec["acceptance"]) == pick_k
    else:
        assert spec is None


def test_tune_cli_refuses_k_without_a_drafter(small_trace: pathlib.Path,
                                              tmp_path: pathlib.Path) -> None:
    out = tmp_path / "p.yaml"
    r = CliRunner().invoke(cli, ["tune", str(small_trace), "--spec-tokens", "0,1",
                                 "-o", str(out), "--trials", "2"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1] == (
        "Error: searching speculative.num_speculative_tokens needs --speculative-config (the "
        "drafter and its acceptance), e.g. '{\"method\": \"mtp\", \"num_speculative_tokens\": 1}'")
    assert not out.exists()
    r = CliRunner().invoke(cli, ["tune", str(small_trace), "--speculative-config", "{",
                                 "-o", str(out)])
    assert r.exit_code == 2 and "--speculative-config: not JSON" in r.output


def test_retune_config_reads_speculative(tmp_path: pathlib.Path) -> None:
    import yaml

    from tests.jobs.conftest import BASE_CONFIG
    from tuner.jobs import load_config

    (tmp_path / "server.log").write_text(
        "INFO SpecDecoding metrics: Mean acceptance length: 1.80, Accepted throughput: 1 "
        "tokens/s, Drafted throughput: 1 tokens/s, Accepted: 8 tokens, Drafted: 10 tokens, "
        "Per-position acceptance rate: 0.800, Avg Draft acceptance rate: 80.0%\n")
    path = tmp_path / "retune.yaml"

    def load(spec: object):  # type: ignore[no-untyped-def]
        path.write_text(yaml.safe_dump({**BASE_CONFIG, "speculative": spec}))
        return load_config(path)

    cfg = load({"config": {"method": "mtp", "num_speculative_tokens": 1},
                "acceptance": "server.log", "tokens": [0, 1, 2]})
    assert cfg.speculative.acceptance == (0.8,) and cfg.spec_tokens == (0, 1, 2)
    with pytest.raises(ConfigError, match=r"retune.yaml.*speculative.*unknown key\(s\) k"):
        load({"config": {"method": "mtp", "num_speculative_tokens": 1}, "k": 2})
    with pytest.raises(ConfigError, match=r"speculative.*method 'medusa' is not modelled"):
        load({"config": {"method": "medusa", "num_speculative_tokens": 1}})
    with pytest.raises(ConfigError, match=r"speculative.*--spec-tokens"):
        load({"config": {"method": "mtp", "num_speculative_tokens": 1}, "tokens": [-1]})
