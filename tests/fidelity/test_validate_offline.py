"""``tuner.fidelity.validate`` without a server: the twin side, the default summariser,
a configuration without a server, and the finalist parsing of ``confirm_on_server``."""

from __future__ import annotations

import pytest

from tuner import replay
from tuner.errors import ConfigError
from tuner.fidelity.validate import COMPARED, compare_on_server, confirm_on_server
from tuner.metrics import summarize
from tuner.serve.server import ServerOptions
from tuner.sim.settings import SchedulerSettings
from tuner.perf.target import Target
from tuner.trace import TraceRequest

TARGET = Target(hardware="h200", model="llama-3.1-8b", tp=1, block_size=16, num_gpu_blocks=4000)
ATTACH = ServerOptions(endpoint="http://127.0.0.1:1")  # never contacted: no endpoint per name


def _requests() -> list[TraceRequest]:
    shared = tuple(range(1, 5))  # a 4-block prefix every request shares
    return [TraceRequest(request_id=f"r{i}", arrival_s=0.01 * i, input_len=16 * 6 + i,
                         output_len=8 + i,
                         block_hashes=shared + (100 + 2 * i, 101 + 2 * i, 500 + i))
            for i in range(12)]


def test_a_configuration_without_a_server_is_predicted_with_tuner_metrics() -> None:
    reqs = _requests()
    settings = SchedulerSettings(max_num_batched_tokens=256, max_num_seqs=8)
    rows = compare_on_server([("only", settings)], reqs, server=ATTACH, target=TARGET,
                             endpoints={})
    assert [r.name for r in rows] == ["only"]
    row = rows[0]
    assert row.status == "predicted-only" and row.measured == {}
    # the default summariser is tuner.metrics.summarize: the same figures as summarising
    # the twin's replay directly behind the API server, the client's view a server's
    # measurement has (wall-clock fields are not compared)
    from tuner.perf.api_server import replay_api_server

    expected = summarize(replay.run(reqs, settings, backend="sim", target=TARGET),
                         api_server=replay_api_server(TARGET, "sim"))
    assert expected.api_server is not None
    assert set(row.predicted) == set(COMPARED)
    for key in COMPARED:
        assert row.predicted[key] == pytest.approx(float(getattr(expected, key)), nan_ok=True)
    assert row.predicted["num_finished"] == len(reqs)
    assert row.predicted["prefix_cache_hit_rate"] > 0


def test_a_caller_may_still_pass_its_own_summariser() -> None:
    seen = []

    def count(result):  # type: ignore[no-untyped-def]
        seen.append(len(result.requests))
        return summarize(result)

    compare_on_server([("a", SchedulerSettings()), ("b", SchedulerSettings(max_num_seqs=4))],
                      _requests(), server=ATTACH, target=TARGET, endpoints={}, summarize=count)
    assert seen == [12, 12]


def test_confirm_refuses_an_attached_server_and_an_empty_front() -> None:
    launch = ServerOptions(vllm_python="/bin/sh", model="tests/data/tiny-llama")
    with pytest.raises(ConfigError, match="--launch"):
        confirm_on_server([SchedulerSettings()], _requests(), ATTACH, target=TARGET)
    with pytest.raises(ConfigError, match="no finalists"):
        confirm_on_server([], _requests(), launch, target=TARGET)
