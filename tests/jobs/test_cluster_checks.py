"""``tuner cluster job`` checks what it writes (issue: ``-- --bogus-flag``, ``--tp 3``,
``--cpu -5 --memory lots`` and ``--pods 100000 --trials 4`` all produced a manifest that
failed only in the cluster)."""

from __future__ import annotations

import pathlib

import pytest
import yaml
from click.testing import CliRunner

from tuner.cli import cli

BASE = ["cluster", "job", "--name", "agentic", "--trials", "8", "--storage",
        "postgresql://tuner@postgres/tuner", "--trace", "traces/agentic.parquet"]


def _invoke(tmp_path: pathlib.Path, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, [*BASE, "-o", str(tmp_path / "k8s"), *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    return res.exit_code, res.output


@pytest.mark.parametrize("args,says", [
    (["--pods", "2", "--", "--bogus-flag"], "No such option '--bogus-flag'"),
    (["--pods", "2", "--", "--model", "llama-3.1-70b", "--tp", "3"], "tp=3 must divide"),
    (["--pods", "2", "--", "--tp", "nan"], "'--tp'"),
    (["--pods", "2", "--", "--workers", "0"], "'--workers'"),
    (["--pods", "2", "--", "--holdout", "inf"], "--holdout"),
    (["--pods", "2", "--cpu", "-5"], "--cpu '-5': must be more than 0"),
    (["--pods", "2", "--cpu", "two"], "--cpu 'two': not a Kubernetes quantity"),
    (["--pods", "2", "--memory", "lots"], "--memory 'lots': not a Kubernetes quantity"),
    (["--pods", "2", "--memory", "4GB"], "not a Kubernetes quantity"),
    (["--pods", "2", "--memory", "1e400"], "--memory"),
    (["--pods", "100000"], "--pods 100000: at most 8"),
    (["--pods", "2", "--image", "tuner latest"], "--image"),
    (["--pods", "2", "--state-claim", "Tuner_State"], "--state-claim"),
    (["--pods", "2", "--password-secret", "a b"], "--password-secret"),
])
def test_unchecked_values_are_refused_before_writing(tmp_path: pathlib.Path, args: list[str],
                                                     says: str) -> None:
    code, out = _invoke(tmp_path, *args)
    assert code == 2, out
    assert out.startswith("Error: ") and says in out, out
    assert not (tmp_path / "k8s").exists()


@pytest.mark.parametrize("quantity", ["500m", "2", "0.5", "4Gi", "512Mi", "1e3", "1.5k", "2E"])
def test_kubernetes_quantities_pass(quantity: str) -> None:
    from tuner.jobs.cluster import parse_quantity

    assert parse_quantity("--cpu", quantity) > 0


def test_good_job_passes_and_a_large_request_raises_the_limit(tmp_path: pathlib.Path) -> None:
    code, out = _invoke(tmp_path, "--pods", "2", "--memory", "16Gi", "--", "--model",
                        "llama-3.1-8b", "--tp", "1", "--calibration", "/var/lib/tuner/c.yaml")
    assert code == 0, out
    doc = yaml.safe_load((tmp_path / "k8s" / "agentic.tune-job.yaml").read_text())
    res = doc["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert res["requests"]["memory"] == "16Gi" and res["limits"]["memory"] == "16Gi"
    script = doc["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "--calibration /var/lib/tuner/c.yaml" in script
