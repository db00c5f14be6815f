"""Hugging Face ids of the bundled presets and configs resolve on the base install.

Each test here runs with aiconfigurator-core made absent in this process (``find_spec``
finds nothing and a ``sys.meta_path`` finder refuses the import), so it checks the base
install even where CI has the extra: without the bundled lookup, every id below would need
the extra and fail.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.errors import ConfigError
from tuner.perf.models import (BUNDLED_CONFIG_DIR, PRESET_DIR, PRESET_HUB_IDS, list_models,
                               load_model)

AIC = "aiconfigurator_core"


class _RefuseAic(importlib.abc.MetaPathFinder):
    """Makes ``aiconfigurator_core`` look absent, as on ``pip install -e .``."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 - importlib's protocol
        if name == AIC or name.startswith(AIC + "."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
        return None


@pytest.fixture(autouse=True)
def no_aic(monkeypatch: pytest.MonkeyPatch) -> None:
    for mod in [m for m in sys.modules if m == AIC or m.startswith(AIC + ".")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(sys, "meta_path", [_RefuseAic(), *sys.meta_path])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        None if name == AIC or name.startswith(AIC + ".") else real(name, *a)))
    assert importlib.util.find_spec(AIC) is None
    with pytest.raises(ModuleNotFoundError):
        __import__(AIC)


def _shape(spec) -> dict:  # noqa: ANN001
    """Every field but the name: the numbers a replay prices."""
    return {f: getattr(spec, f) for f in spec.__slots__ if f != "name"}


@pytest.mark.parametrize("preset", sorted(PRESET_HUB_IDS))
def test_every_hub_id_of_a_preset_is_that_preset(preset: str) -> None:
    want = _shape(load_model(preset))
    for hub_id in PRESET_HUB_IDS[preset]:
        for typed in (hub_id, hub_id.lower()):
            got = load_model(typed)
            assert got.name == typed  # profiles and export keep the id the user typed
            assert _shape(got) == want, typed


def test_every_preset_has_hub_ids_and_the_table_names_only_presets() -> None:
    assert sorted(PRESET_HUB_IDS) == list_models()


def test_every_bundled_config_resolves_by_its_hub_id() -> None:
    files = sorted(BUNDLED_CONFIG_DIR.glob("*.json"))
    assert files
    for path in files:
        hub_id = path.stem.replace("--", "/", 1)
        spec = load_model(hub_id)
        assert spec.name == hub_id
        assert spec.num_layers == json.loads(path.read_text()).get(
            "num_hidden_layers", spec.num_layers)


def test_the_ids_export_prints_for_the_presets_resolve() -> None:
    from tuner.profile.export import serve_model

    for preset in list_models():
        assert _shape(load_model(serve_model(preset))) == _shape(load_model(preset))


def test_an_id_nothing_bundles_still_names_the_extra() -> None:
    with pytest.raises(ConfigError, match=r"is a Hugging Face id; .*pip install -e '\.\[aic\]'"
                                          r".*never downloads") as err:
        load_model("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    assert "\n" not in str(err.value)


def test_replay_takes_the_hub_id_a_user_types(tmp_path: Path) -> None:
    from tuner.cli import cli
    from tuner.trace import TraceMetadata, TraceRequest, write_trace

    shared = tuple(range(1, 9))  # a 128-token prefix every request shares
    requests = [TraceRequest(request_id=f"r{i}", arrival_s=0.1 * i, input_len=160 + i,
                             output_len=20 + i, block_hashes=shared + (100 + i, 200 + i))
                for i in range(12)]
    trace = write_trace(tmp_path / "t.parquet", requests,
                        TraceMetadata(hash_block_size=16, source_format="synth:test"))
    runs = {}
    for model in ("meta-llama/Meta-Llama-3.1-8B", "llama-3.1-8b"):
        res = CliRunner().invoke(cli, ["replay", str(trace), "--hardware", "h200", "--model",
                                       model, "--json", "--no-progress"])
        assert res.exit_code == 0, res.output
        runs[model] = json.loads(res.output)
    hub, preset = runs["meta-llama/Meta-Llama-3.1-8B"], runs["llama-3.1-8b"]
    assert hub["step_time_source"] == "analytic"  # the extra really is out of reach
    assert hub["num_finished"] == 12
    for key in ("p90_interactivity", "output_throughput_per_gpu", "ttft_p90_s"):
        assert hub[key] == preset[key]
    assert "meta-llama/Meta-Llama-3.1-8B" in hub["target"]


def test_the_preset_folder_has_no_config_outside_the_table() -> None:
    assert {p.stem for p in PRESET_DIR.glob("*.json")} == set(PRESET_HUB_IDS)
