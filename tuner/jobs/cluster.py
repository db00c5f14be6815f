"""Distributed tuning on Kubernetes: one Job whose N pods share one PostgreSQL study.

``tuner cluster job`` writes a ``batch/v1`` Job in ``Indexed`` completion mode. Pod 0 is the
lead: it runs ``tuner tune TRACE ... --storage URL --study NAME -o PROFILE``, which creates
the study, runs stage-1 trials, then stage 2 and the held-out check, and writes the profile
to the shared volume. Pods 1..N-1 wait until the study exists (``tuner cluster wait``, so a
worker that starts first does not fail with "no study") and then run ``tuner tune --join
NAME`` until the study has its trials. The split is the one ``tune``/``tune --join``
already have on separate machines (docs/tuning.md); Kubernetes only starts the processes.

Why a Job and not N Deployments: the work ends; a Job's pods exit 0 when the study is
done, and ``backoffLimit`` retries a killed pod, which resumes (an Optuna study keeps every
finished trial; trials a dead pod left RUNNING are failed by the next run). The database
password never enters the manifest: the URL carries user, host and database, the password
comes from a Secret as ``PGPASSWORD`` (libpq reads it).
"""

from __future__ import annotations

import re
import shlex
import time
import urllib.parse
from dataclasses import dataclass

from tuner.errors import ConfigError

#: Where the shared volume (trace, profiles) is mounted in every pod, as for the CronJob.
MOUNT = "/var/lib/tuner"
#: The image's unprivileged user (Dockerfile); the volume is made writable for its group.
IMAGE_UID = 1000

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

#: Kubernetes' resource quantity grammar (k8s.io/apimachinery resource.Quantity):
#: a signed decimal number, then a binary (Ki..Ei), decimal (m, k, M..E) or exponent
#: (e3, E-2) suffix. Anything else is refused by the API server when the Job is applied.
_QUANTITY = re.compile(r"^(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
                       r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}

#: Pods one Job may run (each a lead or a worker on the one study).
MAX_PODS = 1000


def parse_quantity(option: str, text: str) -> float:
    """A Kubernetes quantity (``500m``, ``2``, ``4Gi``, ``1e3``) as a number, > 0.

    ``--cpu -5`` or ``--memory lots`` used to be written into the manifest and fail only
    when the cluster read it.
    """
    m = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise ConfigError(f"{option} {text!r}: not a Kubernetes quantity (e.g. 500m, 2, 4Gi, "
                          "512Mi)")
    suffix = m.group("suffix") or ""
    if suffix in _BINARY:
        scale = float(_BINARY[suffix])
    elif suffix in _DECIMAL:
        scale = _DECIMAL[suffix]
    elif abs(int(suffix[1:])) <= 18:  # the exponent form; Kubernetes caps at exa too
        scale = 10.0 ** int(suffix[1:])
    else:
        raise ConfigError(f"{option} {text!r}: exponent out of range")
    value = float(m.group("num")) * scale
    if not value > 0:
        raise ConfigError(f"{option} {text!r}: must be more than 0")
    return value


@dataclass(frozen=True)
class ClusterTuneSpec:
    """One distributed tuning run."""

    name: str  # Job and study name (a DNS label: lowercase, digits, '-')
    trace: str  # the trace, relative to the volume (or absolute inside the pod)
    storage: str  # postgresql://USER@HOST[:PORT]/DB, no password
    pods: int  # lead + workers
    trials: int  # stage-1 trials of the study, all pods together
    tune_args: tuple[str, ...] = ()  # target and search flags for the lead (--hardware ...)
    image: str = "tuner:latest"
    state_claim: str = "tuner-state"  # PVC with the trace; profiles are written there
    password_secret: str | None = "tuner-postgres"  # Secret holding key "password"
    cpu: str = "2"
    memory: str = "4Gi"
    memory_limit: str = "8Gi"

    def __post_init__(self) -> None:
        if not _DNS_LABEL.match(self.name) or len(self.name) > 52:
            raise ConfigError(f"--name {self.name!r}: use lowercase letters, digits and '-' "
                              "(at most 52 characters: Kubernetes adds pod suffixes)")
        if self.pods < 1 or self.trials < 1:
            raise ConfigError("--pods and --trials must be >= 1")
        if self.pods > min(self.trials, MAX_PODS):
            raise ConfigError(f"--pods {self.pods}: at most {min(self.trials, MAX_PODS):,} "
                              f"(each pod runs at least one of the --trials {self.trials}, and "
                              f"one study serves at most {MAX_PODS:,} pods)")
        from tuner.jobs.schedule import check_kubernetes_names

        check_kubernetes_names(image=self.image, state_claim=self.state_claim,
                               secret=self.password_secret)
        request = parse_quantity("--memory", self.memory)
        parse_quantity("--cpu", self.cpu)
        if request > parse_quantity("memory limit", self.memory_limit):
            # The API server refuses a request above the limit: the limit follows.
            object.__setattr__(self, "memory_limit", self.memory)
        parts = urllib.parse.urlsplit(self.storage)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ConfigError(f"--storage {self.storage!r}: pods on several nodes share the "
                              "study through PostgreSQL; give postgresql://USER@HOST/DB")
        if parts.password:
            raise ConfigError("--storage: the URL holds a password, which would be stored in "
                              "the manifest; drop it and pass --password-secret NAME")
        bad = {"--storage", "--study", "--join", "-o", "--output", "--trials"} & {
            a.split("=")[0] for a in self.tune_args}
        if bad:
            raise ConfigError(f"{', '.join(sorted(bad))}: set by the Job itself; give the "
                              "target and search flags only")

    @property
    def trace_in_pod(self) -> str:
        return self.trace if self.trace.startswith("/") else f"{MOUNT}/{self.trace}"

    @property
    def profile_in_pod(self) -> str:
        return f"{MOUNT}/profiles/{self.name}.yaml"

    def lead_command(self) -> list[str]:
        return ["tuner", "tune", self.trace_in_pod, *self.tune_args, "--storage",
                "$(TUNER_STORAGE)", "--study", self.name, "--trials", str(self.trials),
                "--no-progress", "-o", self.profile_in_pod]

    def worker_command(self) -> list[str]:
        return ["tuner", "tune", "--join", self.name, "--storage", "$(TUNER_STORAGE)",
                "--no-progress", self.trace_in_pod]


def pod_script(spec: ClusterTuneSpec) -> str:
    """The shell each pod runs: the lead tunes, the others wait for the study and join."""
    def sh(cmd: list[str]) -> str:
        # $(TUNER_STORAGE) is the Kubernetes env expansion for args; in a script use $VAR.
        return " ".join('"$TUNER_STORAGE"' if c == "$(TUNER_STORAGE)" else shlex.quote(c)
                        for c in cmd)
    wait = ["tuner", "cluster", "wait", spec.name, "--storage", "$(TUNER_STORAGE)"]
    return (f'if [ "$JOB_COMPLETION_INDEX" = 0 ]; then exec {sh(spec.lead_command())}; fi\n'
            f"{sh(wait)} && exec {sh(spec.worker_command())}\n")


def tune_job_manifest(spec: ClusterTuneSpec) -> dict:
    """The ``batch/v1`` Job (Indexed, one pod per index, all running at once)."""
    env: list[dict] = [{"name": "TUNER_STORAGE", "value": spec.storage}]
    if spec.password_secret:
        env.append({"name": "PGPASSWORD", "valueFrom": {"secretKeyRef": {
            "name": spec.password_secret, "key": "password"}}})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": spec.name, "labels": {"app.kubernetes.io/name": "tuner",
                                                   "app.kubernetes.io/component": "tune"}},
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.pods,
            "parallelism": spec.pods,
            # A retried pod resumes: the study keeps finished trials.
            "backoffLimit": 2 * spec.pods,
            "ttlSecondsAfterFinished": 7 * 24 * 3600,
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "tuner"}},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID,
                                        "fsGroup": IMAGE_UID},
                    "containers": [{
                        "name": "tune",
                        "image": spec.image,
                        "command": ["/bin/sh", "-c", pod_script(spec)],
                        "env": env,
                        "resources": {"requests": {"cpu": spec.cpu, "memory": spec.memory},
                                      "limits": {"memory": spec.memory_limit}},
                        "volumeMounts": [{"name": "state", "mountPath": MOUNT}],
                    }],
                    "volumes": [{"name": "state",
                                 "persistentVolumeClaim": {"claimName": spec.state_claim}}],
                },
            },
        },
    }


def wait_for_study(storage: str, name: str, *, timeout_s: float = 900.0,
                   poll_s: float = 5.0) -> float:
    """Block until study ``name`` exists in ``storage`` with tuner's settings; seconds waited.

    Raises:
        ConfigError: the storage cannot be opened, or the study did not appear in time.
    """
    import optuna

    from tuner.tune import open_storage
    from tuner.tune.study_records import StudyRecords

    started = time.monotonic()
    store = open_storage(storage)
    while True:
        try:
            study = optuna.load_study(study_name=name, storage=store)
            if StudyRecords.config_attrs(study) is not None:  # written right after creation
                return time.monotonic() - started
        except KeyError:
            pass
        waited = time.monotonic() - started
        if waited >= timeout_s:
            raise ConfigError(f"study {name!r} did not appear within {timeout_s:.0f} s; is "
                              "the lead pod (index 0) running?")
        time.sleep(min(poll_s, max(0.0, timeout_s - waited)))
