"""Run ``tuner retune`` periodically: a crontab line, systemd user units, or a CronJob.

The period is given either as ``every`` (``30m``, ``6h``, ``1d``: it must divide the next
unit so cron can express it) or as a 5-field cron expression. Both are turned into a cron
expression (cron, Kubernetes) and a systemd ``OnCalendar=`` value.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Literal

import yaml

from tuner.errors import ConfigError
from tuner.outputs import write_text

Target = Literal["cron", "systemd", "kubernetes"]
MARK = "# tuner-retune:"
_MACROS = {"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
           "@weekly": "0 0 * * 0", "@monthly": "0 0 1 * *"}
_DOW = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
_FIELD_RE = re.compile(r"^(\*|\d+(-\d+)?)(/\d+)?(,(\*|\d+(-\d+)?)(/\d+)?)*$")
_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


def every_to_cron(every: str) -> str:
    """``30m`` -> ``*/30 * * * *``; ``6h`` -> ``0 */6 * * *``; ``1d`` -> ``0 0 * * *``."""
    m = re.fullmatch(r"\s*(\d+)\s*([mhd])\s*", every)
    if not m or int(m.group(1)) == 0:
        raise ConfigError(f"--every {every!r}: use N followed by m, h or d (e.g. 6h)")
    n, unit = int(m.group(1)), m.group(2)
    limit = {"m": 60, "h": 24, "d": 1}[unit]
    if unit == "d":
        if n != 1:
            raise ConfigError(f"--every {every!r}: cron cannot run every {n} days evenly; "
                              "use 1d or --cron")
        return "0 0 * * *"
    if limit % n:
        raise ConfigError(f"--every {every!r}: {n} does not divide {limit}; cron would "
                          f"drift at the {'hour' if unit == 'm' else 'day'} boundary; use --cron")
    step = "*" if n == 1 else f"*/{n}"
    return f"{step} * * * *" if unit == "m" else f"0 {step} * * *"


def check_cron(expr: str) -> str:
    """Validate a 5-field expression (macros expanded); return it normalised."""
    expr = _MACROS.get(expr.strip(), expr.strip())
    fields = expr.split()
    if len(fields) != 5:
        raise ConfigError(f"--cron {expr!r}: expected 5 fields (min hour dom month dow)")
    for text, (lo, hi), name in zip(fields, _RANGES, ("minute", "hour", "day-of-month",
                                                      "month", "day-of-week")):
        if not _FIELD_RE.match(text):
            raise ConfigError(f"--cron {expr!r}: {name} field {text!r} is not supported "
                              "(use numbers, *, ranges a-b, steps /n and lists)")
        for num in re.findall(r"(?<![/\d])\d+", text):
            if not lo <= int(num) <= hi:
                raise ConfigError(f"--cron {expr!r}: {name} {num} outside {lo}..{hi}")
    return " ".join(fields)


def _calendar_field(text: str, width: int) -> str:
    """One cron field as systemd calendar syntax (``*/6`` -> ``00/6``, ``1-5`` -> ``01..05``)."""
    parts = []
    for item in text.split(","):
        base, _, step = item.partition("/")
        if base == "*":
            base = "0" * width if step else "*"
        elif "-" in base:
            a, b = base.split("-")
            base = f"{int(a):0{width}d}..{int(b):0{width}d}"
        else:
            base = f"{int(base):0{width}d}"
        parts.append(f"{base}/{step}" if step else base)
    return ",".join(parts)


def cron_to_oncalendar(expr: str) -> str:
    """A cron expression as ``OnCalendar=``: ``[DOW ]*-MM-DD HH:MM:00``."""
    minute, hour, dom, month, dow = check_cron(expr).split()
    when = (f"*-{_calendar_field(month, 2)}-{_calendar_field(dom, 2)} "
            f"{_calendar_field(hour, 2)}:{_calendar_field(minute, 2)}:00")
    if dow == "*":
        return when
    days = []
    for item in dow.split(","):
        if "/" in item:
            raise ConfigError(f"--cron {expr!r}: day-of-week steps have no systemd form")
        if "-" in item:
            a, b = (int(x) for x in item.split("-"))
            days.append(f"{_DOW[a]}..{_DOW[b]}")
        elif item == "*":
            days.append("Mon..Sun")
        else:
            days.append(_DOW[int(item)])
    return f"{','.join(days)} {when}"


#: A Kubernetes object name that is also a valid systemd unit and crontab marker: a
#: DNS-1123 label (lowercase letters, digits, inner hyphens), at most 52 characters, the
#: CronJob limit (Kubernetes appends an 11-character suffix to each Job it creates).
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_LEN = 52
#: A DNS-1123 subdomain (PersistentVolumeClaim names).
_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: A container image reference: registry/path:tag@digest characters only.
_IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
#: Characters systemd leaves alone in an ExecStart word (anything else is quoted).
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_./:=@+,-]+$")


def check_job_name(name: str) -> str:
    """``name`` if every target accepts it as is, else a ConfigError saying what is wrong.

    The name becomes a crontab marker, a systemd unit file name and a Kubernetes object
    name, so it follows the strictest of the three (a DNS-1123 label). Checked, not
    quoted: a newline in it once added a crontab line of the caller's choosing.
    """
    if not name or len(name) > MAX_NAME_LEN or not _NAME_RE.match(name):
        raise ConfigError(f"--name {name!r}: use 1-{MAX_NAME_LEN} lowercase letters, digits "
                          "and inner hyphens (a Kubernetes DNS-1123 label, also a valid "
                          "systemd unit and crontab marker), e.g. tuner-retune")
    return name


def _check_text(option: str, value: str) -> None:
    """No control characters (newline, tab, NUL...) in anything written into a job file."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(f"{option} {value!r}: contains a control character (newline, tab, "
                          "...); a job file cannot hold it safely")


def check_kubernetes_names(*, image: str, state_claim: str, secret: str | None = None) -> None:
    """The image reference and the object names a manifest refers to (``tuner schedule``
    and ``tuner cluster job``): refused here, not by the API server."""
    if not _IMAGE_RE.match(image) or len(image) > 1024:
        raise ConfigError(f"--image {image!r}: not a container image reference "
                          "(e.g. registry.example.com/tuner:1.2)")
    for option, value in (("--state-claim", state_claim), ("--password-secret", secret)):
        if value is not None and (len(value) > 253 or not _SUBDOMAIN_RE.match(value)):
            raise ConfigError(f"{option} {value!r}: not a Kubernetes name "
                              "(lowercase letters, digits, '-' and '.')")


def check_spec(spec: "ScheduleSpec") -> None:
    """Refuse every field that a target would read as something else."""
    check_job_name(spec.name)
    check_kubernetes_names(image=spec.image, state_claim=spec.state_claim)
    _check_text("--tuner-bin", spec.tuner)
    _check_text("--config", str(spec.config))


def cron_escape(text: str) -> str:
    """``%`` is a newline to cron unless escaped (crontab(5)); cron drops the backslash."""
    return text.replace("%", "\\%")


def systemd_word(arg: str) -> str:
    """One ExecStart argument, quoted for systemd.exec(5): ``%`` and ``$`` are doubled (a
    specifier and a variable otherwise), anything unusual double-quoted and escaped."""
    if not _PLAIN_WORD.match(arg):
        arg = '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return arg.replace("%", "%%").replace("$", "$$")


def systemd_value(text: str) -> str:
    """A unit-file value that is not a command line: only specifiers need escaping."""
    return text.replace("%", "%%")


@dataclass(frozen=True)
class ScheduleSpec:
    """What to run and when."""

    cron: str  # normalised 5-field expression
    config: pathlib.Path  # retune.yaml (absolute)
    tuner: str = "tuner"  # the tuner executable
    name: str = "tuner-retune"
    image: str = "tuner:latest"  # kubernetes only
    state_claim: str = "tuner-state"  # PVC holding state and profiles (kubernetes)

    @property
    def command(self) -> list[str]:
        return [self.tuner, "retune", "--config", str(self.config)]


def make_spec(*, every: str | None, cron: str | None, config: str | os.PathLike[str],
              **kw: str) -> ScheduleSpec:
    if (every is None) == (cron is None):
        raise ConfigError("give exactly one of --every or --cron")
    expr = every_to_cron(every) if every is not None else check_cron(cron or "")
    spec = ScheduleSpec(cron=expr, config=pathlib.Path(config).resolve(), **kw)
    check_spec(spec)
    return spec


def crontab_line(spec: ScheduleSpec) -> str:
    """One crontab line: shell-quoted words, ``%`` escaped for cron, the marker last."""
    cmd = " ".join(shlex.quote(c) for c in spec.command)
    log = shlex.quote(str(spec.config.parent / "retune.log"))
    return cron_escape(f"{spec.cron} {cmd} >> {log} 2>&1 ") + f"{MARK}{spec.name}"


def systemd_units(spec: ScheduleSpec) -> dict[str, str]:
    """``{name.service: ..., name.timer: ...}`` for ``systemctl --user``."""
    cmd = " ".join(systemd_word(c) for c in spec.command)
    service = (
        "[Unit]\n"
        "Description=tuner: re-tune the vLLM scheduler profile "
        f"({systemd_value(spec.config.name)})\n"
        "After=network-online.target\n\n"
        "[Service]\n"
        "Type=oneshot\n"
        f"WorkingDirectory={systemd_value(str(spec.config.parent))}\n"
        f"ExecStart={cmd}\n"
        "# 0 published, 3 kept: both are success for systemd; 4 = another run held the lock\n"
        "SuccessExitStatus=3 4\n"
        "Nice=10\n")
    timer = (
        "[Unit]\n"
        f"Description=tuner: periodic re-tune ({spec.cron})\n\n"
        "[Timer]\n"
        f"OnCalendar={cron_to_oncalendar(spec.cron)}\n"
        "Persistent=true\n"
        "RandomizedDelaySec=60\n"
        f"Unit={spec.name}.service\n\n"
        "[Install]\n"
        "WantedBy=timers.target\n")
    return {f"{spec.name}.service": service, f"{spec.name}.timer": timer}


def cronjob_manifest(spec: ScheduleSpec) -> dict:
    """A ``batch/v1`` CronJob: one run at a time, state and profiles on a volume."""
    mount = "/var/lib/tuner"
    config_in_pod = f"{mount}/{spec.config.name}"
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": spec.name, "labels": {"app.kubernetes.io/name": "tuner"}},
        "spec": {
            "schedule": spec.cron,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 600,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {"spec": {
                "backoffLimit": 0,
                "template": {"spec": {
                    "restartPolicy": "Never",
                    # The image's user (Dockerfile); fsGroup makes the volume writable.
                    "securityContext": {"runAsUser": 1000, "runAsGroup": 1000,
                                        "fsGroup": 1000},
                    "containers": [{
                        "name": "retune",
                        "image": spec.image,
                        # 3 (kept) and 4 (locked) are normal outcomes: map them to 0
                        # so the Job does not count as failed (0 published, else failed).
                        # Kubernetes expands $(VAR) in a command: $$ keeps a literal $.
                        "command": ["/bin/sh", "-c", f"tuner retune --config "
                                    f"{shlex.quote(config_in_pod).replace('$', '$$')}; rc=$?; "
                                    "[ $rc -eq 3 ] || [ $rc -eq 4 ] && exit 0; exit $rc"],
                        "resources": {"requests": {"cpu": "2", "memory": "4Gi"},
                                      "limits": {"memory": "8Gi"}},
                        "volumeMounts": [{"name": "state", "mountPath": mount}],
                    }],
                    "volumes": [{"name": "state",
                                 "persistentVolumeClaim": {"claimName": spec.state_claim}}],
                }},
            }},
        },
    }


def render(spec: ScheduleSpec, target: Target) -> dict[str, str]:
    """File name -> content for ``target``."""
    if target == "cron":
        return {f"{spec.name}.crontab": crontab_line(spec) + "\n"}
    if target == "systemd":
        return systemd_units(spec)
    if target == "kubernetes":
        return {f"{spec.name}.cronjob.yaml": yaml.safe_dump(cronjob_manifest(spec),
                                                            sort_keys=False)}
    raise ConfigError(f"--target {target!r}: use cron, systemd or kubernetes")


def merge_crontab(existing: str, line: str, name: str) -> str:
    """``existing`` with our marked line replaced or added (idempotent)."""
    kept = [ln for ln in existing.splitlines() if not ln.rstrip().endswith(f"{MARK}{name}")]
    return "\n".join(kept + [line]) + "\n"


@dataclass
class InstallResult:
    """What ``--install`` did: lines to print, and whether it all worked.

    ``ok`` False means the job is *not* scheduled; the messages then carry what to do by
    hand (the crontab line itself, the systemctl commands), so nothing is lost.
    """

    messages: list[str] = field(default_factory=list)
    ok: bool = True

    def fail(self, message: str) -> "InstallResult":
        self.messages.append(message)
        self.ok = False
        return self


def install(spec: ScheduleSpec, target: Target, files: dict[str, str], *,
            manifest_dir: pathlib.Path | None = None) -> InstallResult:
    """Install for the current user (Kubernetes: write the manifest to apply).

    ``manifest_dir``: where the Kubernetes manifest goes when ``-o`` gave no folder
    (default: the config's folder), so the file ``kubectl apply -f`` is told exists.
    """
    if target == "kubernetes":
        folder = manifest_dir or spec.config.parent
        done = InstallResult()
        for fname, text in files.items():
            path = folder / fname
            if not (path.is_file() and path.read_text() == text):  # -o may have written it
                path = write_text(path, text, inputs=[spec.config])
            done.messages.append(f"kubernetes: wrote {path}; apply it with "
                                 f"`kubectl apply -f {shlex.quote(str(path))}`")
        return done
    if target == "cron":
        return _install_cron(spec)
    return _install_systemd(spec, files)


def _install_cron(spec: ScheduleSpec) -> InstallResult:
    line = crontab_line(spec)
    by_hand = f"cron: add this line by hand (`crontab -e`):\n{line}"
    if shutil.which("crontab") is None:
        return InstallResult().fail("cron: `crontab` is not installed here; " + by_hand)
    cur = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    if cur.returncode == 0:
        existing = cur.stdout
    elif "no crontab" in cur.stderr.lower():
        existing = ""
    else:
        # Installing over a crontab that could not be read would erase the user's entries.
        why = cur.stderr.strip() or f"exit {cur.returncode}"
        return InstallResult().fail(f"cron: `crontab -l` failed ({why}); not touching the "
                                    "crontab; " + by_hand)
    merged = merge_crontab(existing, line, spec.name)
    if merged == existing:
        return InstallResult(["cron: the entry is already installed (unchanged)"])
    done = subprocess.run(["crontab", "-"], input=merged, capture_output=True, text=True)
    if done.returncode != 0:
        return InstallResult().fail(f"cron: `crontab -` failed "
                                    f"({done.stderr.strip() or done.returncode}); " + by_hand)
    return InstallResult([f"cron: installed the entry marked {MARK}{spec.name}"])


def _install_systemd(spec: ScheduleSpec, files: dict[str, str]) -> InstallResult:
    unit_dir = pathlib.Path(os.environ.get("XDG_CONFIG_HOME", "~/.config")).expanduser() \
        / "systemd" / "user"
    result = InstallResult()
    for fname, text in files.items():
        path = write_text(unit_dir / fname, text)
        result.messages.append(f"systemd: wrote {path}")
    commands = (["daemon-reload"], ["enable", "--now", f"{spec.name}.timer"])
    by_hand = "; run " + " && ".join(f"`systemctl --user {' '.join(a)}`" for a in commands)
    if shutil.which("systemctl") is None:
        return result.fail("systemd: `systemctl` not found, the timer is not enabled" + by_hand
                           + " where it is")
    for args in commands:
        done = subprocess.run(["systemctl", "--user", *args], capture_output=True, text=True)
        if done.returncode != 0:
            return result.fail(f"systemd: `systemctl --user {' '.join(args)}` failed "
                               f"({done.stderr.strip() or done.returncode}), the timer is not "
                               "enabled" + by_hand)
        result.messages.append(f"systemd: systemctl --user {' '.join(args)}")
    return result
