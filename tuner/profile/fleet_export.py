"""Multi-engine exports: the per-engine ``vllm serve`` flags, one command per replica,
and the router's own configuration.

Why a module of its own: a profile of a data-parallel deployment or of a fleet is only
ready to use when every engine gets the parallel layout the twin replayed (TP, DP,
expert parallelism) and the router in front of the replicas is configured as the
modelled router was. Each router policy of the replay (``tuner.sim.fleet.router``) is
modelled on one real router, and exports that router's configuration:

=================  =====================================================================
policy             exported as
=================  =====================================================================
``round-robin``    vLLM production-stack router: ``vllm-router --routing-logic
                   roundrobin`` (``src/vllm_router/parsers/parser.py``, ``RoundRobinRouter``)
``session``        production-stack router: ``--routing-logic session --session-key
                   HEADER`` (``SessionRouter``; the consistent-hash ring over replicas)
``least-loaded``   llm-d inference scheduler (EPP) ``EndpointPickerConfig`` YAML with
                   ``active-request-scorer`` (``load_metric: requests``) or
                   ``pending-tokens-scorer`` (``tokens``) and ``max-score-picker``
``prefix-aware``   NVIDIA Dynamo's KV router: ``python -m dynamo.frontend --router-mode kv
                   --kv-overlap-score-weight W --router-temperature 0
                   --kv-cache-block-size B`` (its engines run as ``python -m dynamo.vllm``
                   with the same engine flags, so that they publish KV events)
=================  =====================================================================

The engines: a fleet whose GPUs fit on one node (at most :data:`NODE_GPUS`) gets one
command per replica with its own ``CUDA_VISIBLE_DEVICES`` (vLLM's device variable on
CUDA and ROCm, ``platforms/cuda.py`` 233 and ``platforms/rocm.py`` 658) and port
``8000 + i``, started in the background, and the router's backends are those ports on
``localhost``; a larger fleet gets the one per-engine command to run on each replica's
host and the router's backends as ``http://replica-<i>:8000`` (one line to edit).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.profile.model import Profile

#: GPUs of one node: a fleet up to this size is laid out on one host.
NODE_GPUS = 8
#: First port of the replicas on one host (vLLM's default port).
BASE_PORT = 8000
#: The request header the session router reads (production-stack ``--session-key``).
SESSION_HEADER = "x-session-id"


@dataclass(frozen=True, slots=True)
class RouterExport:
    """The router's configuration for one profile."""

    implementation: str  # the real router it is
    source: str  # where its flags are defined (for the comment and the docs)
    kind: str  # "command" (argument list) or "yaml" (a config file)
    args: tuple[str, ...] = ()  # the command, for kind == "command"
    filename: str = ""  # the config file, for kind == "yaml"
    text: str = ""  # its content
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"implementation": self.implementation,
                                  "source": self.source, "notes": list(self.notes)}
        if self.kind == "command":
            out["args"] = list(self.args)
        else:
            out["file"] = self.filename
            out["config"] = self.text
        return out


def engine_args(profile: Profile) -> list[str]:
    """The parallel layout of one engine process: ``--tensor-parallel-size``,
    ``--data-parallel-size`` (DP > 1) and ``--enable-expert-parallel``."""
    t = profile.target
    args = ["--tensor-parallel-size", str(t.tp)]
    if t.dp > 1:
        args += ["--data-parallel-size", str(t.dp)]
    if t.enable_expert_parallel:
        args.append("--enable-expert-parallel")
    return args


def one_node(profile: Profile) -> bool:
    """Whether the whole deployment fits on one node (commands with device lists)."""
    return profile.target.num_gpus <= NODE_GPUS


def backend_urls(profile: Profile) -> list[str]:
    """The replicas' base URLs as the router is told them."""
    n = profile.target.replicas
    if one_node(profile):
        return [f"http://localhost:{BASE_PORT + i}" for i in range(n)]
    return [f"http://replica-{i}:{BASE_PORT}" for i in range(n)]


def replica_prefixes(profile: Profile) -> list[str]:
    """Per replica, what goes before ``vllm serve``: its devices on a one-node fleet."""
    t = profile.target
    per = t.tp * t.dp
    if not one_node(profile):
        return [""] * t.replicas
    return ["CUDA_VISIBLE_DEVICES=" + ",".join(str(g) for g in range(i * per, (i + 1) * per))
            for i in range(t.replicas)]


def router_export(profile: Profile, served_model: str) -> RouterExport | None:
    """The router configuration of a fleet profile (None: one replica, no router)."""
    router = profile.router
    if router is None:
        return None
    policy = router["policy"]
    urls = backend_urls(profile)
    if policy in ("round-robin", "session"):
        logic = "roundrobin" if policy == "round-robin" else "session"
        args = ["vllm-router", "--port", "8080", "--service-discovery", "static",
                "--static-backends", ",".join(urls),
                "--static-models", ",".join([served_model] * len(urls)),
                "--routing-logic", logic]
        notes: tuple[str, ...] = ()
        if policy == "session":
            args += ["--session-key", SESSION_HEADER]
            notes = (f"clients send the session id in the {SESSION_HEADER} header (the "
                     "trace's session_id); change --session-key to the header yours use",)
        return RouterExport("vLLM production-stack router (vllm-router)",
                            "production-stack src/vllm_router/parsers/parser.py", "command",
                            tuple(args), notes=notes)
    if policy == "least-loaded":
        scorer = ("active-request-scorer" if router.get("load_metric", "requests") == "requests"
                  else "pending-tokens-scorer")
        text = ("apiVersion: inference.networking.x-k8s.io/v1alpha1\n"
                "kind: EndpointPickerConfig\n"
                "plugins:\n"
                "- type: single-profile-handler\n"
                f"- type: {scorer}\n"
                "- type: max-score-picker\n"
                "schedulingProfiles:\n"
                "- name: default\n"
                "  plugins:\n"
                f"  - pluginRef: {scorer}\n"
                "    weight: 1\n"
                "  - pluginRef: max-score-picker\n")
        return RouterExport(
            "llm-d inference scheduler (endpoint picker)",
            "llm-d-inference-scheduler pkg/plugins/scorer (active_request.go, pending_tokens.go)",
            "yaml", filename="epp-config.yaml", text=text,
            notes=(f"the EPP scores each replica by the {'requests' if 'active' in scorer else 'prompt tokens'} "
                   "it has in flight and picks the best; pass this file with --config-file "
                   "(plugin names as of llm-d-inference-scheduler 0.2)",))
    block = int(router.get("block_size") or 0) or profile.target.block_size
    args = ["python", "-m", "dynamo.frontend", "--http-port", "8080", "--router-mode", "kv",
            "--kv-overlap-score-weight", _number(router.get("overlap_weight", 1.0)),
            "--router-temperature", "0"]
    if block:
        args += ["--kv-cache-block-size", str(block)]
    return RouterExport(
        "NVIDIA Dynamo KV router (dynamo.frontend)",
        "dynamo components/frontend (--router-mode kv), docs/design_docs/router_design.md",
        "command", tuple(args),
        notes=("Dynamo's KV router needs KV events: start each engine as `python -m "
               "dynamo.vllm --model MODEL` with the engine flags above instead of `vllm "
               "serve` (Dynamo registers its workers itself; no backend list)",))


def _number(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    return str(value)


__all__ = ["NODE_GPUS", "RouterExport", "backend_urls", "engine_args", "one_node",
           "replica_prefixes", "router_export"]
