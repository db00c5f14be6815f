"""The CPU KV tier in retune configs (issue 24 item 3): the target's own tier and the
searched one (``kv_offloading_sizes``, ``kv_offloading_policies``, ``host_memory_gb``),
checked at load with the file, line and key, passed to the tune, replayed per profile in
the evaluation and recorded in the profile and the changelog."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tests.jobs.conftest import BASE_CONFIG, Job
from tuner.cli import cli
from tuner.errors import ConfigError

TIER_TARGET = {**BASE_CONFIG["target"], "async_scheduling": False}
#: 4 GiB at 2 MiB per 8B block = 2,048 chunks of 16 tokens, beside 800 GPU blocks
SEARCH = {"kv_offloading_sizes": [0, 4], "kv_offloading_policies": ["lru", "arc"],
          "host_memory_gb": 64}


def _line_of(text: str, key: str) -> int:
    """1-based line of the first ``key:`` in ``text``."""
    return next(i for i, line in enumerate(text.splitlines(), 1)
                if line.lstrip().startswith(f"{key}:"))


def test_tier_keys_parse_into_the_config_and_the_target(job: Job) -> None:
    job.configure(target={**TIER_TARGET, "kv_offloading_size": 2,
                          "kv_offloading_eviction_policy": "arc"},
                  kv_offloading_sizes="0,2,8", host_memory_gb=64)
    cfg = job.config()
    assert cfg.kv_offloading_sizes == (0.0, 2.0, 8.0)
    assert cfg.kv_offloading_policies is None and cfg.host_memory_gb == 64.0
    target = cfg.make_target()
    assert (target.kv_offloading_size, target.kv_offloading_eviction_policy) == (2.0, "arc")


@pytest.mark.parametrize("changes, key, message", [
    ({"target": {**TIER_TARGET, "kv_offloading_size": -1}}, "kv_offloading_size",
     "target.kv_offloading_size: GiB of host memory for the CPU KV tier, a number > 0 (omit "
     "it for no tier), got -1"),
    ({"target": {**TIER_TARGET, "kv_offloading_size": True}}, "kv_offloading_size",
     "target.kv_offloading_size: GiB of host memory for the CPU KV tier, a number > 0 (omit "
     "it for no tier), got True"),
    ({"target": {**TIER_TARGET, "kv_offloading_size": 4, "kv_offloading_backend": "disk"}},
     "kv_offloading_backend", "target.kv_offloading_backend: must be native or lmcache, got "
     "'disk'"),
    ({"target": {**TIER_TARGET, "kv_offloading_size": 4,
                 "kv_offloading_eviction_policy": "fifo"}},
     "kv_offloading_eviction_policy", "target.kv_offloading_eviction_policy: must be lru or "
     "arc, got 'fifo'"),
    ({"target": {**TIER_TARGET, "kv_offloading_size": 4,
                 "kv_offloading_blocks_per_chunk": 0}},
     "kv_offloading_blocks_per_chunk", "target.kv_offloading_blocks_per_chunk: GPU blocks "
     "per CPU chunk, an integer >= 1, got 0"),
    ({"target": {**TIER_TARGET, "kv_offloading_eviction_policy": "arc"}},
     "kv_offloading_eviction_policy", "target.kv_offloading_eviction_policy: needs a tier: "
     "target.kv_offloading_size or kv_offloading_sizes"),
    ({"kv_offloading_sizes": [0, "big"], "host_memory_gb": 64}, "kv_offloading_sizes",
     "kv_offloading_sizes: GiB per engine to search, numbers >= 0 (0 = no tier) like [0, "
     "512, 2048], got [0, 'big']"),
    ({"kv_offloading_sizes": [4, 4], "host_memory_gb": 64}, "kv_offloading_sizes",
     "kv_offloading_sizes: distinct GiB >= 0 (0 = no tier), got [4, 4]"),
    ({"kv_offloading_sizes": [0], "host_memory_gb": 64}, "kv_offloading_sizes",
     "kv_offloading_sizes: only 'no tier' is no search; drop the key"),
    ({"kv_offloading_sizes": [0, 128], "host_memory_gb": 64}, "kv_offloading_sizes",
     "kv_offloading_sizes: 128 GiB is above the host budget of 8 GiB per engine (64 GiB per "
     "node [host_memory_gb] over 8 engine(s) of TP1); lower the size or raise "
     "host_memory_gb"),
    ({"kv_offloading_sizes": [0, 4]}, "kv_offloading_sizes",
     "kv_offloading_sizes: hardware mi355x states no host memory per node; add "
     "host_memory_gb (GiB per node)"),
    ({"kv_offloading_sizes": [0, 4], "host_memory_gb": 0}, "host_memory_gb",
     "host_memory_gb: host memory per node in GiB, a number > 0, got 0"),
    ({"host_memory_gb": 64}, "host_memory_gb",
     "host_memory_gb: bounds the searched tier sizes; add kv_offloading_sizes or drop "
     "host_memory_gb"),
    ({"kv_offloading_policies": ["lru"]}, "kv_offloading_policies",
     "kv_offloading_policies: needs a tier: target.kv_offloading_size or kv_offloading_sizes"),
    ({"kv_offloading_sizes": [0, 4], "host_memory_gb": 64,
      "kv_offloading_policies": "lru,mru"}, "kv_offloading_policies",
     "kv_offloading_policies: distinct values of lru, arc, got 'lru,mru'"),
    ({"kv_offloading_sizes": [0, 4], "host_memory_gb": 64,
      "target": {**TIER_TARGET, "dp": 2}}, "kv_offloading_sizes",
     "kv_offloading_sizes: the CPU KV tier is modelled for one engine; target.dp is 2"),
    ({"target": {**TIER_TARGET, "kv_offloading_size": 4},
      "speculative": {"config": {"method": "ngram", "num_speculative_tokens": 2,
                                 "prompt_lookup_max": 3}, "acceptance": 0.8}},
     "kv_offloading_size", "target.kv_offloading_size: speculative decoding with a CPU KV "
     "tier is not modelled; drop one of them"),
])
def test_a_bad_tier_key_is_one_line_naming_file_line_and_key(
        job: Job, changes: dict[str, Any], key: str, message: str) -> None:
    job.configure(**changes)
    text = job.config_path.read_text()
    with pytest.raises(ConfigError) as err:
        job.config()
    assert str(err.value) == f"{job.config_path}:{_line_of(text, key)}: {message}"


def test_the_cli_refuses_a_bad_tier_key_with_exit_2_and_writes_nothing(job: Job) -> None:
    job.append(job.lines[:60])
    job.configure(kv_offloading_sizes=[0, 128], host_memory_gb=64)
    res = job.run_cli()
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith(f"Error: {job.config_path}:")
    assert "kv_offloading_sizes: 128 GiB is above the host budget of 8 GiB per engine" \
        in res.stderr
    assert "Traceback" not in res.stderr
    assert not (job.root / "state").exists() and not (job.root / "profiles").exists()


def _entry_tier(entry: dict[str, Any]) -> dict[str, Any]:
    return entry["tune"]["kv_tier"]


@pytest.mark.slow
def test_a_retune_searches_the_tier_and_records_it(job: Job) -> None:
    """End to end on the job's 300 requests (800 GPU blocks, KV-bound): the tune searches
    0 / 4 GiB under LRU and ARC, the evaluation replays the candidate on the tier its
    profile deploys, and the profile, the changelog and ``profile diff`` record it."""
    job.append(job.lines[:200])
    job.configure(target=TIER_TARGET, space="admission", trials=4, margin=-1.0, **SEARCH)
    out = job.run()
    assert out.decision == "published" and out.version == 1
    tier = _entry_tier(out.entry)
    assert (tier["sizes"], tier["policies"], tier["host_memory_gb"]) == ([0.0, 4.0],
                                                                        ["lru", "arc"], 64.0)
    assert tier["gain"] is not None and tier["gain_line"].startswith("CPU KV tier (4 GiB")
    assert set(tier["gain"]["with_tier"]) >= {"kv_hit_rate", "ttft_p90_s"}
    rec = out.entry["tune"]["recommended"]
    size = float(rec["deployment"]["kv_offloading_size"])
    assert size in (0.0, 4.0)
    from tuner.profile import load_profile

    profile = load_profile(out.profile_path)
    assert profile.target.kv_offloading_size == (size or None)
    if size:
        assert profile.target.kv_offloading_eviction_policy == \
            rec["deployment"]["kv_offloading_eviction_policy"]
    ev = out.entry["evaluation"]
    if size:
        assert ev["kv_offloading"]["candidate"]["size"] == size
        assert ev["kv_offloading"]["current"]["size"] is None  # vLLM's defaults, no tier
    logged = job.history().changelog()[-1]
    assert _entry_tier(logged) == json.loads(json.dumps(tier))


def test_the_evaluation_replays_each_profile_on_its_own_tier(job: Job) -> None:
    """The current profile's tier, not the config's, for the current side; the
    candidate's for the candidate (the decision would otherwise compare both on one)."""
    from tuner.jobs.kv_tier import profile_target, tier_of
    from tuner.perf.target import Target

    job.append(job.lines[:120])
    job.configure(target=TIER_TARGET, trials=1, margin=-1.0)
    out = job.run()
    from tuner.profile import load_profile

    profile = load_profile(out.profile_path)
    tiered = dataclasses.replace(profile, target=dataclasses.replace(
        profile.target, kv_offloading_size=4.0, kv_offloading_eviction_policy="arc"))
    base = Target(hardware="mi355x", model="llama-3.1-8b")
    assert profile_target(None, base) is base
    assert tier_of(profile_target(tiered, base))["size"] == 4.0
    assert profile_target(tiered, base).kv_offloading_eviction_policy == "arc"
    assert profile_target(profile, dataclasses.replace(base, kv_offloading_size=8.0)
                          ).kv_offloading_size == profile.target.kv_offloading_size


def test_profile_diff_shows_the_tier(job: Job, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tuner.jobs import diff_profiles
    from tuner.profile import load_profile, save_profile

    job.append(job.lines[:120])
    job.configure(target=TIER_TARGET, trials=1, margin=-1.0)
    out = job.run()
    plain = load_profile(out.profile_path)
    tiered = dataclasses.replace(plain, target=dataclasses.replace(
        plain.target, kv_offloading_size=4.0))
    save_profile(tiered, tmp_path / "tiered.yaml")
    rows = {r["key"]: r for r in diff_profiles(plain, tiered)["settings"]}
    assert rows["target.kv_offloading_size"]["changed"]
    assert (rows["target.kv_offloading_size"]["a"], rows["target.kv_offloading_size"]["b"]) \
        == (None, 4.0)
    assert not any(k.startswith("target.") for k in
                   (r["key"] for r in diff_profiles(plain, plain)["settings"]))
    res = CliRunner().invoke(cli, ["profile", "diff", str(out.profile_path),
                                   str(tmp_path / "tiered.yaml")], catch_exceptions=False)
    assert res.exit_code == 0 and "target.kv_offloading_size" in res.output


def test_a_warm_start_from_a_tiered_profile_lands_on_its_tier(job: Job) -> None:
    """A second run warm-starts from the current profile: with the tier searched, its
    point carries the profile's size (without it the point lay outside the space)."""
    from tuner.profile import load_profile, warm_start_of

    job.append(job.lines[:120])
    job.configure(target=TIER_TARGET, trials=1, margin=-1.0)
    out = job.run()
    profile = load_profile(out.profile_path)
    tiered = dataclasses.replace(profile, target=dataclasses.replace(
        profile.target, kv_offloading_size=4.0, kv_offloading_eviction_policy="arc"))
    own = warm_start_of(tiered).points[0].deployment
    assert (own.kv_offloading_size, own.kv_offloading_eviction_policy) == (4.0, "arc")
    none = warm_start_of(profile).points[0].deployment
    assert (none.kv_offloading_size, none.kv_offloading_eviction_policy) == (0.0, None)


def test_the_tier_keys_are_documented() -> None:
    import pathlib

    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "retune.md").read_text()
    for key in ("kv_offloading_sizes", "kv_offloading_policies", "host_memory_gb",
                "kv_offloading_size", "kv_offloading_eviction_policy",
                "kv_offloading_backend", "kv_offloading_blocks_per_chunk"):
        assert key in doc, key


def test_a_tierless_config_writes_the_same_yaml_as_before(job: Job) -> None:
    """No tier key: no ``kv_tier`` in the changelog, no tier in the evaluation or the
    profile (a guard that the tier adds nothing to configs without one; it passes on the
    code before the tier keys too)."""
    job.append(job.lines[:60])
    job.configure(trials=1, margin=-1.0)
    out = job.run()
    assert "kv_tier" not in out.entry["tune"]
    assert "kv_offloading" not in out.entry["evaluation"]
    assert "kv_offloading_size" not in yaml.safe_load(open(out.profile_path))["target"]
