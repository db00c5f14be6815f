"""``--speculative-config`` and ``--spec-acceptance``: speculative decoding on the commands
that model a deployment (docs/speculative-decoding.md).

The command gets one ``speculative`` parameter: a ``tuner.sim.spec_decode.SpecDecoding``
or None (off). The acceptance is ``--spec-acceptance`` (rates, a mean acceptance length,
or a vLLM server log / ``/metrics`` scrape, ``tuner.trace.spec_acceptance``), else the
config's own ``synthetic_acceptance_*``, else what the trace's metadata measured
(``tuner ingest --spec-metrics``), else the method's published default.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import click

from tuner.errors import ConfigError

SPEC_HELP = ("vLLM's --speculative-config JSON, e.g. '{\"method\": \"mtp\", "
             "\"num_speculative_tokens\": 3}' (methods: mtp, eagle, eagle3, ngram) "
             "[default: no speculative decoding].")
ACCEPTANCE_HELP = ("Per-position acceptance rates P(accepted >= i) (0.8,0.6,0.45), a mean "
                   "acceptance length (2.4), or a file: a vLLM server log (its 'SpecDecoding "
                   "metrics' lines, summed) or a /metrics scrape [default: the config's "
                   "synthetic_acceptance_*, else the trace's measured acceptance (ingest "
                   "--spec-metrics), else the method's published default (mtp only)].")


@dataclass(frozen=True)
class SpecFlags:
    """The flags as given; :meth:`build` (inside the command, so bad input is reported
    as a one-line error) makes the ``SpecDecoding``."""

    config: str | None = None  # --speculative-config JSON
    acceptance: str | None = None  # --spec-acceptance
    seed: int = 0  # --spec-seed

    def build(self, trace: Any = None) -> Any:
        """The ``SpecDecoding`` (None: off); ``trace`` (a path) may hold the measured
        acceptance in its metadata (``tuner ingest --spec-metrics``)."""
        return build_spec(self.config, self.acceptance, self.seed, trace=trace)


def spec_options(func):  # type: ignore[no-untyped-def]
    """Add the speculative-decoding flags; the command gets ``spec_flags``."""

    @functools.wraps(func)
    def with_spec(*args: Any, **kwargs: Any) -> Any:
        flags = SpecFlags(kwargs.pop("speculative_config"), kwargs.pop("spec_acceptance"),
                          kwargs.pop("spec_seed"))
        return func(*args, spec_flags=flags, **kwargs)

    opts = [
        click.option("--speculative-config", default=None, metavar="JSON", help=SPEC_HELP),
        click.option("--spec-acceptance", default=None, metavar="RATES|LENGTH|LOG",
                     help=ACCEPTANCE_HELP),
        click.option("--spec-seed", type=int, default=0, show_default=True,
                     help="Seed of the per-request, per-step acceptance draw."),
    ]
    for opt in reversed(opts):
        with_spec = opt(with_spec)
    return with_spec


def build_spec(config: str | None, acceptance: str | None, seed: int = 0, *,
               trace: Any = None) -> Any:
    """The ``SpecDecoding`` of the flags, or None; bad input is a one-line error.

    The acceptance, first given wins: ``--spec-acceptance`` (rates, a length, or a file:
    a server log or a /metrics scrape, ``tuner.trace.spec_acceptance``), the config's
    ``synthetic_acceptance_*``, the trace's measured one (its metadata), the method's
    published default."""
    from tuner.perf.spec_decode import default_acceptance
    from tuner.sim.spec_decode import from_vllm_config
    from tuner.trace.spec_acceptance import read_spec_acceptance, trace_spec_acceptance

    if config is None:
        if acceptance is not None:
            raise ConfigError("--spec-acceptance needs --speculative-config")
        return None
    if acceptance is not None and os.path.isfile(acceptance):
        acceptance = read_spec_acceptance([acceptance]).acceptance_text()
    spec = from_vllm_config(config, acceptance, seed=seed, default_rates=default_acceptance)
    synthetic = any(k in spec.vllm_config for k in ("synthetic_acceptance_rates",
                                                    "synthetic_acceptance_length"))
    if acceptance is None and not synthetic and trace is not None:
        measured = trace_spec_acceptance(trace)
        if measured is not None:
            spec = from_vllm_config(config, measured.acceptance_text(), seed=seed)
    return spec


def spec_lines(counters: dict[str, float], num_output_tokens: int) -> list[str]:
    """The summary's speculative-decoding lines (none when it was off)."""
    from tuner.sim.spec_decode import spec_summary

    s = spec_summary(counters, num_output_tokens)
    if not s:
        return []
    rates = ", ".join(f"{r:.3f}" for r in s["acceptance_per_position"])
    return [f"speculative decoding: {s['num_drafts']:,} drafts, {s['num_draft_tokens']:,} "
            f"draft tokens, {s['num_accepted_tokens']:,} accepted "
            f"({100 * s['draft_acceptance_rate']:.1f} %)",
            f"  mean acceptance length {s['mean_acceptance_length']:.2f}; per position "
            f"{rates}; {s['tokens_per_step']:.2f} output tokens per step"]
