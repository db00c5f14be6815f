"""``tuner cluster job``: the Kubernetes Job for distributed tuning, and its pods' script."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from tests.jobs.test_schedule import _check
from tests.tune.tracegen import write_small_trace
from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.jobs.cluster import ClusterTuneSpec, pod_script, tune_job_manifest

# What the API server requires of a batch/v1 Job with Indexed completion (batch/v1 API
# reference), plus the fields this Job relies on.
_CONTAINER = {"name": str, "image": str, "command": [str],
              "env": [{"name": str}],
              "resources": {"requests": {"cpu": str, "memory": str}},
              "volumeMounts": [{"name": str, "mountPath": str}]}
JOB_SCHEMA = {
    "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": str},
    "spec": {"completionMode": ("Indexed",), "completions": int, "parallelism": int,
             "backoffLimit": int,
             "template": {"spec": {
                 "restartPolicy": ("Never", "OnFailure"), "containers": [_CONTAINER],
                 "volumes": [{"name": str, "persistentVolumeClaim": {"claimName": str}}]}}},
}
TUNE_ARGS = ["--hardware", "mi355x", "--model", "llama-3.1-70b", "--tp", "8",
             "--num-gpu-blocks", "1500"]


def _spec(**kw: object) -> ClusterTuneSpec:
    base: dict = {"name": "agentic", "trace": "traces/a.parquet", "pods": 4, "trials": 40,
                  "storage": "postgresql://tuner@pg:5432/tuner", "tune_args": tuple(TUNE_ARGS)}
    return ClusterTuneSpec(**{**base, **kw})


def test_job_manifest_matches_schema() -> None:
    result = CliRunner().invoke(cli, ["cluster", "job", "--name", "agentic", "--pods", "4",
                                      "--trials", "40", "--storage",
                                      "postgresql://tuner@pg:5432/tuner", "--trace",
                                      "traces/a.parquet", "--image", "reg/tuner:1", "--",
                                      *TUNE_ARGS])
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(result.output)
    assert _check(doc, JOB_SCHEMA) == []
    assert doc["spec"]["completions"] == doc["spec"]["parallelism"] == 4
    pod = doc["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "reg/tuner:1"
    env = {e["name"]: e for e in container["env"]}
    assert env["TUNER_STORAGE"]["value"] == "postgresql://tuner@pg:5432/tuner"
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "tuner-postgres",
                                                               "key": "password"}
    script = container["command"][2]
    assert "tune /var/lib/tuner/traces/a.parquet --hardware mi355x" in script
    assert "--join agentic" in script and "tuner cluster wait agentic" in script
    broken = tune_job_manifest(_spec())
    del broken["spec"]["completionMode"]
    assert _check(broken, JOB_SCHEMA) == [".spec.completionMode: required"]


@pytest.mark.parametrize("change,message", [
    ({"storage": "sqlite:///x.db"}, "through PostgreSQL"),
    ({"storage": "postgresql://tuner:secret@pg/tuner"}, "holds a password"),
    ({"name": "Agentic_1"}, "lowercase letters"),
    ({"tune_args": ("--storage", "x")}, "set by the Job itself"),
])
def test_bad_specs_are_refused(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _spec(**change)


def test_the_pods_script_tunes_one_study(tmp_path: pathlib.Path) -> None:
    """Run the Job's script as pod 0 (lead) and pod 1 (worker) on one machine.

    The volume is a temp folder and the study a journal file instead of PostgreSQL (the
    script only passes $TUNER_STORAGE through), so what is checked is that every command in
    the manifest is a valid tuner invocation and that the two pods share one study.
    """
    trace = write_small_trace(tmp_path / "vol" / "traces" / "small.parquet")
    spec = _spec(trace="traces/small.parquet", pods=2, trials=8)
    script = pod_script(spec).replace("/var/lib/tuner", str(tmp_path / "vol"))
    journal = tmp_path / "study.optuna-journal"
    env = {**os.environ, "TUNER_STORAGE": str(journal), "TUNER_SALT": "x",
           "PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    worker = subprocess.Popen(["/bin/sh", "-c", script], env={**env, "JOB_COMPLETION_INDEX": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lead = subprocess.run(["/bin/sh", "-c", script], env={**env, "JOB_COMPLETION_INDEX": "0"},
                          capture_output=True, text=True, timeout=300)
    out, _ = worker.communicate(timeout=300)
    assert lead.returncode == 0, lead.stderr[-3000:]
    assert worker.returncode == 0, out[-3000:]
    assert "study 'agentic' is ready" in out
    assert "joined agentic" in out
    assert (tmp_path / "vol" / "profiles" / "agentic.yaml").is_file()
    assert trace.exists()


def test_the_manifests_image_is_the_one_the_readme_builds() -> None:
    """The CronJob's and the Job's default ``image:`` is what the README's docker build makes."""
    root = pathlib.Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    dockerfile = (root / "Dockerfile").read_text()
    tag = _spec().image
    assert f"docker build -t {tag} ." in readme
    assert f"docker build -t {tag} ." in dockerfile
    from tuner.jobs import cronjob_manifest, make_spec

    cron = cronjob_manifest(make_spec(every="6h", cron=None, config=root / "pyproject.toml"))
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == tag
    # The image installs this package and runs as the uid the manifests ask for.
    assert "COPY tuner ./tuner" in dockerfile and "pip install '.[postgres]'" in dockerfile
    assert "USER 1000:1000" in dockerfile
    assert pod["securityContext"]["runAsUser"] == 1000
    ignored = (root / ".dockerignore").read_text().split()
    assert {"!pyproject.toml", "!README.md", "!tuner/"} <= set(ignored)
