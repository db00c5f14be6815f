"""Where ``tuner export`` output goes: stdout, a file, or (``--format plugin -o DIR``) a
self-contained plugin folder with the lines that load it."""

from __future__ import annotations

from typing import Any

import click


def write_export(profile: Any, profile_path: str, fmt: str, output: str | None, *,
                 vllm_version: str, native_admission: bool,
                 async_scheduling: bool | None, scheduler_cls: str | None = None) -> None:
    """Print the export, or write it (checked and atomic, :mod:`tuner.outputs`)."""
    from tuner.outputs import write_text
    from tuner.profile import export_profile
    from tuner.profile.plugin_bundle import write_plugin_bundle

    if fmt == "plugin" and output is not None:
        bundle = write_plugin_bundle(profile, output, vllm_version=vllm_version,
                                     async_scheduling=async_scheduling,
                                     scheduler_cls=scheduler_cls)
        click.echo(f"# wrote the scheduler plugin for vLLM {vllm_version} to {bundle.folder} "
                   f"({len(bundle.files)} files, 0644; needs only vLLM)")
        click.echo("# on the vLLM host (or in its container, with the folder mounted):")
        for line in bundle.usage_lines():
            click.echo(line)
        return
    text = export_profile(profile, fmt, vllm_version=vllm_version,
                          native_admission=native_admission, async_scheduling=async_scheduling,
                          scheduler_cls=scheduler_cls)
    if output is None:
        click.echo(text, nl=False)
        return
    path = write_text(output, text, inputs=[profile_path], mode=0o644)
    click.echo(f"wrote {path}", err=True)
