"""Check an export against vLLM itself: build its ``SchedulerConfig`` and parse the flags
and the ``--config`` file with vLLM's own argument parser.

vLLM is usually not importable where tuner runs (it is a heavy GPU package), so
:func:`check_with_vllm` runs :data:`_CHECK_SCRIPT` (it needs only vLLM and the standard
library) in a subprocess: of this interpreter when ``import vllm`` works here, or of
another one (``python=".../vllm-env/bin/python"``); otherwise it returns
``status="skipped"`` with a note saying why. A subprocess keeps vLLM's import-time side
effects (torch, logging) out of tuner. It never raises for a failed check; the caller decides.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from dataclasses import dataclass
from typing import Any, Literal

from tuner.profile.export import parallel_mapping, plan_export, speculative_args
from tuner.profile.fleet_export import engine_args
from tuner.profile.model import Profile


def _vllm_script(imports: str, body: str) -> str:
    """A script run inside a vLLM environment (it needs only vLLM and the standard library):
    it reads a JSON payload on stdin and prints a JSON verdict. The shared head imports
    vLLM (``imports`` adds the script's own names) or prints a ``skipped`` verdict, and
    defines ``make_parser``, vLLM's own ``vllm serve`` parser."""
    return _SCRIPT_HEAD + imports + _SCRIPT_PARSER + body


_SCRIPT_HEAD = r'''
import contextlib, io, json, os, sys, tempfile
payload = json.load(sys.stdin)
out = {"errors": [], "checked": []}
try:
    import vllm
    out["vllm_version"] = getattr(vllm, "__version__", "?")
'''
_SCRIPT_PARSER = r'''    from vllm.engine.arg_utils import EngineArgs
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
except Exception as exc:  # noqa: BLE001
    out["skipped"] = f"vllm is not importable here: {type(exc).__name__}: {exc}"
    print(json.dumps(out)); sys.exit(0)

def make_parser():
    try:
        return EngineArgs.add_cli_args(FlexibleArgumentParser())
    except RuntimeError as exc:
        if "infer device type" not in str(exc):
            raise
        # A CUDA wheel on a GPU-less machine: argument defaults build a DeviceConfig, which
        # needs a platform. The flags do not depend on it, so parse on the CPU platform.
        import vllm.platforms as platforms
        from vllm.platforms.cpu import CpuPlatform
        platforms._current_platform = CpuPlatform()
        out["notes"] = ["parsed on vLLM's CPU platform (no GPU here)"]
        return EngineArgs.add_cli_args(FlexibleArgumentParser())
'''

#: Checks a profile's flags, config and kwargs (:func:`check_with_vllm`).
_CHECK_SCRIPT = _vllm_script(r'''    from vllm.config import SchedulerConfig
''', r'''
try:
    SchedulerConfig(max_model_len=payload["max_model_len"], is_encoder_decoder=False,
                    **payload["scheduler_kwargs"])
    out["checked"].append("SchedulerConfig(**kwargs)")
except Exception as exc:  # noqa: BLE001
    out["errors"].append(f"SchedulerConfig rejected the kwargs: {type(exc).__name__}: {exc}")

def parse(args, what):
    parser = make_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(args)
    except SystemExit:
        msg = err.getvalue().strip().splitlines()
        out["errors"].append(f"{what}: vLLM's parser refused it: {msg[-1] if msg else '?'}")
        return
    for attr, want in payload["expect"].items():
        got = getattr(ns, attr, "<missing>")
        if attr == "additional_config" and isinstance(got, str):
            got = json.loads(got)
        if got != want and not (isinstance(want, float) and isinstance(got, (int, float))
                                and abs(got - want) < 1e-12):
            out["errors"].append(f"{what}: {attr} parsed as {got!r}, expected {want!r}")
    out["checked"].append(what)

parse(payload["serve_args"], "vllm serve flags")
with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
    fh.write(payload["config_yaml"])
try:
    parse(["--config", fh.name], "vllm serve --config file")
finally:
    os.unlink(fh.name)
print(json.dumps(out))
''')


@dataclass(frozen=True, slots=True)
class VllmCheck:
    status: Literal["ok", "failed", "skipped"]
    vllm_version: str | None = None
    checked: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "vllm_version": self.vllm_version,
                "checked": list(self.checked), "errors": list(self.errors), "note": self.note}


def _payload(profile: Profile, *, vllm_version: str, native_admission: bool,
             max_model_len: int) -> dict[str, Any]:
    import yaml

    plan = plan_export(profile, vllm_version=vllm_version, native_admission=native_admission)
    expect: dict[str, Any] = {}
    for name, value in plan.native:
        expect["scheduling_policy" if name == "policy" else name] = value
    if plan.scheduler_cls is not None:
        expect["scheduler_cls"] = plan.scheduler_cls
    if plan.async_scheduling is False:
        expect["async_scheduling"] = False
    if plan.additional_config is not None:
        expect["additional_config"] = plan.additional_config
    serve_args, config = plan.serve_args(), plan.config_mapping()
    t = profile.target
    if t.is_multi_engine:
        # the per-engine layout goes through vLLM's parser too (its flag names)
        serve_args = engine_args(profile) + serve_args
        config = {**parallel_mapping(profile), **config}
        expect.update(tensor_parallel_size=t.tp, data_parallel_size=t.dp,
                      enable_expert_parallel=t.enable_expert_parallel)
    if t.speculative:  # vLLM's parser reads --speculative-config as a JSON object
        spec = dict(t.speculative["speculative_config"])
        serve_args = serve_args + speculative_args(profile)
        config = {**config, "speculative-config": spec}
        expect["speculative_config"] = spec
    return {
        "scheduler_kwargs": plan.scheduler_kwargs(),
        "serve_args": serve_args,
        "config_yaml": yaml.safe_dump(config, sort_keys=False),
        "expect": expect,
        "max_model_len": max_model_len,
    }


def check_with_vllm(profile: Profile, *, vllm_version: str = "0.33.0",
                    native_admission: bool = False, python: str | None = None,
                    max_model_len: int = 131072, timeout_s: float = 300.0) -> VllmCheck:
    """Validate ``profile``'s export for ``vllm_version`` with vLLM's own classes.

    Args:
        python: an interpreter of a vLLM environment; None = this process if ``vllm`` is
            importable, else the check is skipped.
        max_model_len: passed to ``SchedulerConfig`` (its validation depends on it).

    Returns:
        ``ok`` (SchedulerConfig built, flags and config file parsed to the same values),
        ``failed`` (``errors`` says what vLLM refused) or ``skipped`` (``note`` says why).
    """
    payload = json.dumps(_payload(profile, vllm_version=vllm_version,
                                  native_admission=native_admission, max_model_len=max_model_len))
    # A check the caller asked for with an interpreter must run: one that cannot is a
    # failure (``--check-vllm /nonexistent/python`` used to pass as "skipped").
    asked = python is not None
    if python is None:
        if importlib.util.find_spec("vllm") is None:
            return VllmCheck("skipped", note="vllm is not importable in this environment; "
                                             "pass python=<a vLLM env's interpreter> to check")
        import sys

        python = sys.executable
    verdict = _run_check_script(python, _CHECK_SCRIPT, payload, asked=asked,
                                timeout_s=timeout_s)
    if isinstance(verdict, VllmCheck):
        return verdict
    if "skipped" in verdict:
        if asked:
            return VllmCheck("failed", errors=(f"{python}: {verdict['skipped']}",))
        return VllmCheck("skipped", note=verdict["skipped"])
    errors = tuple(verdict.get("errors", ()))
    return VllmCheck("failed" if errors else "ok", vllm_version=verdict.get("vllm_version"),
                     checked=tuple(verdict.get("checked", ())), errors=errors,
                     note="; ".join(verdict.get("notes", ())))


def _run_check_script(python: str, script: str, payload: str, *, asked: bool,
                      timeout_s: float) -> "VllmCheck | dict[str, Any]":
    """Run a check script in ``python``; its JSON verdict, or the check's result when the
    script could not run (a failure if the caller asked for that interpreter, else a skip)
    or ended without a verdict (a failure)."""
    try:
        proc = subprocess.run([python, "-c", script], input=payload, text=True,
                              capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        if asked:
            return VllmCheck("failed", errors=(f"could not run {python}: {exc}",))
        return VllmCheck("skipped", note=f"could not run {python}: {exc}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return VllmCheck("failed", errors=(f"check script exited {proc.returncode}: {tail}",))
    return json.loads(lines[-1])


#: Runs inside a vLLM environment: parses each P/D server's flags with vLLM's parser and
#: builds its KVTransferConfig; checks the connector is one vLLM registers.
_PD_CHECK_SCRIPT = _vllm_script(r'''    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
''', r'''
registry = getattr(KVConnectorFactory, "_registry", {})
for server in payload["servers"]:
    what = server["name"]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = make_parser().parse_args(server["args"])
    except SystemExit:
        msg = err.getvalue().strip().splitlines()
        out["errors"].append(f"{what}: vLLM's parser refused it: {msg[-1] if msg else '?'}")
        continue
    got = ns.kv_transfer_config
    if isinstance(got, str):
        got = json.loads(got)
    if not isinstance(got, KVTransferConfig):
        try:
            got = KVTransferConfig(**got)
        except Exception as exc:  # noqa: BLE001
            out["errors"].append(f"{what}: KVTransferConfig refused it: {exc}")
            continue
    want = server["kv_transfer_config"]
    if got.kv_connector != want["kv_connector"] or got.kv_role != want["kv_role"]:
        out["errors"].append(f"{what}: parsed as {got.kv_connector}/{got.kv_role}")
    if got.kv_connector not in registry:
        out["errors"].append(f"{what}: vLLM registers no connector {got.kv_connector!r}")
    if ns.tensor_parallel_size != server["tp"]:
        out["errors"].append(f"{what}: tensor_parallel_size {ns.tensor_parallel_size}")
    out["checked"].append(what)
print(json.dumps(out))
''')


def check_pd_with_vllm(commands: Any, *, python: str | None = None,
                       timeout_s: float = 300.0) -> VllmCheck:
    """Parse each P/D server's flags (``tuner.profile.pd_export.PDServeCommand``) with
    vLLM's own parser and ``KVTransferConfig``; as :func:`check_with_vllm`, ``python``
    None = this interpreter if vLLM is importable, else skipped."""
    servers = [{"name": f"{c.role} {c.instance}", "args": list(c.args),
                "kv_transfer_config": c.kv_transfer_config,
                "tp": int(c.args[c.args.index("--tensor-parallel-size") + 1])}
               for c in commands]
    asked = python is not None
    if python is None:
        if importlib.util.find_spec("vllm") is None:
            return VllmCheck("skipped", note="vllm is not importable in this environment")
        import sys

        python = sys.executable
    verdict = _run_check_script(python, _PD_CHECK_SCRIPT, json.dumps({"servers": servers}),
                                asked=asked, timeout_s=timeout_s)
    if isinstance(verdict, VllmCheck):
        return verdict
    if "skipped" in verdict:
        return VllmCheck("failed" if asked else "skipped",
                         errors=(verdict["skipped"],) if asked else (),
                         note=verdict["skipped"])
    errors = tuple(verdict.get("errors", ()))
    return VllmCheck("failed" if errors else "ok", vllm_version=verdict.get("vllm_version"),
                     checked=tuple(verdict.get("checked", ())), errors=errors)
