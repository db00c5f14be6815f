"""The serve commands of a disaggregated deployment: one ``vllm serve`` per pool instance
with its ``--kv-transfer-config``, and the proxy in front (docs/disaggregation.md).

The connector follows the GPU's vendor (vLLM 0.33.0 registers both in
``distributed/kv_transfer/kv_connector/factory.py``):

* NVIDIA: ``NixlConnector`` with ``kv_role: kv_both`` (one flag set for either role; the
  proxy's ``kv_transfer_params`` decide), as vLLM's NIXL examples start it;
  ``NixlPushConnector`` for ``--pd-transfer-mode push`` (the twin's
  ``tuner.sim.disagg.nixl_push``);
* AMD (ROCm, MI300X/MI325X/MI355X): ``MoRIIOConnector`` in read mode (the decoder pulls,
  the twin's pull variant), ``kv_producer`` on prefill and ``kv_consumer`` on decode,
  (``read_mode: false``, its WRITE mode, for push: the twin replays NIXL's push timing
  there, MoRIIO's own write path is not parity-checked),
  with the ports ``moriio_common.py`` reads from ``kv_connector_extra_config``
  (``notify_port``, ``http_port``, ``proxy_ip``, ``proxy_ping_port``; ``backend``
  ``xgmi`` within a node, ``rdma`` across).

The proxy follows the replay's ``--pd-router`` (:func:`router_config`):

* ``vllm-proxy``: vLLM's example P/D proxy
  (``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``, round robin over the
  ``--prefiller-hosts/ports`` and ``--decoder-hosts/ports``);
* ``llm-d``: an llm-d inference scheduler ``EndpointPickerConfig`` in the form of its
  sample ``deploy/config/pd-epp-config.yaml`` (``prefix-cache-scorer`` weight 2,
  ``queue-scorer`` weight 1, ``max-score-picker`` in a ``prefill`` and a ``decode``
  profile; the ``prefix-based-pd-decider`` with ``nonCachedTokens: 16``, as the twin
  replays it); the pods are told
  apart by the ``llm-d.ai/role`` label the prefill/decode filters read;
* ``dynamo``: Dynamo's frontend with its KV router (``python -m dynamo.frontend
  --router-mode kv``, ``--kv-overlap-score-weight 1``, ``--router-temperature 0``, the
  KV block size); Dynamo runs the engines as its own ``dynamo.vllm`` workers, so the
  ``vllm serve`` lines give their engine flags.

Hosts are placeholders (``PREFILL_HOST_i``, ``DECODE_HOST_j``) the operator fills in.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

__all__ = ["PDServeCommand", "connector_for", "pd_serve_commands", "proxy_command",
           "router_config"]

PREFILL_PORT, DECODE_PORT, PROXY_PORT = 8100, 8200, 8000
MORIIO_NOTIFY_PORT, MORIIO_PROXY_PING_PORT = 61005, 36367


@dataclass(frozen=True, slots=True)
class PDServeCommand:
    """One pool instance's server."""

    role: str  # "prefill" | "decode"
    instance: int  # index within its pool
    host: str  # a placeholder the operator replaces
    port: int
    args: tuple[str, ...]  # engine flags (vLLM's EngineArgs parser reads them)
    kv_transfer_config: dict  # what --kv-transfer-config carries (parsed back by the check)

    def command(self, model: str) -> str:
        """``vllm serve MODEL --port N`` (the API server's flag) and the engine flags."""
        return shlex.join(["vllm", "serve", model, "--port", str(self.port), *self.args])


def connector_for(vendor: str) -> str:
    """vLLM 0.33.0's P/D connector for a GPU vendor (``tuner.vllm_compat``)."""
    from tuner.vllm_compat import pd_connector_name

    return pd_connector_name(vendor)


def _transfer_config(vendor: str, role: str, port: int, same_node: bool,
                     index: int = 0, transfer_mode: str = "pull") -> dict:
    name = connector_for(vendor)
    push = transfer_mode == "push"
    if name != "MoRIIOConnector":
        if push:  # vLLM selects the push scheduler/worker by name (kv_connector/factory.py)
            name = "NixlPushConnector"
        return {"kv_connector": name, "kv_role": "kv_both"}
    return {"kv_connector": name,
            "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
            "kv_connector_extra_config": {
                # MoRIIO's WRITE mode is its push (moriio_common.py:226-233)
                "read_mode": "false" if push else "true",
                "backend": "xgmi" if same_node else "rdma",
                "notify_port": str(MORIIO_NOTIFY_PORT + 100 * index), "http_port": str(port),
                "proxy_ip": "PROXY_HOST", "proxy_ping_port": str(MORIIO_PROXY_PING_PORT)}}


def pd_serve_commands(*, num_prefill: int, num_decode: int, prefill_tp: int,
                      decode_tp: int, prefill_vendor: str, decode_vendor: str,
                      same_node: bool, extra_args: tuple[str, ...] = (),
                      prefill_extra_args: tuple[str, ...] | None = None,
                      transfer_mode: str = "pull") -> list[PDServeCommand]:
    """Prefill instances first, then decode instances; ``extra_args`` (the scheduler
    flags of the profile) go on every one, ``prefill_extra_args`` (None: ``extra_args``)
    on the prefill instances instead where their pool has its own limits;
    ``transfer_mode`` "push" names the push connector (module doc)."""
    out: list[PDServeCommand] = []
    for role, count, tp, vendor, base in (
            ("prefill", num_prefill, prefill_tp, prefill_vendor, PREFILL_PORT),
            ("decode", num_decode, decode_tp, decode_vendor, DECODE_PORT)):
        for i in range(count):
            port = base + i
            # one notify port range per instance (each TP rank adds its offset to it)
            config = _transfer_config(vendor, role, port, same_node, index=len(out),
                                      transfer_mode=transfer_mode)
            flags = (prefill_extra_args if role == "prefill" and prefill_extra_args is not None
                     else extra_args)
            args = ("--tensor-parallel-size", str(tp), *flags,
                    "--kv-transfer-config", json.dumps(config, separators=(",", ":")))
            out.append(PDServeCommand(role, i, f"{role.upper()}_HOST_{i}", port, args, config))
    return out


def proxy_command(commands: list[PDServeCommand]) -> str:
    """vLLM's example P/D proxy over ``commands`` (round robin in each pool)."""
    pre = [c for c in commands if c.role == "prefill"]
    dec = [c for c in commands if c.role == "decode"]
    return shlex.join([
        "python", "toy_proxy_server.py", "--port", str(PROXY_PORT),
        "--prefiller-hosts", *[c.host for c in pre],
        "--prefiller-ports", *[str(c.port) for c in pre],
        "--decoder-hosts", *[c.host for c in dec],
        "--decoder-ports", *[str(c.port) for c in dec]])


def _llmd_epp_config() -> str:
    """llm-d's EndpointPickerConfig for the twin's llm-d router (module doc)."""
    profile = ("  plugins:\n  - pluginRef: {role}-filter\n  - pluginRef: max-score-picker\n"
               "  - pluginRef: prefix-cache-scorer\n    weight: 2\n"
               "  - pluginRef: queue-scorer\n    weight: 1\n")
    return ("apiVersion: inference.networking.x-k8s.io/v1alpha1\n"
            "kind: EndpointPickerConfig\nplugins:\n"
            "- type: disagg-headers-handler\n- type: prefix-cache-scorer\n"
            "- type: queue-scorer\n- type: prefill-filter\n- type: decode-filter\n"
            "- type: max-score-picker\n- type: prefix-based-pd-decider\n"
            "  parameters:\n    nonCachedTokens: 16\n"
            "- type: disagg-profile-handler\n  parameters:\n    deciders:\n"
            "      prefill: prefix-based-pd-decider\nschedulingProfiles:\n"
            + "".join(f"- name: {role}\n" + profile.format(role=role)
                      for role in ("prefill", "decode")))


def router_config(router: str, commands: list[PDServeCommand], *,
                  block_size: int) -> tuple[str, str]:
    """``(title, text)``: the proxy/router configuration for ``router`` (module doc)."""
    if router == "llm-d":
        return ("llm-d inference scheduler (EPP) config: prefill pods labelled "
                "llm-d.ai/role=prefill, decode pods llm-d.ai/role=decode", _llmd_epp_config())
    if router == "dynamo":
        return ("Dynamo frontend with its KV router (engines as dynamo.vllm workers, the "
                "engine flags above)", shlex.join([
                    "python", "-m", "dynamo.frontend", "--router-mode", "kv",
                    "--kv-overlap-score-weight", "1.0", "--router-temperature", "0",
                    "--kv-cache-block-size", str(block_size), "--http-port",
                    str(PROXY_PORT)]))
    if router != "vllm-proxy":
        raise ValueError(f"unknown P/D router {router!r}")
    return "the proxy", proxy_command(commands)
