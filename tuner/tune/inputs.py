"""Degenerate inputs: a study must not run 200 trials on nothing and call it a result.

Why: ``tune-log`` on a 4-request log used to replay 200 trials and recommend the
baseline without a word, and a replay that rejected half the trace (prompts longer
than ``max_model_len``) measured the other half in silence. These checks refuse what
cannot be ranked and say what distorts the numbers.
"""

from __future__ import annotations

from typing import Any

from tuner.errors import ConfigError
from tuner.metrics import kv_capacity_tokens, rejection_warning
from tuner.tune.space import SearchSpace

#: Fewest requests a window needs before settings can be ranked on it.
MIN_STAGE1_REQUESTS = 10
MIN_TRAIN_REQUESTS = 30
#: Fewer held-out requests than this make the held-out check a weak one (warned).
MIN_HOLDOUT_REQUESTS = 30


def check_window_sizes(evaluator: Any) -> list[str]:
    """Refuse windows too small to rank settings on; notes for a weak held-out window.

    Evaluators without ``window_counts`` (test doubles, custom backends) are not checked.

    Raises:
        ConfigError: the stage-1 or training window has too few requests.
    """
    counts = evaluator.window_counts() if hasattr(evaluator, "window_counts") else None
    if counts is None:
        return []
    total = counts["total"]
    if counts["train"] < MIN_TRAIN_REQUESTS or counts["stage1"] < MIN_STAGE1_REQUESTS:
        raise ConfigError(
            f"the trace has {total:,} request(s): the training window holds "
            f"{counts['train']:,} and stage 1 replays {counts['stage1']:,}; ranking settings "
            f"needs at least {MIN_TRAIN_REQUESTS} and {MIN_STAGE1_REQUESTS} (use a longer "
            "trace or log, or --stage1-fraction 1 / --holdout 0 to use more of it)")
    notes = []
    if evaluator.windows.has_holdout and counts["holdout"] < MIN_HOLDOUT_REQUESTS:
        notes.append(f"WARNING: the held-out window holds only {counts['holdout']:,} "
                     "request(s); its verdict is weak evidence")
    return notes


def input_warnings(baseline: Any, evaluator: Any) -> list[str]:
    """Notes printed before the result: rejected requests, a weak held-out window."""
    notes = []
    resolved = getattr(evaluator, "resolved", None)
    warn = rejection_warning(baseline.metrics, getattr(evaluator, "max_model_len", None),
                             kv_capacity_tokens=None if resolved is None
                             else kv_capacity_tokens(resolved.cache))
    n = baseline.metrics.get("num_requests") or 0
    if warn and n and (baseline.metrics.get("num_rejected") or 0) >= n:
        raise ConfigError(warn.removeprefix("WARNING: "))  # nothing was tuned
    if warn:
        notes.append(warn)
    return notes


def fixed_space(space: SearchSpace, fixed: dict[str, Any] | None) -> SearchSpace:
    """``space`` without the fields ``--set`` holds fixed (they are in the baseline)."""
    if not fixed:
        return space
    params = tuple(p for p in space.params if p.name not in fixed)
    if not params:
        raise ConfigError(f"--set fixes every field of space {space.name!r} "
                          f"({', '.join(space.names)}); nothing is left to search")
    return type(space)(name=space.name + "+fixed", params=params)
