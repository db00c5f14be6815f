"""The Backend interface's registry: lazy paths, clear errors for unknown/unavailable names."""

from __future__ import annotations

import pytest

from tuner.errors import ConfigError
from tuner.replay import Backend, available_backends, create_backend, register_backend
from tuner.replay import _backend


class _Recorder(Backend):
    name = "recorder"

    def __init__(self, *, flavour: str = "plain") -> None:
        self.flavour = flavour

    def prepare(self, requests, settings, target, load, options):  # pragma: no cover - unused
        pass

    def run(self, progress=None):  # pragma: no cover - unused
        raise AssertionError


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(_backend, "_REGISTRY", dict(_backend._REGISTRY))
    return _backend._REGISTRY


def test_sim_is_registered_and_available():
    assert "sim" in available_backends()
    assert create_backend("sim").name == "sim"


def test_unknown_backend_names_available_ones(registry):
    with pytest.raises(ConfigError) as info:
        create_backend("nope")
    msg = str(info.value)
    assert msg.startswith("unknown backend 'nope'; available: ")
    assert "sim" in msg


def test_unimportable_backend_is_unavailable_with_reason(registry):
    register_backend("ghost", "tuner.replay.no_such_module:Ghost")
    assert "ghost" not in available_backends()
    with pytest.raises(ConfigError, match=r"backend 'ghost' is not available here "
                                          r"\(ModuleNotFoundError: .*available: .*sim"):
        create_backend("ghost")


def test_lazy_path_and_callable_registration(registry):
    register_backend("rec", _Recorder)
    assert create_backend("rec", flavour="x").flavour == "x"
    register_backend("rec2", f"{__name__}:_Recorder")
    assert "rec2" in available_backends()
    assert isinstance(create_backend("rec2"), _Recorder)
    with pytest.raises(ConfigError, match="backend 'rec' rejected its options"):
        create_backend("rec", colour="red")
    with pytest.raises(ValueError, match="must look like"):
        register_backend("bad", "no_colon_here")


def test_factory_must_return_a_backend(registry):
    register_backend("liar", lambda: object())
    with pytest.raises(TypeError, match="not a tuner.replay.Backend"):
        create_backend("liar")
