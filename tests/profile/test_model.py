"""Profile files: round trip, atomic save, and bad profiles rejected with file + field."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from tests.profile.test_export import make_profile
from tuner.errors import ProfileError
from tuner.profile import load_profile, save_profile


def test_round_trip_and_atomic_save(tmp_path: pathlib.Path) -> None:
    prof = make_profile()
    path = save_profile(prof, tmp_path / "p.yaml")
    assert load_profile(path) == prof
    assert [p.name for p in tmp_path.iterdir()] == ["p.yaml"]  # no temp file left
    assert path.read_text().startswith("# tuner profile 'golden'")


def _write(tmp_path: pathlib.Path, mutate) -> pathlib.Path:  # type: ignore[no-untyped-def]
    data = make_profile().to_dict()
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _set(path: str, value: object):  # type: ignore[no-untyped-def]
    def mutate(data: dict) -> None:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return mutate


@pytest.mark.parametrize("mutate, message", [
    (_set("name", KeyError), "name: missing"),
    (_set("scheduler", KeyError), "scheduler: missing"),
    (_set("scheduler.max_num_seqs", 99999), "scheduler: max_num_batched_tokens .16384. must be"),
    (_set("scheduler.max_num_seqs", "many"), "scheduler.max_num_seqs: 'many' is not a int"),
    (_set("scheduler.watermark", 1.5), r"scheduler: watermark=1.5 must be in \[0, 1\)"),
    (_set("scheduler.max_tokens", 5), "scheduler.max_tokens: not a scheduler setting"),
    (_set("target.tp", 0), "target.tp: must be an integer >= 1"),
    (_set("target.hardware", KeyError), "target.hardware: missing"),
    (_set("target.vllm_versions", ["latest"]), "target.vllm_versions: must be a list of versions"),
    (_set("pareto", [{"settings": {"policy": "lifo"}}]), "pareto.0..settings: policy='lifo'"),
    (_set("predicted", {"train": {"tuned": {"p90_interactivity": [1]}}}),
     r"predicted.train.tuned.p90_interactivity: \[1\] is not a number"),
    (_set("profile_version", 99), "profile_version: 99 is newer"),
    (_set("extra", 1), "extra: unknown section"),
])
def test_bad_profiles_name_file_and_field(tmp_path: pathlib.Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    path = _write(tmp_path, mutate)
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(path)
    assert str(info.value).startswith(f"{path}: ")


def test_unreadable_and_not_yaml(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ProfileError, match="missing.yaml: profile not found"):
        load_profile(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ProfileError, match=r"bad.yaml:\d+: invalid YAML"):
        load_profile(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ProfileError, match="a profile is a YAML mapping"):
        load_profile(bad)
