"""``tuner`` command line: a thin Click shell over the library API.

Each command module (``tuner/cli/_<stage>.py``) parses options, calls one library
function, and formats the result; library errors (``TunerError``) become a one-line
``Error: ...`` with a non-zero exit. Command modules register themselves through
``register(group)`` so the stages stay independent.
"""

from __future__ import annotations

import importlib

import click

from tuner import __version__

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

#: Command modules, in data-flow order. Each defines ``register(cli: click.Group)``.
_COMMAND_MODULES = (
    "tuner.cli._trace",
    "tuner.cli._replay",
    "tuner.cli._tune",
    "tuner.cli._report",
    "tuner.cli._fidelity",
    "tuner.cli._serve",
    "tuner.cli._jobs",
)


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", prog_name="tuner")
def cli() -> None:
    """Tune vLLM's scheduler to your traffic by replaying your request logs.

    \b
    Typical flow:
      tuner ingest requests.log -o trace.parquet      # logs -> canonical trace
      tuner trace stats trace.parquet                  # what the traffic looks like
      tuner replay trace.parquet --hardware mi355x --model llama-3.1-70b --tp 8
      tuner tune trace.parquet --hardware mi355x --model llama-3.1-70b --tp 8 -o profiles/p.yaml
      tuner export profiles/p.yaml --format flags      # vllm serve flags

    \b
    Exit codes (every command):
      0    done
      1    a check or job step failed (export --check-vllm, schedule --install,
           retune: the run failed and the previous profile stays current)
      2    bad input: a one-line "Error: ..." naming the file, line and field or the
           option; nothing was written (also: a run too large for this machine)
      3    retune: kept the current profile      4  retune: another run holds the lock
      5    retune: published, but the --on-publish hook failed
      130  interrupted (Ctrl-C); 143 SIGTERM, 129 SIGHUP: temporary files removed
    """
    from tuner.cli._common import install_signal_cleanup
    from tuner.outputs import set_notifier

    set_notifier(_note_replaced)
    click.get_current_context().call_on_close(install_signal_cleanup())


def _note_replaced(message: str) -> None:
    """Every command says so when its output replaces an existing file."""
    click.echo(f"Note: {message}", err=True)


for _name in _COMMAND_MODULES:
    importlib.import_module(_name).register(cli)

from tuner.cli._common import harden_numeric_options  # noqa: E402

harden_numeric_options(cli)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="tuner")
