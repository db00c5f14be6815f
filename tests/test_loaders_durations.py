"""The shared YAML/JSON loader (tuner/loaders.py) and duration grammar (tuner/durations.py)."""

from __future__ import annotations

import pathlib

import pytest

from tuner.durations import parse_duration
from tuner.errors import ConfigError, ProfileError
from tuner.loaders import load_json, load_yaml


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("90s", 90), ("250ms", 0.25), ("30m", 1800), ("1h30m", 5400), ("1.5h", 5400),
    ("2d", 172800), ("1w", 604800), ("1d 12h", 129600), (" 6H ", 21600), (120, 120),
])
def test_duration_grammar(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "", "1h30", "h", "-5", "0", "1x", "1h 30", True])
def test_duration_refusals_name_the_place(text: object) -> None:
    with pytest.raises(ConfigError, match=r"^retune.yaml:3: window: .* is not a"):
        parse_duration(text, "retune.yaml:3: window")


def test_zero_duration_only_where_allowed() -> None:
    assert parse_duration("0", allow_zero=True) == 0.0


def test_yaml_errors_share_one_form(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match=r"missing.yaml: search space not found$"):
        load_yaml(tmp_path / "missing.yaml", "search space")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: 1\nb: [\n")
    with pytest.raises(ProfileError, match=r"bad.yaml:\d+: invalid YAML: "):
        load_yaml(bad, "profile", error=ProfileError)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n")
    with pytest.raises(ConfigError, match=r"list.yaml: retune config must be a mapping"):
        load_yaml(listy, "retune config", mapping=True)
    with pytest.raises(ConfigError, match="cannot read hardware file: is a folder"):
        load_yaml(tmp_path, "hardware file")


def test_where_names_file_line_and_key(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("sources: [a]\n\ntarget:\n  hardware: h200\n  tp: 8\n")
    f = load_yaml(p, "config")
    assert f.where("target", "tp") == f"{p}:5: target.tp"
    assert f.where("sources") == f"{p}:1: sources"
    assert f.where("nope") == f"{p}: nope" and f.where() == str(p)


def test_json_errors(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "config.json"
    p.write_text('{"a": 1,\n "b": }')
    with pytest.raises(ConfigError, match=r"config.json:2: invalid JSON: "):
        load_json(p, "model config")
    p.write_text("[1]")
    assert load_json(p, "model config").data == [1]
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_json(p, "model config", mapping=True)


def test_retune_window_takes_the_cli_grammar(tmp_path: pathlib.Path) -> None:
    """``window: 1h30m`` failed in a retune config while ``--last 1h30m`` worked."""
    from tuner.jobs.config import load_config

    cfg = tmp_path / "retune.yaml"
    base = ("sources: ['logs/*.jsonl']\nstate_dir: s\nprofile: p\nprofiles_dir: profiles\n"
            "target: {hardware: mi355x, model: llama-3.1-8b}\n")
    cfg.write_text(base + "window: 1h30m\n")
    assert load_config(cfg).window_s == 5400
    cfg.write_text(base + "window: soon\n")
    with pytest.raises(ConfigError, match=r"retune.yaml:6: window: 'soon' is not a positive"):
        load_config(cfg)
