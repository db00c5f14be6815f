"""The P/D serve commands (tuner.profile.pd_export): the connector per vendor, flags
vLLM 0.33.0's parser accepts (checked in the vLLM environment), the example proxy."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex

import pytest

from tuner.profile.pd_export import (connector_for, pd_serve_commands, proxy_command,
                                     router_config)
from tuner.profile.vllm_check import check_pd_with_vllm

VLLM033 = os.environ.get("TUNER_VLLM033_PYTHON")


def _commands(vendor: str, **kw):
    return pd_serve_commands(num_prefill=1, num_decode=2, prefill_tp=4, decode_tp=2,
                             prefill_vendor=vendor, decode_vendor=vendor, same_node=True,
                             extra_args=("--max-num-seqs", "128"), **kw)


def test_nvidia_pools_get_nixl_and_amd_pools_get_moriio_in_read_mode():
    assert connector_for("nvidia") == "NixlConnector"
    assert connector_for("amd") == "MoRIIOConnector"
    nv = _commands("nvidia")
    assert [c.role for c in nv] == ["prefill", "decode", "decode"]
    assert {c.kv_transfer_config["kv_connector"] for c in nv} == {"NixlConnector"}
    amd = _commands("amd")
    roles = [c.kv_transfer_config["kv_role"] for c in amd]
    assert roles == ["kv_producer", "kv_consumer", "kv_consumer"]
    extra = [c.kv_transfer_config["kv_connector_extra_config"] for c in amd]
    assert {e["read_mode"] for e in extra} == {"true"}  # the decoder pulls
    assert len({e["notify_port"] for e in extra}) == 3  # no two instances share ports
    # the command carries exactly that JSON, and the TP per pool
    args = shlex.split(amd[1].command("m"))
    assert json.loads(args[args.index("--kv-transfer-config") + 1]) == amd[1].kv_transfer_config
    assert args[args.index("--tensor-parallel-size") + 1] == "2"


def test_the_proxy_lists_every_instance_in_its_pool():
    cmd = shlex.split(proxy_command(_commands("nvidia")))
    assert cmd[cmd.index("--prefiller-ports") + 1] == "8100"
    assert cmd[cmd.index("--decoder-ports") + 1:] == ["8200", "8201"]


def test_each_router_exports_its_own_configuration():
    commands = _commands("nvidia")
    title, text = router_config("vllm-proxy", commands, block_size=16)
    assert text == proxy_command(commands)
    import yaml

    title, text = router_config("llm-d", commands, block_size=16)
    epp = yaml.safe_load(text)
    assert epp["kind"] == "EndpointPickerConfig" and "llm-d.ai/role" in title
    profiles = {p["name"]: p["plugins"] for p in epp["schedulingProfiles"]}
    assert set(profiles) == {"prefill", "decode"}
    for role, plugins in profiles.items():
        weights = {p["pluginRef"]: p.get("weight") for p in plugins}
        assert weights == {f"{role}-filter": None, "max-score-picker": None,
                           "prefix-cache-scorer": 2, "queue-scorer": 1}
    handler = next(p for p in epp["plugins"] if p["type"] == "disagg-profile-handler")
    assert handler["parameters"]["deciders"]["prefill"] == "prefix-based-pd-decider"
    decider = next(p for p in epp["plugins"] if p["type"] == "prefix-based-pd-decider")
    assert decider["parameters"]["nonCachedTokens"] == 16  # the twin's llm-d router
    title, text = router_config("dynamo", commands, block_size=64)
    cmd = shlex.split(text)
    assert cmd[:3] == ["python", "-m", "dynamo.frontend"]
    assert cmd[cmd.index("--router-mode") + 1] == "kv"
    assert cmd[cmd.index("--kv-cache-block-size") + 1] == "64"


@pytest.mark.skipif(not VLLM033, reason="needs TUNER_VLLM033_PYTHON (a vLLM 0.33.0 env)")
@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_vllm_033_parses_every_server(vendor):
    check = check_pd_with_vllm(_commands(vendor), python=VLLM033)
    assert check.status == "ok", check.errors
    assert check.checked == ("prefill 0", "decode 0", "decode 1")


def test_push_names_the_push_connector_and_moriio_write_mode():
    nv = _commands("nvidia", transfer_mode="push")
    assert {c.kv_transfer_config["kv_connector"] for c in nv} == {"NixlPushConnector"}
    amd = _commands("amd", transfer_mode="push")
    extra = [c.kv_transfer_config["kv_connector_extra_config"] for c in amd]
    assert {e["read_mode"] for e in extra} == {"false"}  # MoRIIO's WRITE mode


@pytest.mark.skipif(not VLLM033, reason="needs TUNER_VLLM033_PYTHON (a vLLM 0.33.0 env)")
@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_vllm_033_parses_every_push_server(vendor):
    check = check_pd_with_vllm(_commands(vendor, transfer_mode="push"), python=VLLM033)
    assert check.status == "ok", check.errors
    assert check.checked == ("prefill 0", "decode 0", "decode 1")


@pytest.mark.skipif(not VLLM033, reason="needs TUNER_VLLM033_PYTHON (a vLLM 0.33.0 env)")
def test_vllm_033_check_refuses_a_connector_it_does_not_register():
    bad = [dataclasses.replace(c, kv_transfer_config={"kv_connector": "NoSuchConnector",
                                                      "kv_role": "kv_both"},
                               args=(*c.args[:-1], '{"kv_connector":"NoSuchConnector",'
                                                   '"kv_role":"kv_both"}'))
           for c in _commands("nvidia")[:1]]
    check = check_pd_with_vllm(bad, python=VLLM033)
    assert check.status == "failed"
    assert "registers no connector 'NoSuchConnector'" in check.errors[0]
