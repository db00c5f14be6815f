"""``tuner export --format plugin -o DIR``: the scheduler plugin as a folder vLLM can import.

Why a folder: the plugin has to load inside the vLLM server's own environment, which has
no polars, optuna or click, and this package is not on the package registry, so
``pip install`` of the tuner there is not an option. The plugin module itself needs only
vLLM and the standard library (checked by tests/vllm), so the bundle is a copy of it and
of the few standard-library-only ``tuner`` modules it imports, under ``DIR/tuner/``::

    DIR/tuner/__init__.py          (the package's own, version constants only)
    DIR/tuner/vllm_plugin.py       (CacheAwareScheduler, CacheAwareAsyncScheduler)
    DIR/tuner/<what it imports>.py (found by reading its imports, transitively)
    DIR/README.txt                 (the lines below, versions and checksums)

Then ``PYTHONPATH=DIR vllm serve MODEL --scheduler-cls tuner.vllm_plugin.CacheAwareScheduler
...``: the class name is the same as for an installed tuner, so every other export stays
valid. Files are written 0644 (a vLLM service running as another user must read them)
through :mod:`tuner.outputs`.
"""

from __future__ import annotations

import ast
import hashlib
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import tuner
from tuner.errors import ConfigError
from tuner.outputs import check_output_folder, write_text
from tuner.profile.export import flag_lines, plan_export
from tuner.profile.model import PROFILE_MODE, Profile

PACKAGE_DIR = Path(tuner.__file__).resolve().parent
PLUGIN_MODULE = "tuner.vllm_plugin"
#: The file that marks a folder as a plugin export's, so a later export may replace it.
PLUGIN_MARKER = ".tuner-plugin"

#: Third-party packages a bundled module may import: vLLM itself (and what vLLM brings).
_ALLOWED_THIRD_PARTY = ("vllm", "torch")


@dataclass
class PluginBundle:
    """What :func:`write_plugin_bundle` wrote and how to use it."""

    folder: Path
    files: list[Path] = field(default_factory=list)
    serve_args: list[str] = field(default_factory=list)

    def usage_lines(self) -> list[str]:
        """The exact shell lines: where Python finds the plugin, and the serve command."""
        args = " \\\n    ".join(flag_lines(self.serve_args))
        return [f"export PYTHONPATH={shlex.quote(str(self.folder))}${{PYTHONPATH:+:$PYTHONPATH}}",
                f"vllm serve MODEL \\\n    {args}"]


def plugin_modules() -> list[str]:
    """``tuner`` modules the plugin needs, the plugin first (a transitive import walk)."""
    order: list[str] = []
    pending = [PLUGIN_MODULE]
    while pending:
        name = pending.pop(0)
        if name in order:
            continue
        order.append(name)
        pending += [m for m in _tuner_imports(_module_path(name)) if m not in order]
    return order


def _module_path(name: str) -> Path:
    parts = name.split(".")[1:]
    path = PACKAGE_DIR.joinpath(*parts).with_suffix(".py")
    if not path.is_file():
        raise ConfigError(f"{name}: the plugin imports a tuner package or a missing module "
                          f"({path}); a bundle can hold single modules only")
    return path


def _tuner_imports(path: Path) -> list[str]:
    """``tuner.X`` modules ``path`` imports; refuses any third-party import but vLLM's."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "tuner":
                names = [f"tuner.{a.name}" for a in node.names]
            else:
                names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top == "tuner":
                if name != "tuner":
                    found.append(".".join(name.split(".")[:2]))
            elif top not in _ALLOWED_THIRD_PARTY and not _is_stdlib(top):
                raise ConfigError(f"{path.name} imports {name}, which a vLLM environment "
                                  "may lack; the plugin bundle must need only vLLM")
    return found


def _is_stdlib(top: str) -> bool:
    import sys

    return top in sys.stdlib_module_names or top == "__future__"


def write_plugin_bundle(profile: Profile, folder: str | os.PathLike[str], *,
                        vllm_version: str, async_scheduling: bool | None = None,
                        scheduler_cls: str | None = None) -> PluginBundle:
    """Write the plugin for ``profile`` into ``folder``: a new or empty one, or one an
    earlier plugin export wrote (its :data:`PLUGIN_MARKER`, written first); else refused."""
    out = check_output_folder(folder, PLUGIN_MARKER)
    plan = plan_export(profile, vllm_version=vllm_version, force_plugin=True,
                       async_scheduling=async_scheduling, scheduler_cls=scheduler_cls)
    bundle = PluginBundle(folder=out.resolve(), serve_args=plan.serve_args())
    sums: list[str] = []
    write_text(out / PLUGIN_MARKER, f"written by tuner {tuner.__version__} export --format "
               "plugin; a later export may replace the files in this folder\n",
               mode=PROFILE_MODE, announce=False)
    for name in ["tuner", *plugin_modules()]:
        src = PACKAGE_DIR / "__init__.py" if name == "tuner" else _module_path(name)
        rel = Path("tuner", src.name)
        text = src.read_text(encoding="utf-8")
        bundle.files.append(write_text(out / rel, text, mode=PROFILE_MODE))
        sums.append(f"  {hashlib.sha256(text.encode()).hexdigest()[:16]}  {rel}")
    readme = "\n".join([
        f"tuner {tuner.__version__} scheduler plugin for profile {profile.name!r}, "
        f"vLLM {vllm_version}.",
        "Needs only vLLM (0.32 or 0.33) and the Python standard library: copy or mount this",
        "folder where vLLM runs, then:",
        "",
        *bundle.usage_lines(),
        "",
        "MODEL is the model you serve; add your usual flags (--tensor-parallel-size, ...).",
        "Files (sha256 prefix):",
        *sums,
        "",
    ])
    bundle.files.append(write_text(out / "README.txt", readme, mode=PROFILE_MODE))
    return bundle
